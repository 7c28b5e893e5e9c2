"""Where a run's dataset comes from: a prepared folder, `demo` (prepared on first use), or a bucket prefix synced
into this machine's cache. Each check here reads no data, so a mistake is one line before any launch."""
from __future__ import annotations

import contextlib
from pathlib import Path

from utils.data.shards import verify_dataset
from utils.errors import PiconeoxError
from utils.flock import exclusive
from utils.storage import cache_folder, check_location, is_remote, local_path, open_storage
from utils.storage.sync import download_tree

DATA_CACHE = Path("data") / "gcs-cache"  # bucket datasets land in DATA_CACHE/<host>/[<scheme>/]<bucket>/<prefix>


def check_data_arg(train_cfg) -> Path | None:
    """Validate --data without reading it: the local dataset directory, or None for `demo` and a bucket URL."""
    data = train_cfg.data
    if not data:
        raise PiconeoxError("no dataset: this preset needs --data DIR (prepare one with prepare_data.py) or --data "
                            "gs://... or s3://...")
    if data == "demo":
        return None
    check_location(data)  # a bad bucket name or prefix is one line before the launch
    if is_remote(data):
        return None
    out = Path(local_path(data))
    if out.is_file():  # a text file: it needs preparing first
        raise PiconeoxError(f"--data {data} is a file; prepare it first with `python prepare_data.py {data} "
                            f"--name {out.stem} --tokenizer {train_cfg.tokenizer}`, then pass --data data/{out.stem}")
    if not out.is_dir():
        raise PiconeoxError(f"--data {data}: no such directory; prepare it with `python prepare_data.py TEXT_FILES "
                            f"--out-dir {out.parent} --name {out.name} --tokenizer {train_cfg.tokenizer}`, "
                            "or use --data demo")
    if train_cfg.dataset_percent != 100:
        raise PiconeoxError(f"--dataset-percent {train_cfg.dataset_percent:g} applies when the trainer prepares "
                            f"`demo`; for {data} run prepare_data.py --dataset-percent instead")
    return out


def data_name(train_cfg) -> str:
    """The dataset's folder name, known before it is prepared or synced: demo-<tokenizer>..., else the last path
    part."""
    if train_cfg.data == "demo":
        vocab = f"{train_cfg.tokenizer_vocab}" if train_cfg.tokenizer_vocab else ""
        pct = "" if train_cfg.dataset_percent == 100 else f"-p{train_cfg.dataset_percent:g}"
        return f"demo-{train_cfg.tokenizer}{vocab}{pct}"
    if is_remote(train_cfg.data):
        return train_cfg.data.rstrip("/").rsplit("/", 1)[-1]
    return Path(local_path(train_cfg.data)).resolve().name


def ensure_local(source_url: str, cache_root: Path, credentials: str | None = None) -> Path:
    """A local folder holding the dataset at `source_url`.

    A bucket URL is synced (verified, incremental) into cache_root/<bucket>/<prefix> (utils.storage.cache_folder;
    callers pass this machine's own cache_root, utils.run.allocation.machine_folder); a local path or file:// URL is
    returned as is. One process per machine calls it (start_training.sh, before the launch).
    """
    if not is_remote(source_url):
        return Path(local_path(source_url))
    dest = cache_folder(cache_root, source_url)
    summary = download_tree(open_storage(source_url, credentials), dest)
    if summary.failed:
        raise PiconeoxError(f"{summary.failed} file(s) of {source_url} failed to sync into {dest}; "
                            f"first: {summary.errors[0]}")
    return dest


@contextlib.contextmanager
def preparing(out: Path):
    """flock(2) on a file beside `out`: two runs started at once (other names, one demo dataset) prepare it once; the
    second waits, then finds it. Without file locks (NFS without lockd) one warning, and no guard."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.prepare.lock", "a+") as f:
        exclusive(f.fileno(), out.parent, f"{out.name} is prepared without them: do not start two runs on it at once")
        yield


def local_dataset(train_cfg, accelerator, credentials: str | None, cache_root: Path) -> Path:
    """The local dataset directory: `demo` is prepared on first use (one process per machine first); a bucket URL
    is synced into `cache_root` (this machine's) here only by a single process: with more, start_training.sh syncs
    it before the launch."""
    local = check_data_arg(train_cfg)
    if local is not None:
        with accelerator.local_main_process_first():  # on first use the shards' crc32c are hashed once per machine
            verify_dataset(local)
        return local
    if train_cfg.data == "demo":
        out = Path("data") / data_name(train_cfg)
        with accelerator.local_main_process_first(), preparing(out):  # one process per machine prepares it
            if not (out / "manifest.json").exists():
                from utils.data.prepare import prepare
                from utils.diskfull import one_line_when_full

                with one_line_when_full(out.parent, f"the demo dataset {out.name}"):
                    prepare(["demo"], name=out.name, out_dir=out.parent, tokenizer=train_cfg.tokenizer,
                            vocab_size=train_cfg.tokenizer_vocab, dataset_percent=train_cfg.dataset_percent)
        return out
    if accelerator.num_processes > 1:  # a download inside the process group would hold every other rank
        raise PiconeoxError(f"--data {train_cfg.data}: {accelerator.num_processes} processes cannot sync it; launch "
                            "with ./start_training.sh (it syncs once per machine first) or download it with "
                            "download_training_data.py and pass the folder")
    return ensure_local(train_cfg.data, cache_root, credentials)


def make_loaders(data_dir: Path, tc, accelerator):
    """(train, val) loaders: this rank's slice of every global batch."""
    from utils.data.loader import BlockLoader  # torch: imported here, so train.py --preflight never loads it

    rank, world = accelerator.process_index, accelerator.num_processes
    return (BlockLoader(data_dir, "train", tc.seq_len, tc.micro_batch_size, seed=tc.seed, rank=rank, world_size=world),
            BlockLoader(data_dir, "val", tc.seq_len, tc.micro_batch_size, seed=tc.seed, rank=rank, world_size=world,
                        shuffle=False))
