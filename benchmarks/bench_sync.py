"""How fast download_tree re-checks an intact dataset and how fast it downloads, on local GCS servers.

    .venv/bin/python benchmarks/bench_sync.py [--files 1000] [--big-mib 64]

1. 1,000 small shards already present and intact: the re-run time (goal <= 2 s) and its HTTP
   requests (goal: one listing), with the crc32c index warm and, for comparison, deleted.
2. Download throughput for a few large objects from gcp-storage-emulator (single-threaded Python
   server) and fake-gcs-server (Go), one worker against four. On a 2-core box with a one-request-at-a-
   time emulator the parallel figure means little; it is reported, not tuned for.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("NO_GCE_CHECK", "true")  # never probe a cloud metadata server
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gcp_storage_emulator.server import create_server  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import storage  # noqa: E402

from tests.support.gcs_servers import start_fake_gcs  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402
from utils.storage.gcs import GCSStorage  # noqa: E402
from utils.storage.sync import INDEX_NAME, download_tree  # noqa: E402


def counting_client(host: str) -> tuple[storage.Client, list[str]]:
    """A client for `host` that records the path of every HTTP request it makes."""
    os.environ["STORAGE_EMULATOR_HOST"] = host
    client = storage.Client(project="bench", credentials=AnonymousCredentials())
    requests_made: list[str] = []
    client._http.hooks["response"].append(lambda r, *a, **k: requests_made.append(r.request.path_url))
    return client, requests_made


def bench_rerun(host: str, n_files: int, work: Path) -> None:
    client, requests_made = counting_client(host)
    bucket = client.create_bucket("bench-rerun")
    for i in range(n_files):
        bucket.blob(f"data/shards/{i // 100:02d}/shard-{i:05d}.npy").upload_from_string(os.urandom(2048))
    src = GCSStorage(client, "bench-rerun", "data/shards")
    dest = work / "rerun"
    first = download_tree(src, dest, progress=False)
    print(f"first download: {first.downloaded} files in {first.seconds:.2f} s")
    for label, drop_index in (("re-run, crc32c index warm", False), ("re-run, index deleted (re-hash)", True)):
        if drop_index:
            (dest / INDEX_NAME).unlink()
        requests_made.clear()
        again = download_tree(src, dest, progress=False)
        print(f"{label}: {again.skipped} skipped, {again.downloaded} downloaded in {again.seconds:.3f} s "
              f"(goal <= 2 s), HTTP requests: {len(requests_made)}")


def bench_throughput(name: str, host: str, big_mib: int, work: Path) -> None:
    client, _ = counting_client(host)
    bucket = client.create_bucket(f"bench-{name}")
    payload = os.urandom(big_mib << 20)
    for i in range(4):
        bucket.blob(f"big/part-{i}.bin").upload_from_string(payload)
    src = GCSStorage(client, f"bench-{name}", "big")
    rates = {}
    for workers in (1, 4):
        s = download_tree(src, work / f"{name}-{workers}", workers=workers, progress=False)
        rates[workers] = s.bytes / 1e6 / s.seconds
        print(f"{name}: {s.downloaded} x {big_mib} MiB, {workers} worker(s): {rates[workers]:.0f} MB/s")
    print(f"{name}: 4 workers / 1 worker = {rates[4] / rates[1]:.2f}x")


@cli
def main(argv=None) -> None:
    parser = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=at_least(1), default=1000, help="small shards for the re-run check")
    parser.add_argument("--big-mib", type=at_least(1), default=32, help="size of each of 4 objects for throughput")
    args = parser.parse_args(argv)

    emulator = create_server("127.0.0.1", 0, in_memory=True)
    emulator.start()
    fake = start_fake_gcs()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            emulator_host = f"http://127.0.0.1:{emulator._api._httpd.server_address[1]}"
            bench_rerun(emulator_host, args.files, Path(tmp))
            bench_throughput("gcp-storage-emulator", emulator_host, args.big_mib, Path(tmp))
            bench_throughput("fake-gcs-server", fake.url, args.big_mib, Path(tmp))
    finally:
        fake.stop()
        emulator.stop()


if __name__ == "__main__":
    sys.exit(main())
