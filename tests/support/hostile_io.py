"""The bucket, push, gs:// resume and Pico cases of test_hostile.py (helpers: hostile_checkpoints.py)."""
from __future__ import annotations

import binascii
import shutil
import struct
from pathlib import Path

import pytest

from tests.support import hostile_checkpoints as hc
from tests.support.hostile import case, oversize
from tests.support.hostile_checkpoints import SHARD, STEP, Base, copy_step, link_out, remark, secret, train_argv
from utils.storage import open_storage

# --- the rp2040 files ------------------------------------------------------------------------------------------

def copy_model(work: Path, base: Base) -> Path:
    shutil.copytree(base.pico, work / "model")
    return work / "model"


def patch(path: Path, offset: int, value: int, fmt: str = "<I") -> None:
    """Change one header field and recompute the trailing CRC-32: the file is whole, its header lies."""
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    struct.pack_into("<I", data, len(data) - 4, binascii.crc32(bytes(data[:-4])) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))


# model.bin header: magic 0, version 4, dtype 6, flags 7, vocab 8, hidden 12, layers 16, heads 20, inter 24,
# context 28, rotary dims 32. vocab.bin: vocab 8, merges 12, eos 16, unk 20, bytes 24, kind 6 (one byte).
MODEL_FIELDS = {"vocab": 8, "hidden": 12, "layers": 16, "heads": 20, "inter": 24, "context": 28, "rotary": 32}
VOCAB_FIELDS = {"vocab": 8, "merges": 12, "eos": 16, "unk": 20, "bytes": 24}


def uf2(blocks: list[dict]) -> bytes:
    """UF2 blocks for the RP2040 family; each dict may override address, size, number, count."""
    from rp2040 import uf2 as u

    out = b""
    for i, b in enumerate(blocks):
        fields = (b.get("address", 0x10000000 + 256 * i), b.get("size", 256), b.get("number", i),
                  b.get("count", len(blocks)))
        head = struct.pack("<8I", u.MAGIC_START0, u.MAGIC_START1, u.FLAG_FAMILY_ID, *fields, u.RP2040_FAMILY)
        out += head + bytes(476) + struct.pack("<I", u.MAGIC_END)
    return out


# --- buckets: download_training_data.py (a local folder or gs:// as the bucket) and push_checkpoint ------------------
def download(bucket, dest) -> tuple[str, list[str]]:
    return "download_training_data", ["--source", str(bucket), "--dest", str(dest), "--quiet"]


def no_secret_under(folder: Path) -> None:
    assert not any(p.is_file() and b"TOP SECRET" in p.read_bytes() for p in folder.rglob("*") if not p.is_symlink())


@case("bucket-file-link-download", "extra.txt", code=1, leftovers=("dest",), check=lambda w, o: no_secret_under(w))
def _(work, outside, base):
    bucket = Path(shutil.copytree(base.data, work / "bucket"))
    (bucket / "extra.txt").symlink_to(secret(outside))
    return download(bucket, work / "dest")


@case("bucket-folder-link-download", "sub", code=1, leftovers=("dest",), check=lambda w, o: no_secret_under(w))
def _(work, outside, base):
    bucket = Path(shutil.copytree(base.data, work / "bucket"))
    secret(outside / "dir")
    (bucket / "sub").symlink_to(outside / "dir")
    return download(bucket, work / "dest")


@case("bucket-manifest-link-download", "manifest.json", code=1, leftovers=("dest",))
def _(work, outside, base):
    bucket = Path(shutil.copytree(base.data, work / "bucket"))
    link_out(bucket, "manifest.json", outside)
    return download(bucket, work / "dest")


