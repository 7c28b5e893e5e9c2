"""What rp2040.run and rp2040.emulate both check and say about a prompt, so the host and the board agree.

- A prompt too long for the Pico's heap is refused on the host, before any board boots: the board holds
  the text (typed into the REPL: the paste buffer and the compiled string) and its token ids while it
  encodes, budgeted at PROMPT_BYTES_PER_CHAR bytes per character of the heap the exporter predicted
  free after loading (config.json "ram"). Measured with rp2040.emulate (rp2040-speed int8, 171,976 bytes
  predicted free, limit 8,598): 8,000 characters generate; 14,000 and 30,000 never finish.
- A generation that ends before the tokens asked for because the context is full says so.
- The ids the host computes for a prompt, which the board's must equal (host_ids).
"""
from __future__ import annotations

from pathlib import Path

from utils.errors import PiconeoxError
from utils.textfile import SMALL_JSON_BYTES, read_json

PROMPT_BYTES_PER_CHAR = 20


def model_config(model_dir: Path) -> dict:
    """config.json of an exported model; one line naming the file when it is not the exporter's JSON."""
    path = Path(model_dir) / "config.json"
    config = read_json(path, "exported model config", SMALL_JSON_BYTES)
    for section in ("ram", "generation", "shape"):
        if not isinstance(config.get(section), dict):
            raise PiconeoxError(f"exported model config {path} has no {section!r} section: export the model again "
                                f"with python -m rp2040.export CHECKPOINT --out {model_dir}")
    for section, key, low in (("ram", "free_after_load_bytes", 0), ("shape", "context", 1),
                              ("generation", "max_new_tokens", 1)):
        value = config[section].get(key)
        if not (type(value) is int and low <= value < 2**63):  # Infinity, null, "abc": what no exporter writes
            raise PiconeoxError(f"exported model config {path}: {section}.{key} {str(value)[:40]} is not a whole "
                                f"number >= {low}: export the model again")
    return config


def max_prompt_chars(config: dict) -> int:
    """The longest prompt (characters) the board's heap takes after loading this model."""
    return config["ram"]["free_after_load_bytes"] // PROMPT_BYTES_PER_CHAR  # a whole number >= 0 (model_config)


def check_prompt(config: dict, prompt: str) -> None:
    """Refuse, in one line, a prompt the Pico could not hold (the same limit for every CLI)."""
    limit = max_prompt_chars(config)
    if len(prompt) > limit:
        raise PiconeoxError(f"prompt too long for the Pico's RAM: {len(prompt):,} characters, at most {limit:,}")


def context_stop(asked: int, generated: int, prompt_tokens: int, context: int) -> str | None:
    """Why fewer than `asked` tokens came, when the reason is the full context; else None."""
    if generated < asked and prompt_tokens + generated >= context:
        return (f"stopped after {generated} of {asked} tokens: the model's context is {context} tokens "
                f"({prompt_tokens} of the prompt + {generated} generated)")
    return None


def host_ids(model_dir: Path, prompt_ids: list[int], tokens: int) -> list[int]:
    """The ids the host computes for the same prompt ids and default sampling (the board must equal
    them): the integer reference for int8 models (the spec), the runtime under CPython for f32."""
    config = model_config(model_dir)
    g = config["generation"]
    if config["dtype"] == "int8":
        from rp2040.reference import ReferenceModel, generate

        return generate(ReferenceModel(Path(model_dir) / "model.bin"), prompt_ids, tokens, g["temperature"],
                        g["top_k"], g["seed"], config["tokenizer"]["eos"])
    from rp2040.runtime.generate import Generator, load, sampler_for

    model, tok, config = load(str(model_dir))
    gen = Generator(model, sampler_for(model, config))
    gen.prompt(prompt_ids)
    out = []
    while len(out) < tokens and gen.room() > 0:
        t = gen.step()
        out.append(t)
        if t == tok.eos:
            break
    model.close()
    return out
