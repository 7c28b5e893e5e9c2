"""The house rules as functions of a repository root: each returns what breaks a rule, one line per break.

The rules live in docs/house.yaml (places, rooms on floors, what each may import and through which doors, size
limits and their named exceptions); the map of modules in docs/development.md is generated from it (`python -m
tests.support.house --write`). The imports are read by tests/support/house_graph.py; nothing is run."""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import yaml

from tests.support.house_graph import (SKIP_PARTS, dotted, hidden_imports, imported_names, knots, module_index,
                                       py_files, shortest_loop, target_file)
from tests.support.house_order import allowed_rooms, order_breaks

RULES = Path("docs/house.yaml")
MAP_PAGE = Path("docs/development.md")
MAP_BEGIN = "<!-- house map: generated from docs/house.yaml by `python -m tests.support.house --write` -->"
MAP_END = "<!-- end of the house map -->"


def load_rules(root: Path) -> dict:
    return yaml.safe_load((root / RULES).read_text(encoding="utf-8"))


def product_modules(root: Path, rules: dict | None = None) -> list[str]:
    """Every product module as a path relative to `root`: the top-level scripts and each .py under the product
    places of the rules."""
    places = [d.rstrip("/") for d in (rules or load_rules(root))["places"]["product"]]
    files = sorted(root.glob("*.py")) + [p for d in places if (root / d).is_dir() for p in py_files(root / d)]
    return [p.relative_to(root).as_posix() for p in files]


def place_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Top-level folders holding Python that the rules' places do not claim (as product or as not product)."""
    places = (rules or load_rules(root))["places"]
    claimed = {d.rstrip("/") for d in [*places["product"], *places["not_product"]]}
    breaks = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in SKIP_PARTS | claimed
                         and not p.name.startswith(".")):
        if found := py_files(folder):
            breaks.append(f"{folder.name}/: a top-level folder holding Python ({found[0].relative_to(root).as_posix()})"
                          f" that no room claims; name it in {RULES} places (product, with rows for its modules, or "
                          "not_product with its reason)")
    return breaks


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
    for path in product_modules(root, rules):
        if path not in rooms and not path.endswith("__init__.py"):  # an __init__.py: see import_breaks
            breaks.append(f"{path}: no row in the map ({RULES}: add it to a room's modules and text)")
    return breaks


def _room_at(path: str, rooms: dict[str, dict]) -> dict | None:
    return rooms.get(path) or (_init_room(path, rooms) if path.endswith("__init__.py") else None)


def import_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Imports of project modules and third-party packages that a module's room does not allow, imports of a
    room's inner modules past its doors, and imports the rules cannot see (importlib, __import__)."""
    rules = rules or load_rules(root)
    rooms, index = room_of(rules), module_index(root)
    local = {name.split(".")[0] for name in index}
    breaks = []
    for path in product_modules(root, rules):
        room = _room_at(path, rooms)
        allowed = allowed_rooms(room, rules) if room else set()
        source = (root / path).read_text(encoding="utf-8")
        names = imported_names(source, path, index)
        packages = set(room["packages"]) if room else set()
        breaks += hidden_imports(source, path, local)
        for line, name in names:
            top = name.split(".")[0]
            if top not in local | packages | set(sys.stdlib_module_names) and "*" not in packages:
                breaks.append(f"{path}:{line}: imports {top}; room {room['name'] if room else '(none)'} may import "
                              f"{_allowed_text(room, rules)}")
            if top not in local or (target := target_file(name, index)) is None:
                continue
            if target.startswith(("tests/", "benchmarks/")):
                breaks.append(f"{path}:{line}: imports {name}: product code never imports tests or benchmarks")
                continue
            to = _room_at(target, rooms)
            if to is not None and to["name"] in allowed:
                if to is not room and to.get("doors") and target not in to["doors"]:
                    doors = ", ".join(dotted(d) for d in to["doors"])
                    breaks.append(f"{path}:{line}: imports {dotted(target)}, behind the doors of room {to['name']}: "
                                  f"other rooms import only {doors}")
                continue
            where = f"room {to['name']}" if to else "no room"
            breaks.append(f"{path}:{line}: imports {dotted(target)} ({where}); room "
                          f"{room['name'] if room else '(none)'} may import {_allowed_text(room, rules)}")
    return sorted(set(breaks))


