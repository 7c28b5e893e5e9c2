"""Before the launch (`train.py --preflight`, once per machine, no GPU): every check that needs files, folders
or credentials, so a mistake is one line before any process starts; then a bucket --data synced to this machine.

start_training.sh also runs, before that (one line each on a mistake, exit 2):
    python -m utils.preflight temp-note                   a new empty file for the run lock's note (prints it)
    python -m utils.preflight accelerate-config FILE GPUS   the --accelerate-config file, for GPUS per machine
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from utils.errors import PiconeoxError, cli, first_line

# The distributed types train.py runs (utils/distributed.py): DDP on GPUs or CPU ranks, FSDP2. DeepSpeed, Megatron-LM
# and TPUs would be launched by accelerate and then trained as something else, or fail after the preflight.
RUNS = ("NO", "MULTI_GPU", "MULTI_CPU", "FSDP")
EXAMPLE = "configs/accelerate/fsdp_production.yaml"


def preflight(cfg, pretrained, folders: tuple[str, Path, Path], processes: int | None = None) -> Path | None:
    """Check output folders, --data, --init-from, --resume and bucket credentials (configs/run.py checked the rest;
    `cfg` is a configs RunConfig, `folders` its (run name, run dir, log dir)), then sync a bucket --data into this
    machine's cache and return that folder (None for local data)."""
    from utils.ckpt.read import find_checkpoint
    from utils.data.shards import verify_dataset
    from utils.data.source import DATA_CACHE, check_data_arg, ensure_local
    from utils.run.allocation import machine_folder
    from utils.report.trackers import check_wandb_login, parse_report_to
    from utils.run import runlock
    from utils.run.network import check_gloo_ifname
    from utils.run.run_folders import check_new_run
    from utils.storage import check_credentials, is_remote, open_storage

    check_gloo_ifname(os.environ.get("GLOO_SOCKET_IFNAME"))  # gloo would raise in every rank after the launch
    if (local := check_data_arg(cfg.train)) is not None:
        dataset = verify_dataset(local)  # hashes the shards on first use; the launched run then finds them cached
        if pretrained:
            pretrained.check_dataset(local, dataset.tokenizer_sha256)
    if processes is not None and processes < 1:
        raise PiconeoxError(f"--processes {processes}: must be at least 1")
    if processes and not cfg.run.resume:  # known now: a resume keeps its checkpoint's global batch
        cfg.train.for_world(processes)
    s = cfg.run
    name, run_dir, log_dir = folders
    with runlock.for_launcher(s.output_dir, name, s.log_dir):  # held for the run unless a check here refuses it
        check_new_run(s.resume, run_dir, log_dir)
        if "wandb" in parse_report_to(s.report_to):
            check_wandb_login()  # caught here, not after the model is built
        check_credentials((cfg.train.data, s.checkpoint_bucket, s.resume), s.credentials)  # no bucket is read
        if s.checkpoint_bucket and not is_remote(s.checkpoint_bucket):
            open_storage(s.checkpoint_bucket)  # a local bucket that is a file: refused before the launch
        if s.resume and s.resume != "auto" and not is_remote(s.resume):
            find_checkpoint(s.resume, resume=True, flag="--resume ", warn=lambda _: None)
    if not is_remote(cfg.train.data):
        return None
    return ensure_local(cfg.train.data, machine_folder(DATA_CACHE), s.credentials)


def temp_note() -> str:
    """A new empty file in TMPDIR, else in the first usable of Python's fallbacks (/tmp, /var/tmp, /usr/tmp, the
    current folder): a missing, read-only or full TMPDIR gets one warning line, no usable folder one error line."""
    wanted = os.environ.get("TMPDIR")
    try:
        fd, name = tempfile.mkstemp(prefix="piconeox-lock.")
    except OSError:  # FileNotFoundError("No usable temporary directory found in [...]")
        raise PiconeoxError(f"no folder for temporary files: TMPDIR={wanted or ''} and /tmp, /var/tmp, /usr/tmp and "
                            f"{os.getcwd()} are missing, read-only or full; set TMPDIR to a writable folder") from None
    os.close(fd)
    if wanted and os.path.dirname(name) != os.path.abspath(wanted):
        print(f"warning: TMPDIR {wanted} is missing, read-only or full; temporary files go to {os.path.dirname(name)}",
              file=sys.stderr)
    return name


