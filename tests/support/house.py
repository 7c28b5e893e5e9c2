"""The house rules as functions of a repository root: each returns what breaks a rule, one line per break.

The rules live in docs/house.yaml (rooms, what each may import, size limits and their named exceptions); the map
of modules in docs/development.md is generated from it (`python -m tests.support.house --write`). Imports are read
with `ast` (`import x`, `from x import y`, relative ones resolved, also those inside functions), nothing is run.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

import yaml

RULES = Path("docs/house.yaml")
MAP_PAGE = Path("docs/development.md")
MAP_BEGIN = "<!-- house map: generated from docs/house.yaml by `python -m tests.support.house --write` -->"
MAP_END = "<!-- end of the house map -->"
PRODUCT_DIRS = ("utils", "configs", "rp2040")
SKIP_PARTS = {"node_modules", ".venv", "__pycache__", ".git", ".cache"}


def load_rules(root: Path) -> dict:
    return yaml.safe_load((root / RULES).read_text(encoding="utf-8"))


def _py_files(folder: Path) -> list[Path]:
    """The .py files under `folder`, not descending into SKIP_PARTS (rp2040/node_modules is large)."""
    found = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in SKIP_PARTS and not d.startswith(".")]
        found += [Path(here) / f for f in files if f.endswith(".py")]
    return sorted(found)


def product_modules(root: Path) -> list[str]:
    """Every product module as a path relative to `root`: the top-level scripts and each .py under PRODUCT_DIRS."""
    files = sorted(root.glob("*.py")) + [p for d in PRODUCT_DIRS if (root / d).is_dir() for p in _py_files(root / d)]
    return [p.relative_to(root).as_posix() for p in files]


def room_of(rules: dict) -> dict[str, dict]:
    """Module path -> its room (the first room listing it)."""
    found: dict[str, dict] = {}
    for room in rules["rooms"]:
        for path in room["modules"]:
            found.setdefault(path, room)
    return found


def _init_room(path: str, rooms: dict[str, dict]) -> dict | None:
    """A package's __init__.py belongs to the one room holding its folder's modules (None: several or none)."""
    folder = path.rsplit("/", 1)[0] + "/"
    names = {r["name"]: r for p, r in rooms.items() if p.startswith(folder) and "/" not in p[len(folder):]}
    return next(iter(names.values())) if len(names) == 1 else None


def _mentions(room: dict) -> set[str]:
    """The identifiers named in backticks in a room's place and owns text."""
    text = f"{room['place']} {room['owns']}"
    return {word for span in re.findall(r"`([^`]+)`", text) for word in re.findall(r"\w+", span)}


def missing_rows(root: Path, rules: dict | None = None) -> list[str]:
    """Modules without a row (or in two), rows naming modules that do not exist, rows that do not name theirs."""
    rules = rules or load_rules(root)
    rooms, breaks = room_of(rules), []
    for room in rules["rooms"]:
        mentioned = _mentions(room)
        for path in room["modules"]:
            if rooms[path] is not room:
                breaks.append(f"{path}: listed in two rooms, {rooms[path]['name']} and {room['name']}")
            if not (root / path).is_file():
                breaks.append(f"{path}: in the map (room {room['name']}) but no such file")
            if Path(path).stem not in mentioned:
                breaks.append(f"{path}: room {room['name']} lists it but its text never names `{Path(path).stem}`")
    for path in product_modules(root):
        if path not in rooms and not path.endswith("__init__.py"):  # an __init__.py: see import_breaks
            breaks.append(f"{path}: no row in the map ({RULES}: add it to a room's modules and text)")
    return breaks


