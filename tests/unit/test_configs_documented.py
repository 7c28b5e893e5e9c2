"""Every field of every config dataclass in configs/ carries a docstring (a string literal right under it, as
litgpt writes them): what it is, its unit and allowed range, read where the field is."""
import ast
import dataclasses

import pytest

from configs.model import ModelConfig
from configs.plan import Plan
from configs.presets import RunConfig
from configs.run import RunSettings
from configs.training import TrainConfig
from tests.support.paths import REPO

CONFIGS = sorted((REPO / "configs").glob("*.py"))


def field_docs(source: str) -> dict[str, dict[str, str | None]]:
    """{dataclass: {field: the string literal right under it, or None}} for one module's source."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            body, docs = node.body, {}
            for stmt, after in zip(body, [*body[1:], None]):
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    literal = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    docs[stmt.target.id] = after.value.value if literal and isinstance(after.value.value, str) \
                        else None
            found[node.name] = docs
    return found


def test_every_field_of_every_config_dataclass_has_a_docstring():
    found = {f"{path.name}:{cls}": docs for path in CONFIGS for cls, docs in field_docs(path.read_text()).items()}
    assert len(found) >= 6  # ModelConfig, TrainConfig, RunSettings, RunConfig, Plan, MemoryEstimate
    assert {name: [f for f, doc in docs.items() if not (doc or "").strip()] for name, docs in found.items()
            if not all((doc or "").strip() for doc in docs.values())} == {}


@pytest.mark.parametrize("cls, module", [(ModelConfig, "model.py"), (TrainConfig, "training.py"),
                                         (RunSettings, "run.py"), (RunConfig, "presets.py"), (Plan, "plan.py")])
def test_the_check_reads_every_field_the_dataclass_has(cls, module):
    docs = field_docs((REPO / "configs" / module).read_text())[cls.__name__]
    assert list(docs) == [f.name for f in dataclasses.fields(cls)]


def test_a_field_without_a_docstring_is_seen():
    source = ("from dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass C:\n    a: int = 1\n"
              '    """documented"""\n    b: int = 2\n    c: int = 3  # a comment is not a docstring\n    d: int = 4\n'
              "    e = 5\n\n    def f(self):\n        pass\n")
    assert field_docs(source) == {"C": {"a": "documented", "b": None, "c": None, "d": None}}
