"""From a prompt to streamed text: loads a model directory and drives the forward pass and sampler.

Shared by main.py on the board, `python -m rp2040.run` on the host, the tests and the benchmark.
A model directory holds model.bin, vocab.bin and config.json (written by rp2040/export.py);
config.json's "runtime" and "generation" sections give the defaults used here.
"""
import gc
import json
import os
import time

from .gpt import GPT
from .sampling import Sampler
from .tokenizer import StreamDecoder, Tokenizer


def clock():
    """Seconds, from the best clock the interpreter has."""
    if hasattr(time, "ticks_ms"):
        return time.ticks_ms() / 1000.0
    return time.perf_counter()


def load(model_dir, stream=None):
    """(GPT, Tokenizer, config) for a model directory; `stream` defaults to the exporter's choice."""
    with open(model_dir + "/config.json") as f:
        config = json.load(f)
    blocks = config["runtime"].get("blocks")  # on the board: model.blk's littlefs blocks (lfsblocks.py)
    if blocks and not has_file(model_dir + "/model.bin"):
        from .lfsblocks import open_blocks  # imported before the tokenizer's arrays: less fragmentation
    else:
        blocks = None
    tok = Tokenizer(model_dir + "/vocab.bin")
    gc.collect()
    if blocks:
        return open_blocks(model_dir + "/model.blk", blocks), tok, config
    if stream is None:
        stream = config["runtime"]["stream"]
    xip = config["runtime"].get("xip")  # on the board: model.bin is in raw flash, not a file (xip.py)
    if xip and has_file(model_dir + "/model.bin"):  # the host, which has the file
        xip = None
    model = GPT(model_dir + "/model.bin", stream=stream, xip=xip)
    return model, tok, config


def has_file(path):
    try:
        os.stat(path)
    except OSError:
        return False
    return True


class Generator:
    """Feeds a prompt, then yields one sampled token per `step()`, keeping the KV-cache position."""

    def __init__(self, model, sampler):
        self.model = model
        self.sampler = sampler
        self.pos = 0
        self.logits = None

    def prompt(self, ids):
        """Run the prompt tokens through the model (they fill the KV cache)."""
        for t in ids:
            self.logits = self.model.forward(t, self.pos)
            self.pos += 1

    def room(self):
        """How many more tokens fit in the model's context."""
        return self.model.h.context - self.pos

    def step(self):
        """Sample the next token and run it through the model; returns its id."""
        t = self.sampler(self.logits)
        if self.room() > 0:
            self.logits = self.model.forward(t, self.pos)
            self.pos += 1
        return t

    def state_dict(self):
        return {"pos": self.pos, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state):
        """Restore position and RNG; the KV cache must hold the same tokens (re-run the prompt first)."""
        self.pos = state["pos"]
        self.sampler.load_state_dict(state["sampler"])


def prompt_ids(tok, text, context):
    """Encode the prompt; an empty prompt starts from end-of-text; keep at most half the context."""
    ids = tok.encode(text)
    if not ids:
        if tok.eos < 0:
            raise ValueError("empty prompt and the tokenizer has no end-of-text token to start from")
        ids = [tok.eos]
    return ids[-(context // 2):]


def sampler_for(model, config, temperature=None, top_k=None, seed=None):
    """The Sampler for a loaded model: the given settings, else config.json's "generation" defaults."""
    g = config["generation"]
    return Sampler(model.h.vocab, g["temperature"] if temperature is None else temperature,
                   g["top_k"] if top_k is None else top_k, g["seed"] if seed is None else seed)


def run_session(model_dir, prompt, max_new_tokens=None, temperature=None, top_k=None, seed=None,
                stream=None, write=None):
    """Generate from `prompt`, writing text as it is produced; returns (new token ids, tokens/s)."""
    model, tok, config = load(model_dir, stream)
    if max_new_tokens is None:
        max_new_tokens = config["generation"]["max_new_tokens"]
    write = write or (lambda s: print(s, end=""))
    gen = Generator(model, sampler_for(model, config, temperature, top_k, seed))
    decoder = StreamDecoder(tok)
    ids = prompt_ids(tok, prompt, model.h.context)
    write(prompt)
    gen.prompt(ids)
    out = []
    start = clock()
    while len(out) < max_new_tokens and gen.room() > 0:
        t = gen.step()
        if t == tok.eos:
            break
        out.append(t)
        write(decoder.feed(t))
    elapsed = clock() - start
    rate = len(out) / elapsed if elapsed > 0 else 0.0
    write("\n[%d tokens, %.2f tokens/s]\n" % (len(out), rate))
    model.close()
    return out, rate
