"""What a tokenizer.json from elsewhere (a checkpoint, --tokenizer-from, --init-from, a dataset) may hold before the
`tokenizers` library builds it: only the pipeline pieces piconeox's own tokenizers and GPT-NeoX's (Pythia's) use,
with their options, and no more ids than the model has rows.

The Rust library runs whatever pipeline a file names: 4.6 KB of chained `Replace` normalizers turn each `e` into a
million characters and the process dies with SIGABRT (an allocation failure no Python handler sees); `padding` to
a fixed length of 10^9 does the same on the first encode. So a file is checked as JSON first:
- model: BPE without dropout (a random tokenization), its vocab of ids 0..MAX_TOKENS-1 and its merges;
- normalizer: none, or one Unicode normalization form (NFC, NFD, NFKC, NFKD: at most 18 characters out per
  character in, Unicode's own bound), never rules that rewrite text;
- pre_tokenizer: none or ByteLevel; decoder: none, Fuse or ByteLevel; post_processor: none, ByteLevel, or a
  TemplateProcessing of a few pieces (transformers writes one that adds nothing);
- no truncation or padding; added tokens of bounded length.
"""
from __future__ import annotations

from utils.errors import PiconeoxError

MAX_TOKENS = 1 << 21  # vocab entries and merges a tokenizer.json may hold (GPT-NeoX's: 50,277 and 50,009)
MAX_TOKEN_CHARS = 1024  # an added token's text, an affix
MAX_TEMPLATE = 8  # pieces of a TemplateProcessing template, special tokens it names
TOP_KEYS = {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
            "decoder", "model"}
NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": bool, "trim_offsets": bool, "use_regex": bool}
PIECES = {  # part -> allowed {type: {option: kind}}; a kind is a type, or a tuple of allowed values
    "normalizer": {name: {"type": name} for name in NORMALIZERS},
    "pre_tokenizer": {"ByteLevel": BYTE_LEVEL},
    "decoder": {"Fuse": {"type": "Fuse"}, "ByteLevel": BYTE_LEVEL},
    "post_processor": {"ByteLevel": BYTE_LEVEL,
                       "TemplateProcessing": {"type": "TemplateProcessing", "single": list, "pair": list,
                                              "special_tokens": dict}},
}
BPE_OPTIONS = {"type": "BPE", "dropout": (None,), "unk_token": (str, None), "continuing_subword_prefix": (str, None),
               "end_of_word_suffix": (str, None), "fuse_unk": bool, "byte_fallback": bool, "ignore_merges": bool,
               "vocab": dict, "merges": list}


def _fits(value, want) -> bool:
    if isinstance(want, str):  # the type name itself
        return value == want
    if isinstance(want, tuple):  # types or exact values (None)
        return any(value is w if w is None else isinstance(value, w) for w in want)
    return isinstance(value, want) and (want is not int or not isinstance(value, bool))


def _options(obj: dict, allowed: dict, where: str) -> None:
    """Every key of `obj` one of `allowed` with a value of its kind (keys may be left out, as the library allows)."""
    for key, value in obj.items():
        if key not in allowed:
            raise ValueError(f"{where} has an option {key!r} piconeox does not use")
        if not _fits(value, allowed[key]):
            raise ValueError(f"{where} option {key!r} is {str(value)[:40]!r}, which piconeox does not use")
        if isinstance(value, str) and len(value) > MAX_TOKEN_CHARS:
            raise ValueError(f"{where} option {key!r} is {len(value):,} characters long")


def _template(piece: dict) -> None:
    for key in ("single", "pair"):
        if len(piece.get(key, ())) > MAX_TEMPLATE:
            raise ValueError(f"post_processor TemplateProcessing {key} has {len(piece[key])} pieces, at most "
                             f"{MAX_TEMPLATE} allowed")
    special = piece.get("special_tokens", {})
    if len(special) > MAX_TEMPLATE or any(not isinstance(s, dict) or len(s.get("ids") or ()) > MAX_TEMPLATE or
                                          len(s.get("tokens") or ()) > MAX_TEMPLATE for s in special.values()):
        raise ValueError(f"post_processor TemplateProcessing names more than {MAX_TEMPLATE} special tokens")


def _pipeline(spec: dict) -> None:
    if odd := sorted(set(spec) - TOP_KEYS):
        raise ValueError(f"it has {odd[0]!r}, not a part of the tokenizers piconeox uses")
    for key in ("truncation", "padding"):
        if spec.get(key) is not None:
            raise ValueError(f"it sets {key}, which piconeox's tokenizers never do")
    for part, types in PIECES.items():
        piece = spec.get(part)
        if piece is None:
            continue
        if not isinstance(piece, dict) or piece.get("type") not in types:
            kind = piece.get("type") if isinstance(piece, dict) else type(piece).__name__
            raise ValueError(f"its {part} is {str(kind)[:40]!r}; allowed are none or {', '.join(types)}")
        _options(piece, types[piece["type"]], f"{part} {piece['type']}")
        if piece["type"] == "TemplateProcessing":
            _template(piece)


def _ids(spec: dict) -> int:
    """The number of ids the file gives (one past its highest), its vocab and added tokens checked."""
    model = spec.get("model")
    if not isinstance(model, dict):
        raise ValueError("no model object")
    if model.get("type") != "BPE":
        raise ValueError(f"its model is {str(model.get('type'))[:40]!r}; piconeox's tokenizers are BPE")
    _options(model, BPE_OPTIONS, "model BPE")
    vocab, merges, added = model.get("vocab") or {}, model.get("merges") or [], spec.get("added_tokens") or []
    for what, entries in (("vocab", vocab), ("merges", merges), ("added_tokens", added)):
        if len(entries) > MAX_TOKENS:
            raise ValueError(f"{len(entries):,} {what} entries, more than the {MAX_TOKENS:,} allowed")
    if not isinstance(added, list) or not all(
            isinstance(t, dict) and isinstance(t.get("content"), str) and 0 < len(t["content"]) <= MAX_TOKEN_CHARS
            and type(t.get("id")) is int and 0 <= t["id"] < MAX_TOKENS for t in added):
        raise ValueError(f"added_tokens must be tokens of 1..{MAX_TOKEN_CHARS} characters with ids "
                         f"0..{MAX_TOKENS - 1:,}")
    if not all(type(i) is int and 0 <= i < MAX_TOKENS for i in vocab.values()):
        raise ValueError(f"its vocab must map tokens to ids 0..{MAX_TOKENS - 1:,}")
    return max([*vocab.values(), *(t["id"] for t in added), -1]) + 1


def check_tokenizer_json(spec, label: str, max_ids: int | None = None) -> int:
    """The number of ids of the parsed tokenizer.json `spec` once it holds only what piconeox's tokenizers use and
    no more than `max_ids` ids (the model's embedding rows); else one PiconeoxError line. Nothing is built."""
    try:
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        ids = _ids(spec)
        _pipeline(spec)
    except ValueError as e:
        raise PiconeoxError(f"{label} is not a tokenizer piconeox can use: {e}") from None
    if max_ids is not None and ids > max_ids:
        raise PiconeoxError(f"{label}: vocab mismatch: the tokenizer has {ids} ids but the model's embedding has "
                            f"{max_ids} rows")
    return ids
