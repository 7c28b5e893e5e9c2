"""What a model folder (ours, or a Hugging Face folder a user downloaded) must be before a model is built from it.

- GPT-NeoX, read with transformers' GPT-NeoX classes directly: a folder never gets to name its own code. One
  whose config.json names another model_type, or whose config.json / tokenizer_config.json carry an `auto_map`
  (transformers would ask "Do you wish to run the custom code?"), is refused in one line.
- Sizes within LIMITS and equal to what the weight files hold (read from their headers or index, no tensor
  loaded): `num_hidden_layers: 100000` over two layers of weights is refused, not built.
- A tokenizer.json within bounds (utils.data.tokenizers.read_tokenizer) with no more ids than the model's
  embedding has rows.
"""
from __future__ import annotations

import re
from pathlib import Path

from utils.textfile import SMALL_JSON_BYTES, read_json
from utils.errors import PiconeoxError, first_line

LIMITS = {"num_hidden_layers": 1024, "hidden_size": 1 << 16, "num_attention_heads": 1024,
          "intermediate_size": 1 << 18, "vocab_size": 1 << 21, "max_position_embeddings": 1 << 20}
CODE_KEYS = ("auto_map",)
WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", ".metadata")
LAYER = re.compile(r"^gpt_neox\.layers\.(\d+)\.")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names: what model weights are, ours F32, Pythia's F16


def gpt_neox_config(folder: Path, flag: str = ""):
    """The folder's GPTNeoXConfig once config.json is GPT-NeoX, names no code and has sane sizes."""
    from transformers import GPTNeoXConfig

    folder = Path(folder)
    raw = read_json(folder / "config.json", flag.strip(), SMALL_JSON_BYTES)
    tokenizer_config = folder / "tokenizer_config.json"
    tok_config = read_json(tokenizer_config, flag.strip(), SMALL_JSON_BYTES) if tokenizer_config.is_file() else {}
    for name, saved in (("config.json", raw), (tokenizer_config.name, tok_config)):
        if any(key in saved for key in CODE_KEYS):
            raise PiconeoxError(f"{flag}{folder}/{name}: asks to run the folder's own code (auto_map); piconeox "
                                "loads GPT-NeoX models with transformers' own classes and never runs a folder's code")
    if raw.get("model_type") != "gpt_neox":
        raise PiconeoxError(f"{flag}{folder}: model_type {raw.get('model_type')!r} is not GPT-NeoX; piconeox loads "
                            "gpt_neox models only (e.g. Pythia)")
    for key, top in LIMITS.items():
        value = raw.get(key)
        if value is not None and not (type(value) is int and 1 <= value <= top):
            raise PiconeoxError(f"{flag}{folder}/config.json: {key} {value!r} is out of range: give 1..{top:,}")
    try:
        return GPTNeoXConfig.from_dict(raw)
    except (ValueError, TypeError, KeyError) as e:
        raise PiconeoxError(f"{flag}{folder}/config.json: not a GPT-NeoX config ({first_line(e, 200)})")


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the model weights a folder holds, read from file headers (no tensor is loaded)."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if (folder / ".metadata").is_file():  # our step folders (DCP)
        from utils.ckpt.format import MARKER, check_complete
        from utils.ckpt.untrusted.safe_load import SafeFileSystemReader

        if (folder / MARKER).exists() and (reason := check_complete(folder)):  # sizes: a damaged folder says so
            raise PiconeoxError(reason)
        meta = SafeFileSystemReader(str(folder)).read_metadata().state_dict_metadata
        return {k[len("model."):]: tuple(m.size) for k, m in meta.items() if k.startswith("model.") and
                hasattr(m, "size")}
    if (folder / "pytorch_model.bin").is_file() and not (folder / "model.safetensors").is_file():
        from utils.ckpt.untrusted.safe_load import weights_only_load  # bounded, then memory-mapped: no tensor is read

        state = weights_only_load(folder / "pytorch_model.bin", folder / "pytorch_model.bin", mmap=True)
        if not isinstance(state, dict):
            raise PiconeoxError(f"{folder}/pytorch_model.bin: holds a {type(state).__name__}, not a state dict")
        if odd := next((k for k, v in state.items() if not is_weight(v)), None):
            raise PiconeoxError(f"{folder}/pytorch_model.bin: {str(odd)[:100]} holds {kind_of(state[odd])}; model "
                                "weights are floating-point tensors")
        return {k: tuple(v.shape) for k, v in state.items()}
    index = folder / "model.safetensors.index.json"
    weight_map = read_json(index, max_bytes=SMALL_JSON_BYTES).get("weight_map") if index.is_file() else \
        {"": "model.safetensors"}
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise PiconeoxError(f"{index}: weight_map must map tensor names to file names")
    shapes = {}
    for name in sorted(set(weight_map.values())):  # a file it names and the folder lacks is refused, not skipped
        if Path(name).name != name or not (folder / name).is_file():
            if not index.is_file():
                return {}  # no safetensors weights at all: the caller says what the folder lacks
            raise PiconeoxError(f"{index} names {name[:100]!r}, which is not a file of {folder}")
        try:
            with safe_open(folder / name, "pt") as f:
                shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
                if odd := next((k for k in f.keys() if f.get_slice(k).get_dtype() not in FLOAT_DTYPES), None):
                    raise PiconeoxError(f"{folder / name}: {odd[:100]} is a {f.get_slice(odd).get_dtype()} tensor; "
                                        "model weights are floating point")
        except SafetensorError as e:  # a file the index names that is not safetensors
            raise PiconeoxError(f"{folder / name}: not a safetensors file ({first_line(e, 200)})") from None
    return shapes


