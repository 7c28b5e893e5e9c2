"""The order of the house (docs/house.yaml): floors, arrows with reasons, doors, no import cycles, every top-level
folder of Python claimed, no imports hidden from the rules. Each break is added alone to a copy of the product
and its rules, and the check that owns it names it in one line."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import house
from tests.support.house_order import order_breaks

REPO = Path(__file__).resolve().parents[2]


def all_breaks(root: Path) -> list[str]:
    rules = house.load_rules(root)
    return (order_breaks(rules) + house.place_breaks(root, rules) + house.missing_rows(root, rules)
            + house.import_breaks(root, rules) + house.cycle_breaks(root, rules))


def test_the_rooms_keep_their_order_and_no_files_import_each_other():
    rules = house.load_rules(REPO)
    assert order_breaks(rules) == []
    assert house.cycle_breaks(REPO, rules) == []
    assert house.place_breaks(REPO, rules) == []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The product and its rules, copied once: a tree every check passes."""
    root = tmp_path_factory.mktemp("house")
    for name in ("utils", "configs", "rp2040", "docs"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    for path in REPO.glob("*.py"):
        shutil.copy(path, root / path.name)
    (root / "tests").mkdir()  # claimed as not product: its Python is never a room's
    (root / "tests" / "test_x.py").write_text("import importlib\nimportlib.import_module('utils.lm')\n")
    assert all_breaks(root) == []
    return root


@pytest.fixture
def tree(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return tmp_path


def append(path: Path, *lines: str) -> int:
    """Append `lines` to `path`; the line number of the first."""
    text = path.read_text()
    path.write_text(text + "\n" + "\n".join(lines) + "\n")
    return len(text.splitlines()) + 2


def test_a_new_top_level_folder_of_python_is_refused(tree):
    (tree / "kube").mkdir()
    (tree / "kube" / "launcher.py").write_text("from utils.ckpt.format import find_checkpoint  # noqa\n")
    assert all_breaks(tree) == [
        "kube/: a top-level folder holding Python (kube/launcher.py) that no room claims; name it in docs/house.yaml "
        "places (product, with rows for its modules, or not_product with its reason)"]


def test_an_import_through_importlib_is_refused(tree):
    gcs = tree / "utils" / "storage" / "gcs.py"
    line = append(gcs, "import importlib  # noqa: E402", "", "", "def late(name):",
                  '    importlib.import_module("utils.ckpt.format")', "    __import__(name)")
    assert all_breaks(tree) == [
        f"utils/storage/gcs.py:{line + 4}: imports utils.ckpt.format through import_module(), which the house rules "
        "cannot follow; use an import statement",
        f"utils/storage/gcs.py:{line + 5}: imports a module named at run time through __import__(), which the house "
        "rules cannot follow; use import statements"]


def test_an_import_cycle_is_refused_also_when_the_arrow_is_allowed(tree):
    fmt = tree / "utils" / "ckpt" / "format.py"
    line = append(fmt, "from utils.ckpt import checkpointer  # noqa: E402,F401")
    cycle = ("import cycle: utils/ckpt/checkpointer.py:26 -> utils/ckpt/format.py:{} -> utils/ckpt/checkpointer.py "
             "(files that import each other; move what they share below both)")
    assert house.cycle_breaks(tree) == [cycle.format(line)]
    assert [b.split(";")[0] for b in house.import_breaks(tree)] == [  # and the arrow up, by the rule of its room
        f"utils/ckpt/format.py:{line}: imports utils.ckpt.checkpointer (room utils/ckpt/)"]
    # allowed by the rules, the cycle is refused all the same
    rules = house.load_rules(tree)
    next(r for r in rules["rooms"] if r["name"] == "utils/ckpt/format.py")["modules"].remove("utils/ckpt/format.py")
    next(r for r in rules["rooms"] if r["name"] == "utils/ckpt/")["modules"].append("utils/ckpt/format.py")
    assert house.cycle_breaks(tree, rules) == [cycle.format(line)]


def test_a_cycle_inside_one_room_through_a_late_import_is_refused(tree):
    index_check = tree / "utils" / "ckpt" / "untrusted" / "index_check.py"
    line = append(index_check, "", "", "def late():", "    from utils.ckpt.untrusted.safe_load import load_dcp  # noqa",
                  "    return load_dcp")
    assert house.import_breaks(tree) == []  # one room: its rule allows it
    assert house.cycle_breaks(tree) == [
        f"import cycle: utils/ckpt/untrusted/index_check.py:{line + 3} -> utils/ckpt/untrusted/safe_load.py:31 -> "
        "utils/ckpt/untrusted/index_check.py (files that import each other; move what they share below both)"]


def edit_rules(tree: Path, old: str, new: str) -> None:
    rules = tree / "docs" / "house.yaml"
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, new))


def test_an_arrow_up_the_order_and_one_without_its_reason_are_refused(tree):
    edit_rules(tree, "      utils/storage/: a dataset in a bucket is synced through the storage protocol\n",
               "      utils/storage: a dataset in a bucket is synced through the storage protocol\n"
               "      utils/ckpt/: the loader reads checkpoints\n      utils/report/:\n")
    assert order_breaks(house.load_rules(tree)) == [
        "room utils/data/: may_import utils/storage, which is no room",
        "room utils/data/ (floor 4) may import utils/ckpt/ (floor 7): the arrow points up the order; a room imports "
        "only rooms on lower floors",
        "room utils/data/: may_import utils/report/ has no reason; say why the arrow exists"]


def test_a_reader_past_the_read_door_is_refused(tree):
    generate = tree / "utils" / "generate.py"
    line = append(generate, "from utils.ckpt.load import load_model  # noqa: E402,F401",
                  "from utils.ckpt.read import load_model as also  # noqa: E402,F401")
    assert all_breaks(tree) == [
        f"utils/generate.py:{line}: imports utils.ckpt.load, behind the doors of room utils/ckpt/: other rooms import "
        "only utils.ckpt.checkpointer, utils.ckpt.read, utils.ckpt.write"]


def test_the_untrusted_loader_has_one_door(tree):
    load = tree / "utils" / "ckpt" / "load.py"
    line = append(load, "from utils.ckpt.untrusted.pickle_walk import pickle_cost  # noqa: E402,F401")
    assert all_breaks(tree) == [
        f"utils/ckpt/load.py:{line}: imports utils.ckpt.untrusted.pickle_walk, behind the doors of room "
        "utils/ckpt/untrusted/: other rooms import only utils.ckpt.untrusted.safe_load"]
