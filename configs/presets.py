"""Named presets (model shape + training recipe) and how flags and YAML files override them."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from configs.model import MODEL_PRESETS, ModelConfig
from configs.run import RunSettings
from configs.training import TrainConfig
from utils.errors import PiconeoxError


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs to rebuild itself: the preset name, the model shape, the training recipe and the
    run settings (folders, resume, bucket)."""

    preset: str
    """The preset's name (`--config`, a key of MODEL_PRESETS), which a `--config-file` and `--set` then change."""
    model: ModelConfig
    """The model's shape (the `model:` section)."""
    train: TrainConfig
    """The training recipe (the `train:` section)."""
    run: RunSettings = RunSettings()
    """Folders, resume, bucket and trackers (the `run:` section)."""

    def validate(self) -> "RunConfig":
        self.model.validate()
        self.train.validate()
        self.run.validate(self.train.keep_last)
        if self.train.seq_len > self.model.max_position_embeddings:
            raise PiconeoxError(
                f"train.seq_len={self.train.seq_len} is longer than model.max_position_embeddings="
                f"{self.model.max_position_embeddings}; use seq_len <= {self.model.max_position_embeddings}"
            )
        return self

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": self.model.to_dict(), "train": self.train.to_dict(),
                "run": self.run.recorded()}


