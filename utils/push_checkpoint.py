"""Finish the upload of a run's newest checkpoint after the run could not (it then exited 3 and printed this line).

    python utils/push_checkpoint.py checkpoints/<run> --checkpoint-bucket gs://bucket/ckpt [--credentials KEY.json]

Uploads the newest complete (crc32c-verified) local step-XXXXXXXX/ of the run to <bucket>/<run>/step-XXXXXXXX/,
where a `--resume auto` with that bucket finds it: only the files the bucket lacks or holds with another crc32c,
the COMPLETE marker last. Exit 0 when the bucket holds it verified, 2 for a bad argument, 3 when the upload
failed again (run it again later). A complete checkpoint already in the bucket is never overwritten.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (the printed command works from any folder): the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # not utils/: its evaluate.py would shadow the package

from utils.ckpt.read import MARKER, latest_complete, newest_verified, read_marker, remote_steps
from utils import errors
from utils.errors import CliParser, PiconeoxError
from utils.storage import StorageError, open_storage
from utils.storage.sync import upload_tree


def push(run_dir: Path, bucket_root: str, credentials: str | None) -> str:
    """Upload the newest complete local checkpoint of `run_dir`; returns the bucket folder that now holds it."""
    if not run_dir.is_dir():
        raise PiconeoxError(f"{run_dir}: no such run folder (pass checkpoints/<run>)")
    run_dir = run_dir.resolve()  # `.` from inside the run folder: its name is the bucket folder's
    newest = latest_complete(run_dir, warn=lambda _: None)
    if newest is None:
        raise PiconeoxError(f"{run_dir}: no complete step-XXXXXXXX checkpoint to upload")
    bucket = open_storage(bucket_root, credentials).child(run_dir.name)
    target = f"{bucket.url}/{newest.name}"
    step = int(read_marker(newest)["step"])
    if remote_steps(bucket).get(step):  # complete there: never overwritten
        if newest_verified(bucket, {step: True}, warn=lambda _: None):
            return f"{target} was already there, verified"
        raise PiconeoxError(f"{target} has a COMPLETE marker but a file that does not match it; delete that folder "
                            "from the bucket, then run this again")
    # the files the verified marker lists, nothing else: an unlisted file (or link) in the folder stays here
    summary = upload_tree(newest, bucket.child(newest.name), last=MARKER, only=set(read_marker(newest)["files"]))
    if summary.failed:
        raise UploadIncomplete(f"{summary.failed} file(s) of {newest} did not reach {target}; "
                               f"first: {summary.errors[0]}")
    return f"uploaded {newest} to {target}"


class UploadIncomplete(PiconeoxError):
    """The bucket is still missing the checkpoint (exit 3: try again later)."""


def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="the run's checkpoint folder, checkpoints/<run>")
    p.add_argument("--checkpoint-bucket", required=True, metavar="URL", help="the run's --checkpoint-bucket")
    p.add_argument("--credentials", metavar="FILE",
                   help="service-account JSON key for gs:// (s3:// reads the AWS_* variables)")
    args = p.parse_args(argv)
    if args.credentials and not Path(args.credentials).is_file():  # a typo is no success, even for a local bucket
        p.error(f"--credentials {args.credentials}: no such file")
    try:
        print(push(args.run_dir, args.checkpoint_bucket, args.credentials))
    except (UploadIncomplete, StorageError) as e:  # the bucket is still unreachable: try again later
        return errors.finish(errors.NOT_UPLOADED, f"error: {e}")
    except PiconeoxError as e:
        return errors.finish(errors.REFUSED, f"error: {e}")
    return 0


if __name__ == "__main__":
    errors.exit_process(main())
