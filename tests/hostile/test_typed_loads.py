"""Every value a load takes from a checkpoint has the type (for a tensor, the dtype and shape) that a run writes
there, whatever the loader: resume, consolidate, --init-from, generate, evaluate, to_gguf, export. A record of a
`.distcp` replaced by a pickled tuple (within every bound of the reader) reached torch's fused AdamW (a TypeError
traceback) or DCP's narrowing (an AttributeError); now each kind of record is refused in one line naming the file
and the key, exit 2, and nothing is written.

The cases (tests/support/hostile_types.py) run in one driver process under the hostile tier's bounds
(tests/support/hostile.py)."""
from __future__ import annotations

import io
import os
import shutil

import pytest

from tests.support.hostile import changed, error_lines, run_driver, snapshot
from tests.support.hostile_checkpoints import Base
from tests.support.hostile_types import TYPED_CASES, nested_tuples
from tests.support.payloads import torch_bytes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_data, trained):
    root = tmp_path_factory.mktemp("typed")
    shutil.copytree(trained, root / "base")
    base = Base(root / "base", tiny_data, root / "no-pico", "no-bucket")
    before = {}
    for c in TYPED_CASES:
        work, outside = root / c.id / "work", root / c.id / "outside"
        work.mkdir(parents=True)
        outside.mkdir()
        c.module, c.argv = c.build(work, outside, base)
        before[c.id] = snapshot(work)
    results = run_driver(TYPED_CASES, root, dict(os.environ))
    return {c.id: (c, results[c.id], root / c.id / "work", before[c.id]) for c in TYPED_CASES}


def test_the_tuple_is_the_one_the_issue_names():
    """About 350 KB of nested tuples: large, and within every bound of the pickle walk (1 MiB a value)."""
    from utils.ckpt.untrusted.bounded import check_torch_zip

    data = torch_bytes(nested_tuples())
    assert 300_000 < len(data) < 1 << 20
    check_torch_zip(io.BytesIO(data), "the tuple")  # passes: only its type is wrong


@pytest.mark.parametrize("case_id", [c.id for c in TYPED_CASES])
def test_a_value_of_the_wrong_type_is_one_line_naming_the_file_and_key(outcomes, case_id):
    c, result, work, before = outcomes[case_id]
    code, err = result["code"], result["err"]
    where = f"{c.module} {' '.join(map(str, c.argv))[:300]}: exit {code}\n{err[-3000:]}"
    lines = error_lines(err)
    assert code == 2 and "Traceback" not in err and len(lines) == 1, where
    assert c.message in lines[0] and ("step-00000010" in lines[0] or "/hf" in lines[0]), where
    if c.module != "train":  # a tool says nothing but its one line
        assert len(err.strip().splitlines()) == 1, where
    left = changed(before, snapshot(work), c.leftovers)
    assert not left, f"left behind or changed: {left}\n{where}"
