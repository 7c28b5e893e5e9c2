"""The read door of checkpoints: whatever reads a checkpoint to use its model (utils/generate, utils/evaluate,
utils/pretrained, utils/to_gguf, utils/push_checkpoint, utils/preflight, rp2040's export, reference and bundle)
imports this module and nothing else of utils/ckpt/ (the house test holds them to it: docs/house.yaml `doors`).

A source is any of:
  - a run folder, `checkpoints/<run>`: its best/, else final/;
  - a checkpoint folder: best/, final/, step-XXXXXXXX/ (checked against its COMPLETE marker);
  - an HF model folder (what `from_pretrained` reads; no marker);
  - a bucket URL, `gs://bucket/prefix/<run>[/step-XXXXXXXX]` (or any scheme utils/storage opens): the run's newest
    complete step there (or the one named), downloaded and crc32c-checked into a local cache first.

    from utils.ckpt.read import open_checkpoint
    model, tokenizer = open_checkpoint("checkpoints/tiny")
"""
from __future__ import annotations

from pathlib import Path

from utils.ckpt.format import (DCP_INDEX, MARKER, WEIGHTS_FILE, find_checkpoint, foreign_entry, latest_complete,
                               read_marker, regular_file)
from utils.ckpt.hf.hf_folder import check_weights, gpt_neox_config, load_tokenizer, tokenizer_problem, weight_shapes
from utils.ckpt.bucket.remote import newest_verified, remote_steps
from utils.errors import PiconeoxError
from utils.storage import is_remote, local_path

# What a reader may use besides locate() and open_checkpoint(), each defined where its room keeps it:
__all__ = [
    "locate", "open_checkpoint", "CHECKPOINT_CACHE",
    "find_checkpoint", "load_model", "load_tokenizer",  # a local folder, its model and tokenizer
    "tokenizer_problem", "gpt_neox_config", "check_weights", "weight_shapes",  # an HF folder, before it is built
    "foreign_entry", "regular_file",  # nothing outside a folder is read: no links, FIFOs or devices
    "MARKER", "DCP_INDEX", "WEIGHTS_FILE", "latest_complete", "read_marker",  # the format's names and marker
    "remote_steps", "newest_verified",  # a bucket's steps, and the newest one its listing verifies
]

CHECKPOINT_CACHE = Path("checkpoints") / "bucket-cache"  # bucket checkpoints land in <cache>/<bucket>/<prefix>


def load_model(folder: Path):
    """A GPTNeoXForCausalLM (float32, eval mode) from a local checkpoint folder (utils/ckpt/load.py; imported here
    when called, so that a reader of markers alone never imports torch)."""
    from utils.ckpt.load import load_model as load

    return load(folder)


def locate(source: str | Path, *, flag: str = "", credentials: str | None = None,
           cache_root: Path = CHECKPOINT_CACHE, warn=print) -> Path:
    """The local checkpoint folder `source` means (see the module's text), checked; a bucket URL is downloaded into
    `cache_root` first. Every problem is one PiconeoxError line prefixed with `flag` (e.g. "--init-from ")."""
    if is_remote(str(source)):
        from utils.ckpt.bucket.remote import cache_dir_for, download_checkpoint, resolve_url

        store, step = resolve_url(str(source), credentials, flag=flag)
        return find_checkpoint(download_checkpoint(store, step, cache_dir_for(store.url, cache_root)), flag=flag)
    try:
        path = local_path(str(source))  # a plain path or file:///path
    except PiconeoxError as e:
        raise PiconeoxError(f"{flag}{e}") from None
    return find_checkpoint(path, flag=flag, warn=warn)


def open_checkpoint(source: str | Path, *, flag: str = "", credentials: str | None = None,
                    cache_root: Path = CHECKPOINT_CACHE):
    """(model, tokenizer) of the checkpoint `source` means: a float32 GPTNeoXForCausalLM in eval mode and its
    PreTrainedTokenizerFast; files with a marker are checked against its crc32c as they are read."""
    folder = locate(source, flag=flag, credentials=credentials, cache_root=cache_root)
    model = load_model(folder)
    return model, load_tokenizer(folder, model.config.vocab_size, flag)
