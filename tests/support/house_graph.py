"""The import graph of a source tree, read with `ast` (nothing is run): its .py files, the dotted names
they import (`import x`, `from x import y`, relative ones resolved, also those inside functions), the
imports no statement shows (importlib), and the knots of files that import each other. tests/support/
house.py holds these against the rules of docs/house.yaml."""
from __future__ import annotations

import ast
import os
from pathlib import Path

SKIP_PARTS = {"node_modules", ".venv", "__pycache__", ".git", ".cache"}


def py_files(folder: Path) -> list[Path]:
    """The .py files under `folder`, not descending into SKIP_PARTS (rp2040/node_modules is large)."""
    found = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in SKIP_PARTS and not d.startswith(".")]
        found += [Path(here) / f for f in files if f.endswith(".py")]
    return sorted(found)


def dotted(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def module_index(root: Path) -> dict[str, str]:
    """Dotted module name -> path, for every .py of the repository."""
    return {dotted(p.relative_to(root).as_posix()): p.relative_to(root).as_posix() for p in py_files(root)}


def imported_names(source: str, path: str, index: dict[str, str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, anywhere in the file; `from a import b` gives `a.b` when
    that is a module of `index`, else `a`; relative imports are resolved against `path`."""
    package = dotted(path).split(".")
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


def target_file(name: str, index: dict[str, str]) -> str | None:
    """The file a dotted import name lands in: the longest prefix that is a module."""
    parts = name.split(".")
    while parts and ".".join(parts) not in index:
        parts.pop()
    return index[".".join(parts)] if parts else None


DYNAMIC_IMPORTS = {"import_module", "__import__", "run_module"}  # importlib's, the builtin, runpy's


def hidden_imports(source: str, path: str, local: set[str]) -> list[str]:
    """Imports made by a call (`importlib.import_module("utils.x")`, `__import__`, `runpy.run_module`) of a project
    module, or of a name computed at run time: the rules above cannot see where they lead."""
    breaks = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func not in DYNAMIC_IMPORTS or not node.args:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value.startswith(".") or arg.value.split(".")[0] in local:
                breaks.append(f"{path}:{node.lineno}: imports {arg.value} through {func}(), which the house rules "
                              "cannot follow; use an import statement")
        else:
            breaks.append(f"{path}:{node.lineno}: imports a module named at run time through {func}(), which the "
                          "house rules cannot follow; use import statements")
    return breaks


def knots(edges: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected sets of more than one file (Tarjan's algorithm, iteratively)."""
    order, low, stack, on, knots, counter = {}, {}, [], set(), [], [0]
    for start in sorted(edges):
        if start in order:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        order[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    knot = set()
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        knot.add(member)
                        if member == node:
                            break
                    if len(knot) > 1:
                        knots.append(knot)
            elif child not in order:
                order[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(edges.get(child, {})))))
            elif child in on:
                low[node] = min(low[node], order[child])
    return sorted(knots, key=min)


def shortest_loop(start: str, edges: dict[str, dict[str, int]], knot: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside `knot` (breadth first)."""
    came_from, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges.get(node, {})):
                if child == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child in knot and child not in came_from:
                    came_from[child] = node
                    nxt.append(child)
        frontier = nxt
    return [start, start]
