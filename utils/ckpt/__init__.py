"""Checkpoints: the format and its COMPLETE marker, capture, write, load, the bucket side, resume, the uploader.

    from utils import ckpt
    ckpt.find_checkpoint(path)               # which folder the user meant, checked
    ckpt.Checkpointer(model, optimizer, ckpt.training_parts(...), ...).capture(step)

Submodules: format (names, marker, find_checkpoint, rotation), state (capture off the device, RNG),
checkpointer (the registry of stateful parts), write / load (folders on disk), remote (the bucket side),
resume (rank 0 decides where a run resumes), uploader (the saver thread).

The names below load their submodule on first use (PEP 562), so a tool that needs only the format (say
utils/push_checkpoint.py) does not pay for importing torch.
"""
import importlib

_EXPORTS = {
    "checkpointer": ("Checkpointer", "Part", "TrainerState", "training_parts"),
    "format": ("DCP_INDEX", "MARKER", "STEP_RE", "WEIGHTS_FILE", "check_complete", "check_files", "find_checkpoint",
               "latest_complete", "manifest", "read_marker", "rng_name", "rotate", "step_dir_name", "step_folders",
               "write_marker"),
    "load": ("checked", "load_model", "load_sharded", "read_part", "read_rng", "read_weights"),
    "state": ("Snapshot", "full_weights", "grace_warning", "own_share", "rng_state", "set_rng_state", "sharded_state",
              "stage", "staged_share", "tensor_bytes", "tensor_leaves"),
    "write": ("consolidate", "consolidate_into", "is_consolidated", "link_copy", "prepare_step_folder", "publish_final",
              "save_pretrained_weights", "write_common", "write_shards", "write_weights"),
}
_OWNER = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_OWNER)


def __getattr__(name: str):
    if name not in _OWNER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_OWNER[name]}"), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OWNER))