@case("dest-file-link-download", "tokenizer.json is a symbolic link", code=1, leftovers=("dest",))
def _(work, outside, base):  # a link planted in the destination: read to compare, then written through
    dest = work / "dest"
    dest.mkdir(parents=True)
    shutil.copy(base.data / "tokenizer.json", outside / "tokenizer.json")
    (dest / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    return download(base.data, dest)


@case("dest-folder-link-download", "sub is a symbolic link", code=1, leftovers=("dest",))
def _(work, outside, base):
    bucket = Path(shutil.copytree(base.data, work / "bucket"))
    (bucket / "sub").mkdir()
    (bucket / "sub" / "a.txt").write_text("into the link")
    (work / "dest").mkdir()
    (outside / "dir").mkdir(parents=True)
    (work / "dest" / "sub").symlink_to(outside / "dir")
    return download(bucket, work / "dest")


@case("push-dataset-link", "notes.txt", code=1, leftovers=("bucket",), check=lambda w, o: no_secret_under(w / "bucket"))
def _(work, outside, base):
    data = Path(shutil.copytree(base.data, work / "data"))
    (data / "notes.txt").symlink_to(secret(outside))
    return "download_training_data", ["--push", str(data), "--dest", str(work / "bucket"), "--quiet"]


for name in ("data//evil.txt", "data//tmp/evil.txt"):
    @case(f"gcs-name-{name.count('/')}-slashes-download", "refusing object name", code=1, leftovers=("dest",))
    def _(work, outside, base, name=name):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        store = open_storage(f"gs://{base.gcs_bucket}/{work.parent.name}")
        for path in base.data.iterdir():
            store.put(path, f"data/{path.name}")
        bucket = storage.Client(project="test", credentials=AnonymousCredentials()).bucket(base.gcs_bucket)
        bucket.blob(f"{work.parent.name}/{name}").upload_from_string(b"escaped")  # past our own name guard
        return download(f"gs://{base.gcs_bucket}/{work.parent.name}/data", work / "dest")


def push(work) -> tuple[str, list[str]]:
    return "utils.push_checkpoint", [str(work / "ckpt" / "run"), "--checkpoint-bucket", str(work / "bucket")]


def pushed(work) -> set[str]:
    return {p.relative_to(work / "bucket").as_posix() for p in (work / "bucket").rglob("*") if p.is_file()}


@case("push-unlisted-file", "", code=0, leftovers=("bucket",),
      check=lambda w, o: not any("notes" in n for n in pushed(w)) or pytest.fail(f"uploaded: {pushed(w)}"))
def _(work, outside, base):
    (copy_step(work, base) / "notes.txt").write_text("mine, not the checkpoint's")
    return push(work)


@case("push-notes-link", "no complete step-XXXXXXXX checkpoint to upload")
def _(work, outside, base):  # an unlisted link to a secret was once uploaded
    (copy_step(work, base) / "notes.json").symlink_to(secret(outside))
    return push(work)


@case("push-listed-link", "no complete step-XXXXXXXX checkpoint to upload")
def _(work, outside, base):
    link_out(copy_step(work, base), SHARD, outside)
    return push(work)


@case("push-step-link", "", code=0, leftovers=("bucket",),
      check=lambda w, o: {n.split("/")[1] for n in pushed(w)} == {STEP} or pytest.fail(f"uploaded: {pushed(w)}"))
def _(work, outside, base):  # a newer complete step outside, linked in: not the run's
    copy_step(work, base)
    shutil.copytree(base.step, outside / "step-00000020")
    (work / "ckpt" / "run" / "step-00000020").symlink_to(outside / "step-00000020")
    return push(work)


@case("push-marker-dotdot", "no complete step-XXXXXXXX checkpoint to upload")
def _(work, outside, base):
    folder = copy_step(work, base)
    s = secret(outside)
    remark(folder, {hc.relative(folder, s): hc.entry(s)})
    return push(work)


# --- resume from gs:// (the GCS emulator): the folder downloaded into the cache is then refused ------------------
def to_bucket(folder: Path, url: str) -> None:
    remote = open_storage(url).child(folder.name)
    for path in sorted(folder.iterdir(), key=lambda p: p.name == "COMPLETE"):  # the marker last
        remote.put(path, path.name)


GCS_RESUMES = {  # id: (change to the step folder given the cache folder it lands in, expected)
    "marker-dotdot": (lambda f, c, o: remark(f, {hc.relative(c, secret(o)): hc.entry(o / "secret.txt")}),
                      "'..' segment"),
    "marker-newline": (lambda f, c, o: remark(f, {"x\nerror: forged": {"size": 1, "crc32c": 1}}), "control character"),
    "metadata-absolute": (lambda f, c, o: hc.edit_metadata(f, relative_path=str(hc.shard_copy(f, o))),
                          "refused to load"),
    "metadata-dotdot": (lambda f, c, o: hc.edit_metadata(f, relative_path=hc.relative(c, hc.shard_copy(f, o))),
                        "'..' segment"),
}
for key, (change, message) in GCS_RESUMES.items():
    @case(f"gcs-resume-{key}", message, leftovers=("ckpt/.remote-cache",))
    def _(work, outside, base, change=change):
        from utils.ckpt.bucket.remote import cache_dir_for
        from utils.run.allocation import machine_folder

        folder = copy_step(work / "upload", base)
        url = f"gs://{base.gcs_bucket}/{work.parent.name}/run"
        change(folder, cache_dir_for(url, machine_folder(work / "ckpt" / ".remote-cache")) / STEP, outside)
        to_bucket(folder, url)
        shutil.rmtree(work / "upload")
        return train_argv(work, base, "--resume", url)


# --- the Pico's files: lying model.bin / vocab.bin headers (CRC recomputed) and UF2 fields ------------------------
def pico_run(model: Path) -> tuple[str, list[str]]:
    return "rp2040.run", [str(model), "--prompt", "hi", "--max-new-tokens", "2"]


def pico_emulate(model: Path, firmware: Path | None = None) -> tuple[str, list[str]]:
    return "rp2040.emulate", [str(model), "--tokens", "1"] + (["--firmware", str(firmware)] if firmware else [])


HEADERS = {  # id: (file, field, value, CLI, expected)
    "heads-0": ("model.bin", "heads", 0, pico_run, "heads = 0"),
    "heads-0-emulate": ("model.bin", "heads", 0, pico_emulate, "heads = 0"),
    "heads-3": ("model.bin", "heads", 3, pico_run, "does not hold together"),
    "rotary-odd": ("model.bin", "rotary", 3, pico_run, "does not hold together"),
    "layers-0": ("model.bin", "layers", 0, pico_run, "layers = 0"),
    "context-0-emulate": ("model.bin", "context", 0, pico_emulate, "context = 0"),
    "vocab-huge": ("model.bin", "vocab", 0xFFFFFFFF, pico_run, "more than the format allows (65,536)"),
    "tokens-huge": ("vocab.bin", "vocab", 0x7FFFFFFF, pico_run, "the format allows 65,536 tokens"),
    "merges-huge-emulate": ("vocab.bin", "merges", 0x7FFFFFFF, pico_emulate, "counts do not match the file"),
    "bytes-huge": ("vocab.bin", "bytes", 0x7FFFFFFF, pico_run, "of at most 64 bytes each"),
    "eos-beyond": ("vocab.bin", "eos", 5000, pico_run, "counts do not match the file"),
    "unk-beyond-emulate": ("vocab.bin", "unk", 70000, pico_emulate, "counts do not match the file"),
    "kind-7": ("vocab.bin", 6, 7, pico_run, "counts do not match the file"),
    "offsets-backwards": ("vocab.bin", 32 + 4 * 5, 0xFFFF, pico_run, "token table points outside the file"),
}
for key, (file, field, value, cli, message) in HEADERS.items():
    @case(f"pico-{file.split('.')[0]}-{key}", message)
    def _(work, outside, base, file=file, field=field, value=value, cli=cli):
        model = copy_model(work, base)
        fields = MODEL_FIELDS if file == "model.bin" else VOCAB_FIELDS
        offset = field if isinstance(field, int) else fields[field]
        patch(model / file, offset, value, "<B" if field == 6 else "<I")
        return cli(model)


UF2 = {  # id: (blocks, expected)
    "payload-1000": ([{"size": 1000}], "a payload of 1000 bytes"),
    "address-in-sram": ([{"address": 0x20000000}], "outside the Pico's 2 MiB of flash"),
    "address-past-flash": ([{"address": 0x10000000 + (2 << 20) - 100}], "outside the Pico's 2 MiB of flash"),
    "address-wraps": ([{"address": 0xFFFFFF00, "size": 400}], "outside the Pico's 2 MiB of flash"),
    "number-beyond-count": ([{}, {"number": 7}], "block number 7 of 2"),
    "count-lies": ([{"count": 1000}], "block number 0 of 1000 in a file of 1 blocks"),
}
for key, (blocks, message) in UF2.items():
    @case(f"uf2-{key}-emulate", message)
    def _(work, outside, base, blocks=blocks):
        (work / "fw.uf2").write_bytes(uf2(blocks))
        return pico_emulate(copy_model(work, base), work / "fw.uf2")


@case("firmware-bin-20mib-emulate", "does not fit the Pico's 2 MiB of flash")
def _(work, outside, base):
    with open(work / "fw.bin", "wb") as f:
        f.truncate(20 << 20)  # sparse: nothing to write
    return pico_emulate(copy_model(work, base), work / "fw.bin")


# --- JSON files of any size: every reader stats before it reads (utils.textfile.MAX_JSON_BYTES) ---------------------
@case("pico-config-oversize-reference", "allowed for this file")
def _(work, outside, base):
    model = copy_model(work, base)
    oversize(model / "config.json")
    (work / "text.txt").write_text("Once upon a time there was a test.\n")
    return "rp2040.reference", [str(model), "--text", str(work / "text.txt")]


@case("crc-index-oversize-download", "", code=0, leftovers=("dest",),
      check=lambda w, o: (w / "dest" / ".crc32c-index.json").stat().st_size < 1 << 20)
def _(work, outside, base):
    """A planted index is only a cache: an oversized one is rebuilt, never read (2 GiB: read whole, then decoded, it
    is past the driver's 3 GiB address-space bound)."""
    from utils.crc import INDEX_NAME

    (work / "dest").mkdir()
    (work / "dest" / INDEX_NAME).write_text("{}")
    oversize(work / "dest" / INDEX_NAME, 2 << 30)
    return download(base.data, work / "dest")
