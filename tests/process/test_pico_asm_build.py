"""The committed asm_thumb machine code (rp2040/runtime/matvec_asm.py) is what rp2040/asm/*.S assembles to, so
nobody edits opcodes by hand: regenerated with Debian's ARM assembler when it is installed."""
import ast

import pytest

from rp2040 import asm_build


@pytest.mark.skipif(asm_build.toolchain_missing() is not None, reason=str(asm_build.toolchain_missing()))
def test_the_committed_machine_code_is_what_the_sources_assemble_to():
    assert asm_build.OUTPUT.read_text() == asm_build.generate()


def test_every_function_is_halfwords_in_an_asm_thumb_body():
    tree = ast.parse(asm_build.OUTPUT.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in funcs] == ["matvec4"]
    for f in funcs:
        assert [ast.unparse(d) for d in f.decorator_list] == ["micropython.asm_thumb"]
        assert [a.arg for a in f.args.args] == ["r0", "r1", "r2", "r3"]
        for stmt in f.body:
            call = stmt.value
            assert call.func.id == "data" and call.args[0].value == 2
            assert all(0 <= a.value < 1 << 16 for a in call.args[1:])