def _dotted(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _module_index(root: Path) -> dict[str, str]:
    """Dotted module name -> path, for every .py of the repository."""
    return {_dotted(p.relative_to(root).as_posix()): p.relative_to(root).as_posix() for p in _py_files(root)}


def imported_names(source: str, path: str, index: dict[str, str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, anywhere in the file; `from a import b` gives `a.b` when
    that is a module of `index`, else `a`; relative imports are resolved against `path`."""
    package = _dotted(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                names.append((node.lineno, full if full in index or not module else module))
    return names


def _target(name: str, index: dict[str, str]) -> str | None:
    """The file a dotted import name lands in: the longest prefix that is a module."""
    parts = name.split(".")
    while parts and ".".join(parts) not in index:
        parts.pop()
    return index[".".join(parts)] if parts else None


def import_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Imports of project modules and third-party packages that a module's room does not allow."""
    rules = rules or load_rules(root)
    rooms, index = room_of(rules), _module_index(root)
    local = {name.split(".")[0] for name in index}
    breaks = []
    for path in product_modules(root):
        room = rooms.get(path) or (_init_room(path, rooms) if path.endswith("__init__.py") else None)
        allowed = set(room["may_import"]) | set(rules["everyone_may_import"]) | {room["name"]} if room else set()
        names = imported_names((root / path).read_text(encoding="utf-8"), path, index)
        packages = set(room["packages"]) if room else set()
        for line, name in names:
            top = name.split(".")[0]
            if top not in local | packages | set(sys.stdlib_module_names) and "*" not in packages:
                breaks.append(f"{path}:{line}: imports {top}; room {room['name'] if room else '(none)'} may import "
                              f"{_allowed_text(room, rules)}")
            if top not in local or (target := _target(name, index)) is None:
                continue
            if target.startswith(("tests/", "benchmarks/")):
                breaks.append(f"{path}:{line}: imports {name}: product code never imports tests or benchmarks")
                continue
            to = rooms.get(target) or (_init_room(target, rooms) if target.endswith("__init__.py") else None)
            if to is not None and (to["name"] in allowed or "*" in allowed):
                continue
            where = f"room {to['name']}" if to else "no room"
            breaks.append(f"{path}:{line}: imports {_dotted(target)} ({where}); room "
                          f"{room['name'] if room else '(none)'} may import {_allowed_text(room, rules)}")
    return sorted(set(breaks))


def _allowed_text(room: dict | None, rules: dict) -> str:
    if room is None:
        return "nothing of the project"
    rooms = [*room["may_import"], *rules["everyone_may_import"]]
    return ", ".join(rooms + room["packages"]) or "only the standard library"


def size_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Files over the line limit and functions over theirs that size_exceptions do not name, and exceptions that
    no longer apply (or name nothing)."""
    rules = rules or load_rules(root)
    limits = rules["limits"]
    excused = {e["what"] for e in rules["size_exceptions"]}
    paths = product_modules(root) + [p.relative_to(root).as_posix() for d in ("tests", "benchmarks")
                                     if (root / d).is_dir() for p in _py_files(root / d)]
    over = set()
    for path in paths:
        source = (root / path).read_text(encoding="utf-8")
        if len(source.splitlines()) > limits["file_lines"]:
            over.add((path, f"{len(source.splitlines())} lines (limit {limits['file_lines']})"))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limits["function_lines"]:
                    over.add((f"{path}::{node.name}", f"{length} lines (limit {limits['function_lines']})"))
    breaks = [f"{what}: {size}; shorten it, or name it in {RULES} size_exceptions with its reason"
              for what, size in sorted(over) if what not in excused]
    breaks += [f"{what}: in size_exceptions but within the limits (or gone): remove the exception"
               for what in sorted(excused - {what for what, _ in over})]
    return breaks


def _plugins(source: str) -> list[tuple[int, str]]:
    """The modules a conftest loads by name: `pytest_plugins = [...]`."""
    return [(node.lineno, item.value) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets)
            for item in ast.walk(node.value) if isinstance(item, ast.Constant) and isinstance(item.value, str)]


def test_import_breaks(root: Path) -> list[str]:
    """Test modules (tests/**/test_*.py, conftest.py) and benchmarks import from `tests` only `tests.support`
    (also the plugins a conftest names)."""
    index = _module_index(root)
    paths = [p.relative_to(root).as_posix() for p in _py_files(root / "tests")
             if p.name.startswith("test_") or p.name == "conftest.py"] if (root / "tests").is_dir() else []
    paths += [p.relative_to(root).as_posix() for p in _py_files(root / "benchmarks")] \
        if (root / "benchmarks").is_dir() else []
    breaks = []
    for path in paths:
        source = (root / path).read_text(encoding="utf-8")
        for line, name in imported_names(source, path, index) + _plugins(source):
            target = _target(name, index)
            if target and target.startswith("tests/") and not target.startswith("tests/support/") \
                    and target != "tests/__init__.py":
                breaks.append(f"{path}:{line}: imports {_dotted(target)}: tests and benchmarks import from tests "
                              "only tests.support")
    return sorted(set(breaks))


test_import_breaks.__test__ = False  # a checker, not a pytest test


def render_map(rules: dict) -> str:
    """The map table of docs/development.md, from the rules."""
    rows = ["| place | what it owns | may import |", "|---|---|---|"]
    for room in rules["rooms"]:
        may = "everything" if "*" in room["may_import"] else ", ".join(f"`{r}`" for r in room["may_import"])
        packages = ", ".join(room["packages"]) if "*" not in room["packages"] else ""
        cell = "; ".join(part for part in (may, packages) if part) or "only the standard library"
        cell += f" ({room['note']})" if room.get("note") else ""
        place = room["place"] if room["place"] == f"`{room['name']}`" else f"{room['place']} (`{room['name']}`)"
        rows.append(f"| {place} | {room['owns']} | {cell} |")
    return "\n".join(rows)


def map_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """The map in docs/development.md must be the one rendered from the rules."""
    rules = rules or load_rules(root)
    page = (root / MAP_PAGE).read_text(encoding="utf-8") if (root / MAP_PAGE).is_file() else ""
    if MAP_BEGIN not in page or MAP_END not in page:
        return [f"{MAP_PAGE}: no house map (the lines {MAP_BEGIN!r} and {MAP_END!r} around it)"]
    table = page.split(MAP_BEGIN, 1)[1].split(MAP_END, 1)[0].strip()
    return [] if table == render_map(rules) else [
        f"{MAP_PAGE}: the map differs from {RULES}: run `python -m tests.support.house --write`"]


def write_map(root: Path) -> None:
    page = (root / MAP_PAGE).read_text(encoding="utf-8")
    head, rest = page.split(MAP_BEGIN, 1)
    tail = rest.split(MAP_END, 1)[1]
    (root / MAP_PAGE).write_text(f"{head}{MAP_BEGIN}\n{render_map(load_rules(root))}\n{MAP_END}{tail}",
                                 encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.house", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"regenerate the map in {MAP_PAGE} from {RULES}")
    p.add_argument("--check", action="store_true", help="print every break of the house rules; exit 1 if any")
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    if args.write:
        write_map(root)
    from tests.support.house_links import link_breaks, path_breaks

    breaks = (missing_rows(root) + import_breaks(root) + size_breaks(root) + test_import_breaks(root)
              + map_breaks(root) + link_breaks(root) + path_breaks(root))
    print("\n".join(breaks) or "the house rules hold")
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main())