_T = TrainConfig
TRAIN_PRESETS: dict[str, TrainConfig] = {
    # Tiny Pico models: the demo corpus with a tokenizer whose vocab fits the preset's. The demo stories
    # support at most ~910 BPE tokens, so the larger presets train a 896-token BPE (the model keeps its vocab).
    "rp2040-speed": _T(tokenizer="char", seq_len=128, micro_batch_size=32, max_steps=1500, learning_rate=1e-2,
                       warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    "rp2040-optimized": _T(tokenizer="bpe", tokenizer_vocab=512, seq_len=128, micro_batch_size=32, max_steps=1500,
                           learning_rate=1e-2, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    "rp2040-quality": _T(tokenizer="bpe", tokenizer_vocab=896, seq_len=64, micro_batch_size=64, max_steps=1500,
                         learning_rate=5e-3, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    # The pico-* recipes from benchmarks/pico_search.py: 3,000 steps at lr 1e-2 beat 1,500 at 5e-3 (and, for
    # pico-best, 1,500 at 1e-2 and 3,000 at 5e-3) on TinyStories val.
    "pico-fast": _T(tokenizer="bpe", tokenizer_vocab=512, seq_len=128, micro_batch_size=32, max_steps=3000,
                    learning_rate=1e-2, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    "pico-best": _T(tokenizer="bpe", tokenizer_vocab=896, seq_len=64, micro_batch_size=64, max_steps=3000,
                    learning_rate=1e-2, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    # pico-best's recipe at half the steps: 2 shared cores train 4.5x the parameters in about the same time.
    "pico-large": _T(tokenizer="bpe", tokenizer_vocab=896, seq_len=64, micro_batch_size=64, max_steps=1500,
                     learning_rate=1e-2, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    # pico-large's recipe at half its lr (5x the parameters); the TinyStories sample is ~443K tokens, far short
    # of what a million parameters want, so longer runs only overfit it (docs/pico.md).
    "pico-million": _T(tokenizer="bpe", tokenizer_vocab=896, seq_len=64, micro_batch_size=64, max_steps=1500,
                       learning_rate=5e-3, warmup_steps=100, eval_every=250, save_every=500, weight_decay=0.0),
    "test": _T(tokenizer="byte", seq_len=128, micro_batch_size=8, max_steps=200, learning_rate=2e-3,
               warmup_steps=20, eval_every=50, eval_batches=10, save_every=100),
    "small": _T(tokenizer="bpe", tokenizer_vocab=896, seq_len=256, micro_batch_size=8, max_steps=5000,
                learning_rate=6e-4, warmup_steps=200, eval_every=250, save_every=500),
    # GPT-NeoX 1.2B on GPUs: bring a prepared dataset (--data); 0.5M tokens per optimizer step on any number
    # of GPUs (accumulation 8 on 8 GPUs, 4 on two machines of 8, 64 on one).
    "production": _T(data="", tokenizer="bpe", tokenizer_vocab=50257, seq_len=2048, micro_batch_size=4,
                     global_batch_tokens=524_288, max_steps=100_000, learning_rate=2e-4, warmup_steps=2000,
                     eval_every=1000, eval_batches=50, save_every=1000, keep_last=3, mixed_precision="bf16",
                     activation_checkpointing="auto"),
    # nanoGPT's train_shakespeare_char CPU recipe (batch 12, block 64, 2000 iters, lr 1e-3, beta2 0.99), on
    # nanoGPT's input.txt prepared with the char tokenizer (the error for a missing folder says how). Medium
    # matmul precision + eager attention: 1.34x faster steps here (benchmarks/bench_math.py), same losses.
    "shakespeare-char": _T(data="data/shakespeare-char", tokenizer="char", seq_len=64, micro_batch_size=12,
                           max_steps=2000, learning_rate=1e-3, warmup_steps=100, beta2=0.99, eval_every=250,
                           eval_batches=20, save_every=1000,
                           matmul_precision="medium", attention="eager"),
    # Time to quality on CPU (benchmarks/README.md): the CHAR_FAST model (full RoPE, 1x FFN: 1.5x cheaper
    # steps than nanoGPT's shape) trained with Muon on the layers' matrices (AdamW keeps embedding, head, norms and
    # biases at 2e-3). -fast: nanoGPT's final val loss in the fewest steps; -best: the same recipe, longer, sized to
    # end well inside nanoGPT's wall time. One full checkpoint at the end (best/ still follows every eval).
    "shakespeare-char-fast": _T(data="data/shakespeare-char", tokenizer="char", seq_len=64, micro_batch_size=12,
                                max_steps=500, learning_rate=2e-3, warmup_steps=50, beta2=0.99, optimizer="muon",
                                muon_lr=0.01, muon_momentum=0.95, eval_every=250, eval_batches=20, save_every=500,
                                matmul_precision="medium", attention="eager"),
    "shakespeare-char-best": _T(data="data/shakespeare-char", tokenizer="char", seq_len=64, micro_batch_size=12,
                                max_steps=1500, learning_rate=2e-3, warmup_steps=50, beta2=0.99, optimizer="muon",
                                muon_lr=0.01, muon_momentum=0.95, eval_every=500, eval_batches=20, save_every=1500,
                                matmul_precision="medium", attention="eager"),
    # The same recipe on a clock (benchmarks/README.md, levers for a budget): as many steps as fit in time_budget_s
    # (60 s unless --time-budget says otherwise), the cosine decay ending at the budget, no save but the final one,
    # an evaluation every 1,000 steps besides the final one. AdamW's lr (embedding, head, norms, biases) is 8x
    # -best's: on held-out train it was worth 0.046 at 500 steps, the largest lever measured.
    "shakespeare-char-budget": _T(data="data/shakespeare-char", tokenizer="char", seq_len=64, micro_batch_size=12,
                                  time_budget_s=60.0, learning_rate=1.6e-2, warmup_steps=50, beta2=0.99,
                                  optimizer="muon", muon_lr=0.01, muon_momentum=0.95, eval_every=1000, eval_batches=20,
                                  save_every=1_000_000, matmul_precision="medium", attention="eager"),
}

PRESET_NAMES = tuple(MODEL_PRESETS)


def preset_list(text: str) -> list[str]:
    """An argparse `type`: comma-separated preset names, each one of PRESET_NAMES."""
    import argparse

    names = text.split(",")
    if unknown := [n for n in names if n not in MODEL_PRESETS]:
        raise argparse.ArgumentTypeError(_unknown_preset(unknown[0]))
    return names


def _unknown_preset(name: str) -> str:
    return f"unknown preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}"


def _coerce(value, annotation: str, key: str):
    """Turn a flag or YAML value into the field's type, or raise one clear line."""
    if not isinstance(value, str):
        raw = value
    else:
        raw = value.strip()
    optional = "None" in annotation
    if optional and (raw is None or raw in ("", "null", "none", "None")):
        return None
    base = annotation.replace("| None", "").strip()
    if raw is None:  # `key:` with nothing after it in YAML: not the string "None"
        raise PiconeoxError(f"{key} is empty: give a {base} value, or leave the setting out for its default")
    try:
        if base == "bool":
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if base == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise PiconeoxError(f"{key}={value!r}: expected {base}") from None


def _apply(obj, updates: dict):
    """`obj` with `updates` (strings from flags, values from YAML) coerced to each field's type."""
    from utils.run.budget import parse_duration

    types = {f.name: f.type for f in fields(obj)}
    durations = getattr(obj, "DURATIONS", ())
    coerced = {k: parse_duration(v, f"{obj.SECTION}.{k}") if k in durations else
               _coerce(v, types[k], f"{obj.SECTION}.{k}") if k in types else v for k, v in updates.items()}
    return type(obj).from_dict({**obj.to_dict(), **coerced})


def resolve_config(preset: str, yaml_file: str | None = None, overrides: dict[str, object] | None = None) -> RunConfig:
    """Preset, then the YAML file (`model:` / `train:` / `run:` sections), then `section.key` overrides; validated."""
    if preset not in MODEL_PRESETS:
        raise PiconeoxError(_unknown_preset(preset))
    model, train, run = MODEL_PRESETS[preset], TRAIN_PRESETS[preset], RunSettings()
    if yaml_file:
        import yaml

        path = Path(yaml_file)
        if not path.is_file():
            raise PiconeoxError(f"config file {yaml_file} {'is not a file' if path.exists() else 'does not exist'}")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise PiconeoxError(f"config file {yaml_file} is not a text (UTF-8 YAML) file: undecodable byte at "
                                f"offset {e.start}") from None
        except OSError as e:
            raise PiconeoxError(f"config file {yaml_file} cannot be read: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise PiconeoxError(f"config file {yaml_file} is not valid YAML: {str(e).splitlines()[0]}") from None
        sections = doc.values() if isinstance(doc, dict) else ()
        if not isinstance(doc, dict) or set(doc) - {"model", "train", "run"} or not all(
                isinstance(v, (dict, type(None))) for v in sections):
            raise PiconeoxError(f"config file {yaml_file}: expected top-level sections 'model', 'train' and/or "
                                "'run', each a mapping of setting: value")
        model = _apply(model, doc.get("model") or {})
        train = _apply(train, doc.get("train") or {})
        run = _apply(run, doc.get("run") or {})
    by_section: dict[str, dict] = {"model": {}, "train": {}, "run": {}}
    for key, value in (overrides or {}).items():
        section, _, name = key.partition(".")
        if section not in by_section or not name:
            raise PiconeoxError(f"override {key!r}: expected model.<name>=<value> or train.<name>=<value> "
                                "(or run.<name>=<value>)")
        by_section[section][name] = value
    model = _apply(model, by_section["model"])
    train = _apply(train, by_section["train"])
    run = _apply(run, by_section["run"])
    return RunConfig(preset, model, train, run).validate()
