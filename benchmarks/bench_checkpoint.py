"""Checkpoint cost seen by the training loop: background write+upload vs steady state, blocking vs synchronous save.

    .venv/bin/python benchmarks/bench_checkpoint.py [--threads 1] [--bucket fake-gcs|local] [--saves 4]

A ~10M-parameter GPT-NeoX trains on the demo corpus (batch 8 x seq 128) on the CPU; checkpoints (~120 MB:
weights + AdamW states) go to fake-gcs-server on 127.0.0.1 (a separate process, like a real bucket) or to a
local directory. Goals: mean step time while an upload is in flight <= 1.10x the steady state; the blocking
part of a save (copy off the device) <= 20% of a synchronous save+upload. `--threads 1` leaves a core for
the uploader, as a GPU run leaves the CPU mostly idle; `--threads 2` shows the 2-core box fully contended.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

from configs.model import ModelConfig  # noqa: E402
from tests.support.uploads import Trainer  # noqa: E402
from utils.ckpt.format import latest_complete, step_dir_name  # noqa: E402
from utils.ckpt.uploader import CheckpointUploader, SaveRequest  # noqa: E402
from utils.data.prepare import prepare  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402
from utils.storage import open_storage  # noqa: E402

transformers.utils.logging.disable_progress_bar()  # save_pretrained's shard bar

SEQ, BATCH = 128, 8


class Run(Trainer):
    """A ~10M-parameter model, its optimizer and loader; step() trains once and returns its seconds."""

    def __init__(self, data: Path, log_dir: Path):
        super().__init__(data, log_dir, ModelConfig(hidden_size=320, num_layers=8, num_heads=5, intermediate_size=1280,
                                                    max_position_embeddings=SEQ, vocab_size=256),
                         lr=1e-3, warmup=10, total=10_000, batch=BATCH, seed=0)

    def step(self) -> float:
        start = time.perf_counter()
        super().step()
        return time.perf_counter() - start


def open_bucket(kind: str, tmp: Path):
    """(storage for the run, a stop function) on fake-gcs-server or a local directory."""
    if kind == "local":
        return open_storage(str(tmp / "bucket")).child("run"), lambda: None
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.support.gcs_servers import start_fake_gcs

    server = start_fake_gcs()
    # Real GCS does not run on the training machine: the stand-in server gets only idle CPU.
    os.setpriority(os.PRIO_PROCESS, server._process.pid, 19)
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    storage.Client(project="bench", credentials=AnonymousCredentials()).create_bucket("bench")
    return open_storage("gs://bench/ckpt").child("run"), server.stop


@cli
def main(argv=None) -> None:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=at_least(1), default=1, help="torch threads for training (default 1)")
    p.add_argument("--bucket", choices=("fake-gcs", "local"), default="fake-gcs")
    p.add_argument("--saves", type=at_least(2), default=6,
                   help="background saves to time, at least 2: the first apart (default 6)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = prepare(["demo"], name="demo-byte-p10", out_dir=tmp / "data", tokenizer="byte", dataset_percent=10)
        run = Run(data, tmp / "logs")
        store, stop_server = open_bucket(args.bucket, tmp)
        try:
            for _ in range(5):  # warm-up: allocator, AdamW states
                run.step()
            # Steady and in-flight windows alternate, so the load of a shared box drifts into both alike.
            steady, in_flight, blocking, upload_s = [], [], [], []
            with CheckpointUploader(store, keep_remote=2, keep_local=2, progress=False) as uploader:
                for _ in range(args.saves):
                    steady += [run.step() for _ in range(6)]
                    start = time.perf_counter()
                    uploader.submit(SaveRequest(run.snapshot(), tmp / "ckpt" / step_dir_name(run.state.step)))
                    blocking.append(time.perf_counter() - start)
                    while uploader.pending():
                        in_flight.append(run.step())
                    [result] = uploader.poll()
                    assert result.ok, result.error
                    upload_s.append(result.seconds)

            sync = []
            with CheckpointUploader(store, keep_remote=2, keep_local=2, background=False) as uploader:
                for _ in range(2):
                    run.step()
                    start = time.perf_counter()
                    uploader.submit(SaveRequest(run.snapshot(), tmp / "ckpt" / step_dir_name(run.state.step)))
                    sync.append(time.perf_counter() - start)
                    assert uploader.poll()[0].ok
            latest = latest_complete(tmp / "ckpt")
            size_mb = sum(f.stat().st_size for f in latest.iterdir()) / 1e6
        finally:
            stop_server()

    params = sum(p.numel() for p in run.model.parameters())
    steady_s, flight_s = statistics.mean(steady), statistics.mean(in_flight)
    print(f"model {params / 1e6:.1f}M params, batch {BATCH} x seq {SEQ}, torch threads {args.threads}, bucket "
          f"{args.bucket}; checkpoint {size_mb:.0f} MB, write+upload {statistics.mean(upload_s):.2f} s in background")
    print(f"step time steady      {steady_s * 1e3:7.1f} ms (mean of {len(steady)})")
    print(f"step time in flight   {flight_s * 1e3:7.1f} ms (mean of {len(in_flight)} steps during {args.saves} uploads)"
          f"  ratio {flight_s / steady_s:.2f}x (goal <= 1.10x)")
    block_s, sync_s = statistics.mean(blocking), statistics.mean(sync)
    print(f"save, blocking part   {block_s * 1e3:7.1f} ms (capture off the device + submit)")
    print(f"  1st save            {blocking[0] * 1e3:7.1f} ms (allocates the staging buffers, kept for the run)")
    print(f"  later saves         {statistics.mean(blocking[1:]) * 1e3:7.1f} ms (copy into the kept buffers; mean of "
          f"{len(blocking) - 1})")
    print(f"save, synchronous     {sync_s * 1e3:7.1f} ms (capture + write + upload)"
          f"  ratio {block_s / sync_s:.1%} (goal <= 20%)")


if __name__ == "__main__":
    sys.exit(main())
