"""What the flash tests share about an (emulated) Pico: the prompt and token count their tiny models generate,
rp2040.flash and mpremote against its serial port, and the text main.py prints from the reference's token ids."""
import subprocess
import sys
from pathlib import Path

from rp2040 import emulate
from rp2040.runtime.tokenizer import StreamDecoder, Tokenizer
from tests.support.bounds import bound
from tests.support.paths import REPO

PROMPT = "Once upon a time"
TOKENS = 4


def flash(model_dir: Path, port: str, *extra: str) -> subprocess.CompletedProcess:
    """The README's command: rp2040.flash of `model_dir` onto the board at `port`, the runtime as .mpy."""
    return subprocess.run([sys.executable, "-m", "rp2040.flash", str(model_dir), "--mpy", "--prompt", PROMPT,
                           "--port", port, *extra], capture_output=True, text=True, cwd=REPO, timeout=bound(150))


def mpremote(port: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "mpremote", "connect", port, *args], capture_output=True, text=True,
                       timeout=bound(60))
    assert r.returncode == 0, r.stderr
    return r.stdout


def expected_text(model_dir: Path) -> str:
    """What main.py prints for PROMPT: the prompt, then the text of the reference's token ids."""
    tok = Tokenizer(str(model_dir / "vocab.bin"))
    ids = emulate.host_ids(model_dir, tok.encode(PROMPT), TOKENS)
    dec = StreamDecoder(tok)
    return PROMPT + "".join(dec.feed(t) for t in ids if t != tok.eos)
