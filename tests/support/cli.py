"""Table-driven CLI cases: many Python CLIs' `main(argv)` in one interpreter, a CLI called in the test's own
process, and the one-error-line contract."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.bounds import bound
from tests.support.paths import REPO

DRIVER = r"""
import contextlib, importlib, io, json, sys, traceback
results = []
for module, argv in json.load(sys.stdin):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def run_cli_cases(cases, cwd):
    """[(module, argv)] -> [(exit code, stderr)], all in one interpreter started in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(cases), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def call_cli(capfd, module: str, *args) -> subprocess.CompletedProcess:
    """`python <module> args` as a call of its main in this process (what the command runs, without a process start):
    the exit code and what it wrote to the file descriptors 1 and 2, as a subprocess would give them."""
    capfd.readouterr()
    try:
        code = importlib.import_module(module).main([str(a) for a in args])
    except SystemExit as e:  # argparse's refusals
        code = e.code
    return subprocess.CompletedProcess(["python", "-m", module, *map(str, args)], code, *capfd.readouterr())


def assert_one_error_line(code, err, message, context=""):
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, f"{context}: exit {code}\n{err}"
    assert len(lines) == 1 and message in lines[0], f"{context}: expected one error line with {message!r}\n{err}"


def binary_file(path):
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00")
    return str(path)


def assert_error_line(err: str, *words: str) -> None:
    """`err` holds exactly one line starting `error: `, with each of `words`, and no traceback (any exit code)."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert all(w in lines[0] for w in words), lines[0]


def files_and_bytes(folder) -> dict:
    """Every path under `folder`, with a file's bytes (False for a folder): compared before and after a table."""
    return {p: p.is_file() and p.read_bytes() for p in Path(folder).rglob("*")}


def assert_cli_table(cases, cwd) -> None:
    """[(module, argv, message)] run in one interpreter in `cwd`: each case exits 2 with one `error:` line holding
    its message and no traceback (a `--bogus` flag: that line alone, not argparse's usage block above it), and
    nothing under `cwd` is written or changed. Every case that fails is named, not only the first."""
    before = files_and_bytes(cwd)
    results = run_cli_cases([(module, argv) for module, argv, _ in cases], cwd)
    failed = []
    for (module, argv, message), (code, err) in zip(cases, results):
        try:
            assert_one_error_line(code, err, message, f"{module} {' '.join(argv)[:200]}")
            if "--bogus" in argv:
                assert len(err.strip().splitlines()) == 1, f"{module} --bogus:\n{err}"
        except AssertionError as e:
            failed.append(str(e))
    assert not failed, "\n\n".join(failed)
    assert files_and_bytes(cwd) == before  # nothing written or changed


def wrong_crc_copy(data, dest):
    """A copy of the prepared dataset `data` at `dest` whose manifest's first crc32c does not match its shard."""
    import shutil

    shutil.copytree(data, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["shards"][0]["crc32c"] ^= 1
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest
