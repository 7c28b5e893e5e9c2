"""The house rules (docs/house.yaml, docs/development.md "Where things live") hold for the repository, and the
checkers find each kind of break when one is added to a copy of it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import house
from tests.support.house_links import link_breaks, path_breaks

REPO = Path(__file__).resolve().parents[2]


def test_every_module_has_a_row_in_the_map():
    assert house.missing_rows(REPO) == []


def test_every_import_keeps_its_rooms_rule():
    assert house.import_breaks(REPO) == []


def test_files_and_functions_stay_within_their_limits():
    assert house.size_breaks(REPO) == []


def test_tests_and_benchmarks_import_only_the_support_package():
    assert house.test_import_breaks(REPO) == []


def test_the_map_in_the_docs_is_the_one_generated_from_the_rules():
    assert house.map_breaks(REPO) == []


def test_every_relative_link_of_the_pages_resolves():
    assert link_breaks(REPO) == []


def test_every_path_the_pages_name_exists():
    assert path_breaks(REPO) == []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The product, its rules and the map's page, copied once: a tree the checkers pass."""
    tmp_path = tmp_path_factory.mktemp("house")
    for name in ("utils", "configs", "rp2040", "docs", "tests", "benchmarks"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    for path in [*REPO.glob("*.py"), *REPO.glob("*.md")]:
        shutil.copy(path, tmp_path / path.name)
    assert house.missing_rows(tmp_path) == house.import_breaks(tmp_path) == house.size_breaks(tmp_path) == []
    assert house.map_breaks(tmp_path) == house.test_import_breaks(tmp_path) == []
    return tmp_path


@pytest.fixture
def copy(pristine, tmp_path) -> Path:
    """A fresh copy of the pristine tree, to break one rule at a time."""
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_a_module_without_a_row_fails(copy):
    (copy / "utils" / "ckpt" / "newcomer.py").write_text('"""No row in the map."""\n')
    assert house.missing_rows(copy) == ["utils/ckpt/newcomer.py: no row in the map (docs/house.yaml: add it to a "
                                        "room's modules and text)"]


def test_a_row_for_a_module_that_is_gone_fails(copy):
    (copy / "utils" / "diskfull.py").unlink()
    assert "utils/diskfull.py: in the map (room basics) but no such file" in house.missing_rows(copy)


def test_an_import_that_breaks_a_rule_fails(copy):
    lifeline = copy / "utils" / "run" / "lifeline.py"
    lines = lifeline.read_text().splitlines()
    lifeline.write_text("\n".join(lines + ["", "", "def late():", "    from ..ckpt import format  # relative, inside"
                                           " a function", "    import tensorboard", ""]))
    breaks = house.import_breaks(copy)
    assert [b.split(";")[0] for b in breaks] == [
        f"utils/run/lifeline.py:{len(lines) + 4}: imports utils.ckpt.format (room utils/ckpt/format.py)",
        f"utils/run/lifeline.py:{len(lines) + 5}: imports tensorboard"]
    assert breaks[0].endswith("room utils/run/ may import utils/distributed.py, utils/sharding.py, basics, torch, "
                              "accelerate")


def test_utils_importing_configs_or_a_script_fails(copy):
    shards = copy / "utils" / "data" / "shards.py"
    shards.write_text(shards.read_text() + "\nfrom configs.model import ModelConfig  # noqa\nimport train  # noqa\n")
    assert [b.split(" (")[0] for b in house.import_breaks(copy)] == [
        f"utils/data/shards.py:{len(shards.read_text().splitlines()) - 1}: imports configs.model",
        f"utils/data/shards.py:{len(shards.read_text().splitlines())}: imports train"]


def test_a_400_line_module_and_a_long_function_fail(copy):
    body = "\n".join(f"    x{i} = {i}" for i in range(75))
    (copy / "utils" / "lm.py").write_text((copy / "utils" / "lm.py").read_text() + f"\n\ndef long():\n{body}\n"
                                          + "\n" * 400)
    assert [b.split(";")[0] for b in house.size_breaks(copy)] == [
        f"utils/lm.py: {len((copy / 'utils' / 'lm.py').read_text().splitlines())} lines (limit 300)",
        "utils/lm.py::long: 76 lines (limit 70)"]


def test_an_exception_that_no_longer_applies_fails(copy):
    (copy / "train.py").write_text('"""A short story."""\n\n\ndef setup():\n    pass\n')
    assert house.size_breaks(copy) == [
        f"{what}: in size_exceptions but within the limits (or gone): remove the exception"
        for what in ("train.py", "train.py::setup")]


def test_a_test_importing_a_test_module_fails(copy):
    (copy / "tests" / "support" / "paths.py").write_text("REPO = None\n")
    (copy / "tests" / "unit" / "test_a.py").write_text("from tests.support.paths import REPO  # fine\n")
    (copy / "tests" / "unit" / "test_b.py").write_text("def test_b():\n    from .test_a import REPO\n")
    (copy / "tests" / "conftest.py").write_text("from tests.unit import test_a  # noqa\n"
                                                "pytest_plugins = ['tests.support.paths', 'tests.unit.test_b']\n")
    (copy / "benchmarks" / "bench_x.py").write_text("from tests.support import paths\nimport tests.unit.test_a\n")
    assert [b.split(":")[0:2] for b in house.test_import_breaks(copy)] == [
        ["benchmarks/bench_x.py", "2"], ["tests/conftest.py", "1"], ["tests/conftest.py", "2"],
        ["tests/unit/test_b.py", "2"]]


def test_a_stale_map_and_a_broken_link_fail(copy):
    rules, owned = (copy / "docs" / "house.yaml").read_text(), "the one loss, evaluation and sampling"
    assert owned in rules  # a room's `owns`, which the map shows
    (copy / "docs" / "house.yaml").write_text(rules.replace(owned, "the one loss and evaluation"))
    assert house.map_breaks(copy) == ["docs/development.md: the map differs from docs/house.yaml: run "
                                      "`python -m tests.support.house --write`"]
    house.write_map(copy)
    assert house.map_breaks(copy) == []


def test_a_broken_link_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Use `it` elsewhere: GGUF\n\n[ok](docs/a.md#the-a-page) [ok](#use-it-"
                                        "elsewhere-gguf) [ok](docs/)\n")
    (tmp_path / "docs" / "a.md").write_text("# The A page\n\n[gone](nowhere.md) [bad](../README.md#no-such)\n"
                                            "`[code](is-not-a-link.md)` [web](https://example.com)\n\n"
                                            "```\n[in a block](not-a-link.md)\n```\n")
    assert link_breaks(tmp_path) == ["docs/a.md: link nowhere.md: no such file or folder",
                                     "docs/a.md: link ../README.md#no-such: no heading #no-such in README.md"]


def test_a_page_naming_a_moved_file_fails(tmp_path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_here.py").write_text("")
    (tmp_path / "README.md").write_text("Tested by `tests/unit/test_here.py` and tests/test_gone.py; see\n"
                                        "`checkpoints/<run>/step-N/`, `tests/**/test_*.py`, credentials/key.json.\n"
                                        "<!-- tests/test_planned.py -->\n```bash\nbash benchmarks/gone.sh\n```\n")
    assert path_breaks(tmp_path) == ["README.md: names benchmarks/gone.sh: no such file",
                                     "README.md: names tests/test_gone.py: no such file"]
