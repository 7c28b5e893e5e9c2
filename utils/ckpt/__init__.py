"""Checkpoints: the format and its COMPLETE marker, capture, write, load, the bucket side, resume, the uploader.

    from utils import ckpt
    ckpt.find_checkpoint(path)               # which folder the user meant, checked
    ckpt.Checkpointer(model, optimizer, ckpt.training_parts(...), ...).capture(step)

Submodules: format (names, marker, find_checkpoint, rotation), state (capture off the device, RNG),
checkpointer (the registry of stateful parts), write / load (folders on disk), remote (the bucket side),
resume (rank 0 decides where a run resumes), uploader (the saver thread).
"""
from utils.ckpt.checkpointer import Checkpointer, Part, TrainerState, training_parts
from utils.ckpt.format import (DCP_INDEX, MARKER, STEP_RE, WEIGHTS_FILE, check_complete, check_files, find_checkpoint,
                               latest_complete, manifest, read_marker, rng_name, rotate, step_dir_name, step_folders,
                               write_marker)
from utils.ckpt.load import checked, load_model, load_sharded, read_part, read_rng, read_weights
from utils.ckpt.state import (Snapshot, full_weights, grace_warning, own_share, rng_state, set_rng_state,
                              sharded_state, stage, staged_share, tensor_bytes, tensor_leaves)
from utils.ckpt.write import (consolidate, consolidate_into, is_consolidated, link_copy, prepare_step_folder,
                              publish_final, save_pretrained_weights, write_common, write_shards,
                              write_weights)

__all__ = ["DCP_INDEX", "MARKER", "STEP_RE", "WEIGHTS_FILE", "Checkpointer", "Part", "Snapshot", "TrainerState",
           "check_complete", "check_files", "checked", "consolidate", "consolidate_into", "find_checkpoint",
           "full_weights", "grace_warning", "is_consolidated", "latest_complete", "link_copy",
           "load_model",
           "load_sharded", "manifest", "own_share", "prepare_step_folder", "publish_final", "read_marker", "read_part",
           "read_rng", "read_weights", "rng_name", "rng_state", "rotate", "save_pretrained_weights", "set_rng_state",
           "sharded_state", "stage", "staged_share", "tensor_bytes", "tensor_leaves",
           "step_dir_name", "step_folders", "training_parts", "write_common", "write_marker",
           "write_shards", "write_weights"]
