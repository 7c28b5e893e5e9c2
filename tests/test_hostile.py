"""Hostile inputs to every loader (issue 33): a checkpoint, model folder, dataset, bucket or Pico file that lies
cannot reach outside its folder, hang, bloat or end in a traceback.

Every case runs in one driver process (tests/hostile.py) under a memory bound (RLIMIT_AS 3 GiB) and a time bound
(60 s per case, enforced by faulthandler even inside C code), in-process through the CLI's `main(argv)`. Each case
asserts: the exit code, one `error:` line naming the problem (no traceback), nothing read under its `outside/`
folder (access times), nothing written there, and nothing left in its own folder but the caches it names.

The path rule these cases hold the code to (README, "Loading a checkpoint never runs code from it"): checkpoint,
dataset and local-bucket folders hold regular files only, never symbolic links; every name a marker or `.metadata`
lists is a plain name inside the folder, listed in its COMPLETE marker.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import hostile_cases as hc
from tests.hostile import CASE_S, Case, arm_outside, changed, error_lines, read_outside, run_driver, snapshot
from tests.hostile_cases import SHARD, STEP, copy_model, copy_step, link_out, patch, remark, secret, train_argv, uf2
from tests.test_train import run as train_run
from utils.storage import open_storage

CASES: list[Case] = []


def case(id, message, code=2, **kw):
    def register(build):
        CASES.append(Case(id, build, message, code, **kw))
        return build
    return register


SKIPPED = dict(code=0, leftovers=("*",))  # `--resume auto` passes over a refused step folder (one warning) and
# starts from the newest one it trusts: here none, so it starts fresh
for key, (name_of, loader, message) in hc.MARKER_NAMES.items():
    CASES.append(Case(f"marker-{key}-{loader}", hc.marker_name(name_of, loader), message,
                      **(SKIPPED if loader == "resume-auto" else {})))
for key, (changes_of, loader, message) in hc.METADATA.items():
    CASES.append(Case(f"metadata-{key}-{loader}", hc.metadata(changes_of, loader), message))
for key, (name, loader, kind) in hc.LINKS.items():
    CASES.append(Case(f"link-{key}", hc.linked(name, loader, kind), "is a symbolic link",
                      **(SKIPPED if loader == "resume-auto" else {})))


@case("link-notes-consolidate", "notes.json is a symbolic link")
def _(work, outside, base):  # an unlisted file linked to a secret: was copied into --out
    folder = copy_step(work, base)
    (folder / "notes.json").symlink_to(secret(outside))
    return hc.tool("consolidate", folder, work, base)


@case("consolidate-beside-input", "", code=0, leftovers=("out-hf",))
def _(work, outside, base):  # issue 33 item 9: it wrote (and first deleted) .<name>.weights.tmp beside its input
    folder = copy_step(work, base)
    (folder.with_name(f".{STEP}.weights.tmp")).mkdir()
    (folder.with_name(f".{STEP}.weights.tmp") / "keep.txt").write_text("the user's own folder")
    return hc.tool("consolidate", folder, work, base)


@case("push-notes-link", "no complete step-XXXXXXXX checkpoint to upload")
def _(work, outside, base):  # issue 33 item 7: an unlisted link to a secret was uploaded
    (copy_step(work, base) / "notes.json").symlink_to(secret(outside))
    return push(work)


@case("fifo-unlisted-evaluate", "notes.json is not a regular file")
def _(work, outside, base):
    folder = copy_step(work, base)
    os.mkfifo(folder / "notes.json")
    return hc.tool("evaluate", folder, work, base)


@case("fifo-hf-tokenizer-config-generate", "tokenizer_config.json is not a regular file")
def _(work, outside, base):  # transformers opens every tokenizer file there is: a FIFO would block it
    folder = hc.copy_final(work, base)
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")
    return hc.tool("generate", folder, work, base)


@case("link-step-folders-resume-auto", "", code=0, leftovers=("*",),
      check=lambda work, outside: (assert_real_step(work / "ckpt" / "run" / "step-00000020"),
                                   assert_empty(outside / "trap")))
def _(work, outside, base):  # a planted step-N link: received the next checkpoint; a newer one was resumed from
    copy_step(work, base)
    (outside / "trap").mkdir(parents=True)
    shutil.copytree(base.step, outside / "step-00000030")
    (work / "ckpt" / "run" / "step-00000020").symlink_to(outside / "trap")
    (work / "ckpt" / "run" / "step-00000030").symlink_to(outside / "step-00000030")
    return train_argv(work, base, "--resume", "auto", "--max-steps", "20", "--save-every", "10")


def assert_real_step(folder: Path) -> None:
    from utils.ckpt.format import check_complete

    assert not folder.is_symlink() and check_complete(folder, verify=True) is None


def assert_empty(folder: Path) -> None:
    assert not any(folder.iterdir()), sorted(folder.iterdir())


for name in ("train_00000.npy", "manifest.json", "tokenizer.json"):
    @case(f"link-dataset-{name.split('.')[0]}-train", f"{name} is a symbolic link",
          leftovers=("data/.crc32c-index.json",))
    def _(work, outside, base, name=name):
        data = Path(shutil.copytree(base.data, work / "data"))
        link_out(data, name, outside)
        return train_argv(work, base, data=data)


@case("link-tokenizer-from", "tokenizer.json is a symbolic link")
def _(work, outside, base):
    folder = hc.copy_final(work, base)
    (work / "data").mkdir()  # prepare_data leaves --out-dir behind when it creates it (not this issue's)
    link_out(folder, "tokenizer.json", outside)
    return "prepare_data", ["--name", "d", "--out-dir", str(work / "data"), "--tokenizer-from", str(folder)]


@case("link-export-from-pretrained", "tokenizer.json is a symbolic link")
def _(work, outside, base):
    folder = hc.copy_final(work, base)
    link_out(folder, "tokenizer.json", outside)
    return hc.tool("export", folder, work, base)


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
        from utils.ckpt.remote import cache_dir_for
        from utils.storage.sync import host_dir

        folder = copy_step(work / "upload", base)
        url = f"gs://{base.gcs_bucket}/{work.parent.name}/run"
        change(folder, cache_dir_for(url, host_dir(work / "ckpt" / ".remote-cache")) / STEP, outside)
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
    "vocab-huge": ("model.bin", "vocab", 0xFFFFFFFF, pico_run, "sizes do not match its shape"),
    "tokens-huge": ("vocab.bin", "vocab", 0x7FFFFFFF, pico_run, "counts do not match the file"),
    "merges-huge-emulate": ("vocab.bin", "merges", 0x7FFFFFFF, pico_emulate, "counts do not match the file"),
    "bytes-huge": ("vocab.bin", "bytes", 0x7FFFFFFF, pico_run, "counts do not match the file"),
    "eos-beyond": ("vocab.bin", "eos", 5000, pico_run, "counts do not match the file"),
    "unk-beyond-emulate": ("vocab.bin", "unk", 70000, pico_emulate, "counts do not match the file"),
    "kind-7": ("vocab.bin", 6, 7, pico_run, "counts do not match the file"),
    "offsets-backwards": ("vocab.bin", 32 + 4 * 5, 0xFFFF, pico_run, "token table points outside the file"),
}
for key, (file, field, value, cli, message) in HEADERS.items():
    @case(f"pico-{file.split('.')[0]}-{key}", message)
    def _(work, outside, base, file=file, field=field, value=value, cli=cli):
        model = copy_model(work, base)
        fields = hc.MODEL_FIELDS if file == "model.bin" else hc.VOCAB_FIELDS
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


# --- running them ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_data, _emulator_process):
    """Build the base once, every case from it, run them all; {id: (case, result, before, armed, outside before)}."""
    from accelerate.state import AcceleratorState, GradientState
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from rp2040.export import export
    from tests.rp2040_models import save_checkpoint

    root = tmp_path_factory.mktemp("hostile")
    code, _, _ = train_run(root / "base", tiny_data, "--max-steps", "10", "--save-every", "10", "--eval-every", "10",
                           "--sample-prompt", "")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert code == 0
    export(save_checkpoint("rp2040-speed", root / "pico-ckpt")[0], root / "pico", "int8")
    host, server = _emulator_process
    server.wipe()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", host)
        mp.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket("piconeox-hostile")
        base = hc.Base(root / "base", tiny_data, root / "pico", "piconeox-hostile")
        built = {}
        for c in CASES:
            work, outside = root / c.id / "work", root / c.id / "outside"
            work.mkdir(parents=True)
            outside.mkdir()
            c.module, c.argv = c.build(work, outside, base)
            built[c.id] = (snapshot(work), arm_outside(outside), snapshot(outside, read=False))
        results = run_driver(CASES, root, dict(os.environ))
    return {c.id: (c, results[c.id], root / c.id, *built[c.id]) for c in CASES}


@pytest.mark.parametrize("case_id", [pytest.param(c.id, marks=pytest.mark.xfail(strict=False, reason=c.xfail))
                                     if c.xfail else c.id for c in CASES])
def test_a_hostile_input_is_one_line_and_stays_in_its_folder(outcomes, case_id):
    c, result, folder, work_before, armed, outside_before = outcomes[case_id]
    code, err = result["code"], result["err"]
    where = f"{c.module} {' '.join(map(str, c.argv))[:300]}: exit {code} after {result['s']:.1f} s\n{err[-3000:]}"
    assert code == c.code and "Traceback" not in err, where
    if c.code == 2:  # a refusal: one line, and it names the problem
        lines = error_lines(err)
        assert len(lines) == 1 and c.message in lines[0], where
        if c.module != "train":  # train.py logs its progress; a tool says nothing but the one line
            assert len(err.strip().splitlines()) == 1, where
    elif c.code == 0:  # a refusal that is a warning: the loader went on without the hostile input
        assert not error_lines(err) and c.message in err, where
    elif c.code == 1:  # some files refused, each on a `failed:` line, the others transferred
        assert any(line.startswith("failed: ") and c.message in line for line in err.splitlines()), where
    assert not read_outside(armed), f"read outside its folder: {read_outside(armed)}\n{where}"
    assert snapshot(folder / "outside", read=False) == outside_before, f"wrote outside its folder\n{where}"
    left = changed(work_before, snapshot(folder / "work"), c.leftovers)
    assert not left, f"left behind or changed: {left}\n{where}"
    if c.check:
        c.check(folder / "work", folder / "outside")


def test_the_suite_is_bounded(outcomes):
    """The bounds hold for the honest work too: no case near the time limit, the driver within its memory."""
    slow = {i: round(o[1]["s"], 1) for i, o in outcomes.items() if o[1]["s"] > CASE_S / 4}
    assert not slow, slow  # measured: 8.6 s for the slowest (the first training run imports its modules)
    assert max(o[1]["maxrss_mb"] for o in outcomes.values()) < 1024  # measured: 523 MB for all 80 together
    assert len(CASES) >= 60


def test_an_emulator_failure_is_its_reason_in_one_line(tmp_path):
    """Node's own failure (here: a filesystem image that is not there) is its one line, not the source and stack."""
    from rp2040.emulate import RUNNER, node_error

    if shutil.which("node") is None:
        pytest.skip("node is not installed (./setup.sh --dev installs the emulator's tools)")
    job = {"firmware": str(tmp_path / "fw.bin"), "bootrom": str(tmp_path / "rom.bin"), "fs": str(tmp_path / "none")}
    (tmp_path / "fw.bin").write_bytes(bytes(256))
    (tmp_path / "rom.bin").write_bytes(bytes(16384))
    proc = subprocess.run(["node", str(RUNNER)], input=__import__("json").dumps(job), capture_output=True, text=True,
                          cwd=RUNNER.parent, timeout=60)
    assert proc.returncode != 0 and len(proc.stderr.splitlines()) > 3, proc.stderr  # a stack, as node prints it
    assert node_error(proc.stderr).startswith("Error: ENOENT: no such file or directory"), proc.stderr
