"""The storage rule of the house: a location's scheme (gs://, s3://, file://) is read in utils/storage/ alone.

Product code elsewhere asks utils.storage (`is_remote`, `split_url`, `local_path`, `check_location`,
`cache_folder`) instead of parsing a URL itself. Parsing, precisely: a string literal holding `gs://`, `s3://` or
`file://` that is
  - an argument of a str method that takes a location apart (`startswith`, `endswith`, `removeprefix`,
    `removesuffix`, `partition`, `rpartition`, `split`, `rsplit`, `find`, `rfind`, `index`, `rindex`, `replace`,
    `count`), directly or inside a tuple (`url.startswith(("gs://", "s3://"))`),
  - a side of a comparison (`url[:5] == "gs://"`, `"file://" in url`),
  - a regular expression given to `re` (`re.match(r"gs://(.*)", url)`),
  - or a bare scheme (`"gs://"`, `"s3://"`, `"file://"` and nothing else) anywhere: a constant kept for later parsing.
Messages, help texts and docstrings may name the schemes (`f"--data gs://..."`, "s3://bucket/prefix"): a literal that
is only printed or formatted is not parsing.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.house import product_modules

SCHEME = re.compile(r"\b(gs|s3|file)://")
BARE = re.compile(r"(gs|s3|file)://")
STR_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "partition", "rpartition", "split", "rsplit",
               "find", "rfind", "index", "rindex", "replace", "count"}
RE_CALLS = {"match", "fullmatch", "search", "compile", "sub", "subn", "split", "findall", "finditer"}
OWNER = "utils/storage/"


def _literals(node: ast.AST) -> list[ast.Constant]:
    """String constants of `node` itself or, for a tuple, list or set, of its elements."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _parsing(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, literal, how) for each scheme literal used to take a location apart."""
    found = []

    def check(node: ast.AST, how: str) -> None:
        found.extend((lit.lineno, lit.value, how) for lit in _literals(node) if SCHEME.search(lit.value))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "re" and node.func.attr in RE_CALLS:
                if node.args:
                    check(node.args[0], f"re.{node.func.attr}")
            elif node.func.attr in STR_METHODS:
                for arg in node.args:
                    check(arg, f".{node.func.attr}()")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                check(side, "a comparison")
    named = {(line, literal) for line, literal, _ in found}  # a literal already named by its use is reported once
    formatted = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found += [(node.lineno, node.value, "a bare scheme constant") for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and BARE.fullmatch(node.value)
              and (node.lineno, node.value) not in named and id(node) not in formatted]  # f"s3://{b}" builds one
    return sorted(set(found))


def breaks_in(source: str, path: str) -> list[str]:
    """One line per parsing literal in `source` (the module at `path`, relative to the repository)."""
    if path.startswith(OWNER):
        return []
    return [f"{path}:{line}: parses {literal!r} ({how}) outside {OWNER}; ask utils.storage (is_remote, split_url, "
            "local_path, check_location, cache_folder)" for line, literal, how in _parsing(ast.parse(source))]


def product_files(root: Path) -> list[Path]:
    """The product's Python files: the top-level scripts and the product places of docs/house.yaml."""
    return [root / path for path in product_modules(root)]


def url_parsing_breaks(root: Path) -> list[str]:
    """Every scheme parsed outside utils/storage/ in the product, one line each."""
    return [line for path in product_files(root)
            for line in breaks_in(path.read_text(encoding="utf-8"), path.relative_to(root).as_posix())]