def model_skeleton(config) -> dict:
    """{name: (shape, dtype)} of every weight of the model `config` describes, as a run writes it (float32):
    built on the meta device, nothing allocated."""
    import torch
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):
        model = GPTNeoXForCausalLM._from_config(config, dtype=torch.float32)
    return {key: (tuple(t.shape), t.dtype) for key, t in model.state_dict().items()}


def is_weight(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point()


def kind_of(value) -> str:
    return f"a {value.dtype} tensor" if hasattr(value, "dtype") else f"a {type(value).__name__}"


def check_weights(config, shapes: dict[str, tuple[int, ...]], folder: Path, flag: str = "") -> None:
    """Refuse a config.json whose sizes are not those of the weights beside it, before anything is built: every
    weight the folder holds that the model has is of the model's shape (a model built on the meta device), and the
    embedding and each layer's two large matrices are there."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    found = {int(m.group(1)) for key in shapes if (m := LAYER.match(key))}
    if found != set(range(layers)):
        raise PiconeoxError(f"{flag}{folder}: config.json says {layers} layers, the weights hold {len(found)} "
                            f"(layer numbers {min(found, default=0)}..{max(found, default=-1)})")
    expect = {"gpt_neox.embed_in.weight": (config.vocab_size, hidden)}
    for i in range(layers):
        expect[f"gpt_neox.layers.{i}.attention.query_key_value.weight"] = (3 * hidden, hidden)
        expect[f"gpt_neox.layers.{i}.mlp.dense_h_to_4h.weight"] = (config.intermediate_size, hidden)
    expect.update({key: shape for key, (shape, _) in model_skeleton(config).items() if key in shapes})
    for key, shape in expect.items():
        if shapes.get(key) != shape:
            raise PiconeoxError(f"{flag}{folder}: config.json describes {key} as {list(shape)}, the weights hold "
                                f"{list(shapes[key]) if key in shapes else 'none'}")


def checked_config(folder: Path, flag: str = ""):
    """gpt_neox_config, checked against the folder's weights when it has safetensors or DCP weights."""
    config = gpt_neox_config(folder, flag)
    shapes = weight_shapes(folder)
    if shapes or any((Path(folder) / name).exists() for name in WEIGHT_NAMES):  # weights that hold no tensor: refused
        check_weights(config, shapes, Path(folder), flag)
    return config


def tokenizer_problem(path: Path, model_vocab: int) -> str | None:
    """Why tokenizer.json at `path` is not one to load with this model (too large, too many tokens or merges, not a
    tokenizer, ids beyond the model's embedding), or None."""
    from utils.data.tokenizers import read_tokenizer

    try:  # the count is read from the JSON and compared before anything is built
        read_tokenizer(path, max_ids=model_vocab)
    except PiconeoxError as e:
        return str(e)
    return None


def load_tokenizer(folder: Path, model_vocab: int, flag: str = ""):
    """The folder's tokenizer as transformers' PreTrainedTokenizerFast (never a class the folder names)."""
    from transformers import PreTrainedTokenizerFast

    if why := tokenizer_problem(Path(folder) / "tokenizer.json", model_vocab):
        raise PiconeoxError(f"{flag}{why}")
    return PreTrainedTokenizerFast.from_pretrained(str(folder))
