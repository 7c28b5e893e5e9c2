"""Hostile inputs to every loader: a checkpoint, model folder, dataset, bucket or Pico file that lies
cannot reach outside its folder, hang, bloat or end in a traceback.

Every case runs in one driver process (tests/support/hostile.py) under a memory bound (RLIMIT_AS 3 GiB) and a time bound
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

import pytest

from tests.support import hostile_checkpoints as hc
from tests.support import hostile_folders  # noqa: F401 (registers its cases)
from tests.support import hostile_io  # noqa: F401 (registers its cases)
from tests.support.bounds import bound
from tests.support.hostile import (
    SLOW_CPU_S,
    CASES,
    arm_outside,
    changed,
    error_lines,
    read_outside,
    reads_are_seen,
    run_driver,
    snapshot,
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_data, trained, _emulator_process):
    """Build the base once, every case from it, run them all; {id: (case, result, before, armed, outside before)}."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from rp2040.export import export
    from tests.support.rp2040_models import save_checkpoint

    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(trained, root / "base")  # the session's 10-step run (its cases copy from this copy)
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


@pytest.fixture(scope="module")
def reads_seen(tmp_path_factory) -> bool:
    return reads_are_seen(tmp_path_factory.mktemp("atime"))


@pytest.mark.parametrize("case_id", [pytest.param(c.id, marks=pytest.mark.xfail(strict=False, reason=c.xfail))
                                     if c.xfail else c.id for c in CASES])
def test_a_hostile_input_is_one_line_and_stays_in_its_folder(outcomes, reads_seen, case_id):
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
    if reads_seen:  # else this filesystem records no reads (noatime): the other checks still hold
        assert not read_outside(armed), f"read outside its folder: {read_outside(armed)}\n{where}"
    assert snapshot(folder / "outside", read=False) == outside_before, f"wrote outside its folder\n{where}"
    left = changed(work_before, snapshot(folder / "work"), c.leftovers)
    assert not left, f"left behind or changed: {left}\n{where}"
    if c.check:
        c.check(folder / "work", folder / "outside")


def test_the_suite_is_bounded(outcomes):
    """The bounds hold for the honest work too: no case near the time limit, the driver within its memory."""
    # CPU seconds, not wall-clock ones, which a busy box stretches: the work of every case is far from its limit
    slow = {i: round(o[1]["cpu_s"], 1) for i, o in outcomes.items() if o[1]["cpu_s"] > SLOW_CPU_S}
    assert not slow, slow  # measured: 8.6 s wall for the slowest (the first training run imports its modules)
    # the driver's peak so far after each case (ru_maxrss only grows): name the case that raised it past the bound
    heavy = next(((i, o[1]["maxrss_mb"]) for i, o in outcomes.items() if o[1]["maxrss_mb"] >= 1024), None)
    assert heavy is None, heavy  # measured: 523 MB for all 80 together
    assert len(CASES) >= 60


def test_an_emulator_failure_is_its_reason_in_one_line(tmp_path):
    """Node's own failure (here: a filesystem image that is not there) is its one line, not the source and stack."""
    from rp2040.emulate import RUNNER, node_error, tools_missing

    if tools_missing():
        pytest.skip(tools_missing())
    job = {"firmware": str(tmp_path / "fw.bin"), "bootrom": str(tmp_path / "rom.bin"), "fs": str(tmp_path / "none")}
    (tmp_path / "fw.bin").write_bytes(bytes(256))
    (tmp_path / "rom.bin").write_bytes(bytes(16384))
    proc = subprocess.run(["node", str(RUNNER)], input=__import__("json").dumps(job), capture_output=True, text=True,
                          cwd=RUNNER.parent, timeout=bound(120))
    assert proc.returncode != 0 and len(proc.stderr.splitlines()) > 3, proc.stderr  # a stack, as node prints it
    assert node_error(proc.stderr).startswith("Error: ENOENT: no such file or directory"), proc.stderr
