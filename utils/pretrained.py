"""--init-from: start a run from a local GPT-NeoX checkpoint in Hugging Face format.

A Pythia model a user downloaded (config.json, model.safetensors or pytorch_model.bin, tokenizer.json)
or one of our own best/, final/ or (sharded) step folders. The run takes the weights, the tokenizer and the model
shape from it; the optimizer starts fresh. The training data must be tokenized with the same tokenizer
(`prepare_data.py --tokenizer-from PATH` copies it byte for byte, so the dataset's manifest records the
same sha256).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from utils.textfile import SMALL_JSON_BYTES, read_json
from utils.ckpt.read import (DCP_INDEX, check_weights, foreign_entry, gpt_neox_config, load_model, load_tokenizer,
                             tokenizer_problem, weight_shapes)
from utils.data.tokenizers import TOKENIZER_FILE, file_sha256
from utils.errors import PiconeoxError, first_line

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", DCP_INDEX)  # the last: our sharded step folders (DCP)
# GPT-NeoX settings a piconeox ModelConfig does not carry: a checkpoint must have these values, or a resumed
# run (which rebuilds the model from the ModelConfig) would differ from the model it started from.
FIXED_SETTINGS = {"hidden_act": "gelu", "attention_bias": True}


@dataclass(frozen=True)
class Pretrained:
    """A checked --init-from folder; reading it costs two small files, the weights load in `load_model`.

    hf_config: its transformers GPTNeoXConfig (configs.model.ModelConfig.from_hf turns it into the run's shape).
    """

    path: Path
    hf_config: object
    tokenizer_vocab: int
    tokenizer_sha256s: frozenset[str]
    """Dataset tokenizers that are this checkpoint's: its tokenizer.json, and for our own checkpoints also the
    dataset tokenizer it was trained with (save_pretrained rewrites tokenizer.json, so the bytes differ)."""

    def check_dataset(self, data_dir: Path, dataset_tokenizer_sha256: str) -> None:
        """Refuse data that was tokenized with another tokenizer."""
        if dataset_tokenizer_sha256 not in self.tokenizer_sha256s:
            raise PiconeoxError(
                f"--init-from {self.path}: the data {data_dir} was tokenized with another tokenizer (sha256 "
                f"{dataset_tokenizer_sha256[:12]}); prepare it with `prepare_data.py ... --tokenizer-from {self.path}`")

    def describe(self) -> str:
        m = self.hf_config
        return (f"hidden {m.hidden_size}, {m.num_hidden_layers} layers, {m.num_attention_heads} heads, intermediate "
                f"{m.intermediate_size}, context {m.max_position_embeddings}, vocab {m.vocab_size}")

    def load_model(self):
        """The weights in float32 (Pythia ships float16; mixed precision is the run's choice), no KV cache."""
        import torch
        from transformers import GPTNeoXForCausalLM

        if (self.path / DCP_INDEX).is_file():  # one of our step folders: consolidate its shards (crc-checked)
            model = load_model(self.path).train()
            model.config.use_cache = False
            return model
        try:
            model, info = GPTNeoXForCausalLM.from_pretrained(self.path, config=self.hf_config, dtype=torch.float32,
                                                             attn_implementation="sdpa", output_loading_info=True)
        except (OSError, ValueError, RuntimeError, MemoryError) as e:
            why = first_line(e)
            raise PiconeoxError(f"--init-from {self.path}: the weights do not load ({why})") from None
        if info["missing_keys"]:
            raise PiconeoxError(f"--init-from {self.path}: the weights lack {len(info['missing_keys'])} tensors of the "
                                f"model its config.json describes (e.g. {sorted(info['missing_keys'])[0]})")
        model.config.use_cache = False  # training forwards would build a KV cache for nothing
        return model

    def load_tokenizer(self):
        return load_tokenizer(self.path, self.hf_config.vocab_size, "--init-from ")


def open_pretrained(path: str | Path) -> Pretrained:
    """Check an --init-from folder without loading weights; every problem is one PiconeoxError line."""
    from utils.data.tokenizers import read_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise PiconeoxError(f"--init-from {path}: no such folder (give a Hugging Face GPT-NeoX checkpoint folder, "
                            "e.g. a downloaded Pythia model or checkpoints/<run>/final)")
    if reason := foreign_entry(path):  # a link or FIFO inside: nothing outside the folder is read
        raise PiconeoxError(f"--init-from {reason}")
    if not (path / "config.json").is_file():
        raise PiconeoxError(f"--init-from {path}: no config.json; not a Hugging Face checkpoint folder")
    hf = gpt_neox_config(path, "--init-from ")  # GPT-NeoX, no auto_map, sane sizes
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise PiconeoxError(f"--init-from {path}: no weights; expected one of {', '.join(WEIGHT_FILES)}")
    tokenizer_file = path / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise PiconeoxError(f"--init-from {path}: no {TOKENIZER_FILE}; the checkpoint's tokenizer must be next to "
                            "its weights (copy it from where the model came from)")
    for key, value in FIXED_SETTINGS.items():
        if getattr(hf, key, value) != value:
            raise PiconeoxError(f"--init-from {path}: config.json has {key}={getattr(hf, key)!r}; piconeox's GPT-NeoX "
                                f"needs {value!r} (as Pythia has)")
    if why := tokenizer_problem(tokenizer_file, hf.vocab_size):
        raise PiconeoxError(f"--init-from {why}")
    # sizes as the weights hold them, before a model of that size is built (weights holding no tensor: refused)
    check_weights(hf, weight_shapes(path), path, "--init-from ")
    tokenizer_vocab = read_tokenizer(tokenizer_file).get_vocab_size()
    shas = {file_sha256(tokenizer_file)}
    run_config = path / "run_config.json"
    if run_config.is_file():  # one of our checkpoints: also the dataset tokenizer it was trained with
        trained_with = read_json(run_config, "--init-from", SMALL_JSON_BYTES).get("data_tokenizer_sha256")
        shas |= {trained_with} if trained_with else set()
    return Pretrained(path, hf, tokenizer_vocab, frozenset(shas))