def _allowed_text(room: dict | None, rules: dict) -> str:
    if room is None:
        return "nothing of the project"
    rooms = [*room["may_import"], *rules["everyone_may_import"]]
    return ", ".join(rooms + room["packages"]) or "only the standard library"


def cycle_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Import cycles between product files (imports inside functions count: they only delay the cycle), one line
    per knot of files that import each other, naming its shortest loop."""
    rules = rules or load_rules(root)
    index, modules = module_index(root), set(product_modules(root, rules))
    edges: dict[str, dict[str, int]] = {}
    for path in sorted(modules):
        for line, name in imported_names((root / path).read_text(encoding="utf-8"), path, index):
            target = target_file(name, index)
            if target in modules and target != path:
                edges.setdefault(path, {}).setdefault(target, line)
    breaks = []
    for knot in knots(edges):
        loop = min((shortest_loop(start, edges, knot) for start in knot), key=lambda loop: (len(loop), loop))
        steps = " -> ".join(f"{a}:{edges[a][b]}" for a, b in zip(loop, loop[1:]))
        breaks.append(f"import cycle: {steps} -> {loop[-1]} (files that import each other; move what they share "
                      "below both)")
    return breaks


def size_breaks(root: Path, rules: dict | None = None) -> list[str]:
    """Files over the line limit and functions over theirs that size_exceptions do not name, and exceptions that
    no longer apply (or name nothing)."""
    rules = rules or load_rules(root)
    limits = rules["limits"]
    excused = {e["what"] for e in rules["size_exceptions"]}
    paths = product_modules(root, rules) + [p.relative_to(root).as_posix() for d in ("tests", "benchmarks")
                                     if (root / d).is_dir() for p in py_files(root / d)]
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
    index = module_index(root)
    paths = [p.relative_to(root).as_posix() for p in py_files(root / "tests")
             if p.name.startswith("test_") or p.name == "conftest.py"] if (root / "tests").is_dir() else []
    paths += [p.relative_to(root).as_posix() for p in py_files(root / "benchmarks")] \
        if (root / "benchmarks").is_dir() else []
    breaks = []
    for path in paths:
        source = (root / path).read_text(encoding="utf-8")
        for line, name in imported_names(source, path, index) + _plugins(source):
            target = target_file(name, index)
            if target and target.startswith("tests/") and not target.startswith("tests/support/") \
                    and target != "tests/__init__.py":
                breaks.append(f"{path}:{line}: imports {dotted(target)}: tests and benchmarks import from tests "
                              "only tests.support")
    return sorted(set(breaks))


test_import_breaks.__test__ = False  # a checker, not a pytest test


def render_map(rules: dict) -> str:
    """The map table of docs/development.md, from the rules."""
    rows = ["| floor | place | what it owns | may import |", "|---|---|---|---|"]
    for room in rules["rooms"]:
        may = "every room below" if "*" in room["may_import"] else ", ".join(f"`{r}`" for r in room["may_import"])
        packages = ", ".join(room["packages"]) if "*" not in room["packages"] else ""
        cell = "; ".join(part for part in (may, packages) if part) or "only the standard library"
        cell += f" ({room['note']})" if room.get("note") else ""
        place = room["place"] if room["place"] == f"`{room['name']}`" else f"{room['place']} (`{room['name']}`)"
        doors = ", ".join(f"`{Path(d).stem}`" for d in room.get("doors") or {})
        owns = room["owns"] + (f"; other rooms enter only by {doors}" if doors else "")
        rows.append(f"| {room['floor']} | {place} | {owns} | {cell} |")
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

    breaks = (order_breaks(load_rules(root)) + place_breaks(root) + missing_rows(root) + import_breaks(root)
              + cycle_breaks(root) + size_breaks(root) + test_import_breaks(root) + map_breaks(root)
              + link_breaks(root) + path_breaks(root))
    print("\n".join(breaks) or "the house rules hold")
    return 1 if breaks else 0


if __name__ == "__main__":
    sys.exit(main())
