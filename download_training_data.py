"""Sync a prepared dataset between a bucket and a local folder, verifying every file by crc32c.

Download (bucket -> machine):
    python download_training_data.py --source gs://my-bucket/data/tiny --dest data/tiny
Push (machine -> bucket; manifest.json goes up last):
    python download_training_data.py --push data/tiny --dest gs://my-bucket/data/tiny    # or s3://my-bucket/...

Either side may also be a local directory (a plain path or file:///path), which needs no account.
A re-run transfers only files whose size or crc32c differ. A downloaded dataset (a manifest.json at its
top, no --include) is then verified against its manifest. Exit status: 0 all good, 1 some files failed
(listed on stderr), 2 bad input, storage unreachable, or a copy that does not match its manifest.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from utils.atomic import check_writable_dir
from utils.errors import CliParser, Interrupted, PiconeoxError, cli, exit_process
from utils.data.shards import MANIFEST_FILE, verify_dataset
from utils.storage import is_remote, local_path, open_storage
from utils.storage.sync import SyncSummary, download_tree, upload_tree


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        description=__doc__,
        epilog="gs:// credentials: --credentials FILE, else GOOGLE_APPLICATION_CREDENTIALS, else application default\n"
        "credentials (gcloud auth application-default login); with STORAGE_EMULATOR_HOST set, a local GCS emulator\n"
        "is used without credentials. s3:// credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or\n"
        "AWS_PROFILE), AWS_REGION, and AWS_ENDPOINT_URL for R2 or MinIO. See credentials/README.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--source", metavar="URL",
                           help="download from this gs:// or s3://bucket/prefix (or local/file:// folder) into --dest")
    direction.add_argument("--push", metavar="DIR", help="upload this local dataset folder to --dest")
    parser.add_argument("--dest", required=True, metavar="DIR|URL",
                        help="with --source: the local folder, e.g. data/<name>; with --push: gs:// or s3://bucket/prefix")
    parser.add_argument("--workers", type=int, default=8, metavar="N", help="parallel transfers (default 8)")
    parser.add_argument("--include", metavar="GLOB",
                        help="only names matching this glob, relative to the prefix ('*' also matches '/')")
    parser.add_argument("--dry-run", action="store_true", help="list what would be transferred, change nothing")
    parser.add_argument("--credentials", metavar="FILE", help="service-account JSON key, e.g. credentials/key.json")
    parser.add_argument("--no-overwrite", action="store_true",
                        help="with --push: fail on remote objects that differ instead of replacing them")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="give up a storage call after S seconds of retries (default 60)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def run(args: argparse.Namespace) -> SyncSummary:
    """Do the transfer the parsed flags ask for; PiconeoxError for bad input."""
    if args.workers < 1:
        raise PiconeoxError(f"--workers must be at least 1, got {args.workers}")
    if args.no_overwrite and not args.push:
        raise PiconeoxError("--no-overwrite applies only to --push")
    if args.source and is_remote(args.dest):
        raise PiconeoxError(f"--dest {args.dest}: with --source, --dest is the local folder to download into")
    if not is_remote(args.dest) and not args.dry_run:
        check_writable_dir(local_path(args.dest), "--dest")
    if args.source:
        src = open_storage(args.source, args.credentials, timeout_s=args.timeout)
        dest = Path(local_path(args.dest))
        summary = download_tree(src, dest, include=args.include, workers=args.workers,
                                dry_run=args.dry_run, progress=not args.quiet)
        if not (args.dry_run or summary.failed or args.include) and (dest / MANIFEST_FILE).is_file():
            try:  # every file matched the bucket's crc32c; now the copy must match its own manifest too
                verify_dataset(dest)
            except PiconeoxError as e:
                raise PiconeoxError(f"--source {args.source}: the downloaded dataset does not match its manifest: "
                                    f"{e}") from None
        return summary
    dst = open_storage(args.dest, args.credentials, timeout_s=args.timeout)
    return upload_tree(Path(args.push), dst, if_absent=args.no_overwrite, workers=args.workers,
                       include=args.include, dry_run=args.dry_run, progress=not args.quiet)


def report(summary: SyncSummary, *, pushing: bool, dry_run: bool) -> str:
    """One summary line, e.g. 'downloaded 12 files (48.0 MB, 95.2 MB/s), skipped 3, failed 0'."""
    verb = "uploaded" if pushing else "downloaded"
    mb = summary.bytes / 1e6
    if dry_run:
        return (f"dry run: would have {verb} {summary.downloaded} files ({mb:.1f} MB), skipped {summary.skipped}, "
                f"refused {summary.failed}")
    rate = mb / summary.seconds if summary.seconds > 0 else 0.0
    return (f"{verb} {summary.downloaded} files ({mb:.1f} MB, {rate:.1f} MB/s), "
            f"skipped {summary.skipped}, failed {summary.failed}")


@cli
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)
    logging.getLogger("utils").setLevel(logging.INFO)  # our notes (stale .partial files removed), not the libraries'

    try:
        summary = run(args)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; no partial file was kept under its final name, re-run to resume") from None
    if any("No space left on device" in line for line in summary.errors):
        from utils.diskfull import disk_full

        raise disk_full(args.dest or ".", "the dataset")
    for line in summary.errors:
        print(f"failed: {line}", file=sys.stderr)
    print(report(summary, pushing=bool(args.push), dry_run=args.dry_run))
    return 1 if summary.failed else 0


if __name__ == "__main__":
    exit_process(main())