def check_accelerate_config(path: str, gpus: int) -> dict:
    """The settings of the --accelerate-config file `path` for a run on `gpus` GPUs per machine (0: CPU), when
    accelerate can read it and train.py runs what it asks for; else one line."""
    import yaml

    flag, file = f"--accelerate-config '{path}'", Path(path)
    if file.is_dir():
        raise PiconeoxError(f"{flag} is a folder, not a config file: give one file, e.g. {EXAMPLE}")
    if not file.is_file():
        what = "is not a regular file" if file.exists() else "does not exist"
        raise PiconeoxError(f"{flag} {what} (the repository's are in configs/accelerate/)")
    kind = "JSON" if path.endswith(".json") else "YAML"  # as accelerate reads it
    try:
        text = file.read_text(encoding="utf-8")
        cfg = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except OSError as e:
        raise PiconeoxError(f"{flag} cannot be read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise PiconeoxError(f"{flag} is not a text file (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except (ValueError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise PiconeoxError(f"{flag} is not {kind}{line}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(cfg, dict) or not cfg:
        raise PiconeoxError(f"{flag} holds no settings ({'empty' if not cfg else type(cfg).__name__}): it needs "
                            f"`key: value` lines like {EXAMPLE}")
    dist, where = str(cfg.get("distributed_type", "NO")), cfg.get("compute_environment", "LOCAL_MACHINE")
    asked = [f"distributed_type {dist}"] * (dist.upper() not in RUNS) + [f"compute_environment {where}"] * (
        where != "LOCAL_MACHINE") + [k for k in ("deepspeed_config", "megatron_lm_config") if cfg.get(k)]
    if asked:
        raise PiconeoxError(f"{flag} asks for {asked[0]}, which piconeox does not run (distributed_type: MULTI_GPU "
                            f"for DDP or FSDP for FSDP2): start from {EXAMPLE} or multi_gpu_ddp.yaml")
    from accelerate.commands.config.config_args import load_config_from_file

    try:  # what `accelerate launch` does with it: unknown keys, a missing or misspelt distributed_type
        load_config_from_file(path)
    except (ValueError, TypeError, KeyError) as e:
        raise PiconeoxError(f"{flag} is refused by accelerate: {first_line(e).replace(f'at {path} ', '')}") from None
    fsdp = cfg.get("fsdp_config") or {}
    if dist.upper() == "FSDP" and str(fsdp.get("fsdp_version", "")).strip() != "2":
        given = f"fsdp_version: {fsdp['fsdp_version']}" if "fsdp_version" in fsdp else "no fsdp_version (accelerate " \
            "then runs FSDP1)"
        raise PiconeoxError(f"{flag} has distributed_type FSDP with {given}: piconeox shards with FSDP2 only; set "
                            f"fsdp_version: 2 under fsdp_config, as {EXAMPLE} does")
    ids = cfg.get("gpu_ids")
    if ids is not None and str(ids).strip().lower() != "all":
        listed = [i for i in str(ids).split(",") if i.strip()]
        if gpus == 0 or len(listed) < gpus:
            raise PiconeoxError(f"{flag} has gpu_ids: {ids}, " + ("but this run is on the CPU (--gpus 0)" if gpus == 0
                                else f"{len(listed)} GPU(s) for --gpus {gpus}") +
                                ": remove the line (CUDA_VISIBLE_DEVICES chooses GPUs) or set gpu_ids: all")
    return cfg


@cli
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["temp-note"] and len(argv) == 1:
        print(temp_note())
    elif argv[:1] == ["accelerate-config"] and len(argv) == 3 and argv[2].isdigit():
        check_accelerate_config(argv[1], int(argv[2]))
    else:
        print("usage: python -m utils.preflight temp-note | accelerate-config FILE GPUS", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
