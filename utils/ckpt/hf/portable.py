"""Make a saved HF folder read the same way in transformers 4.45+ and 5.x, ONNX, CTranslate2 and llama.cpp.

transformers 5 saves only `rope_parameters` (4.x then silently falls back to rotary_pct 0.25), names the
tokenizer class `TokenizersBackend` (4.x cannot resolve it) and leaves bos/unk unset (CTranslate2 refuses).
`make_portable(folder)` rewrites config.json, generation_config.json and tokenizer_config.json in place,
atomically, following Pythia's convention: the end-of-text token is bos, eos and unk; the legacy GPT-NeoX keys
`rotary_pct` / `rotary_emb_base` sit next to `rope_parameters` with the same values; `use_cache` is true
(the training-time setting is not an inference setting). It is idempotent: calling it twice changes nothing.
"""
from __future__ import annotations

from pathlib import Path

from utils.atomic import atomic_write_json
from utils.data.tokenizers import EOT, TOKENIZER_FILE
from utils.textfile import read_json

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # what 4.x and 5.x both resolve (5.x maps it to its backend)


def _read(path: Path) -> dict:
    return read_json(path) if path.is_file() else {}


def eot_id(tokenizer_dir: Path) -> int:
    """The id of the end-of-text token in `tokenizer_dir`'s tokenizer.json."""
    from utils.data.tokenizers import read_tokenizer

    return read_tokenizer(Path(tokenizer_dir) / TOKENIZER_FILE).token_to_id(EOT)


def portable_config(config: dict, eot: int | None) -> dict:
    """config.json's dict with the legacy rotary keys, bos/eos ids and use_cache set."""
    rope = config.get("rope_parameters") or {}
    out = dict(config, use_cache=True)
    out["rotary_pct"] = float(rope.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))
    out["rotary_emb_base"] = float(rope.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    if "dtype" in config:  # 4.x before 4.56 reads only the old name
        out["torch_dtype"] = config["dtype"]
    if eot is not None:
        out.update(bos_token_id=eot, eos_token_id=eot)
    return out


def make_portable(folder: Path, tokenizer_dir: Path | None = None) -> list[str]:
    """Rewrite `folder`'s HF json files to read the same in every consumer; returns the names written.

    `tokenizer_dir` (default `folder`) holds the tokenizer.json that gives the end-of-text id; without one
    (a weights-only folder) only config.json's rotary keys and use_cache are fixed.
    """
    folder = Path(folder)
    tokenizer_dir = Path(tokenizer_dir or folder)
    eot = eot_id(tokenizer_dir) if (tokenizer_dir / TOKENIZER_FILE).is_file() else None
    written = []
    config = _read(folder / "config.json")
    if config:
        atomic_write_json(folder / "config.json", portable_config(config, eot))
        written.append("config.json")
    if eot is None:
        return written
    gen = _read(folder / "generation_config.json")
    gen.update(bos_token_id=eot, eos_token_id=eot, use_cache=True)
    gen.setdefault("_from_model_config", True)
    atomic_write_json(folder / "generation_config.json", gen)
    written.append("generation_config.json")
    if (folder / TOKENIZER_FILE).is_file():
        tok = _read(folder / "tokenizer_config.json")
        tok.update(tokenizer_class=TOKENIZER_CLASS, bos_token=EOT, eos_token=EOT, unk_token=EOT,
                   pad_token=tok.get("pad_token") or EOT)
        atomic_write_json(folder / "tokenizer_config.json", tok)
        written.append("tokenizer_config.json")
    return written
