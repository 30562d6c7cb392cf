"""The sandbox-side Python programs as they travel (``sandbox_side.pack``), run here through
the real ``PACKED_BOOT``: the same behaviour, the same line numbers in a traceback, and
a fraction of the bytes."""

from __future__ import annotations

import ast
import base64
import subprocess
import sys
import zlib

import pytest

from e2b_provider.protocol.boot import PACKED_BOOT, PROGRAM_VAR, PYTHON_LAUNCH
from e2b_provider.sandbox_side import pack, packed, source

PROGRAM = '''"""A module docstring
over two lines."""
# a comment line
import sys  # an inline comment stays


class Thing:
    """A class docstring."""

    def method(self):
        """A method's, with "quotes" and \\u00e9t\\u00e9 in it,
        over two lines."""
        # an indented comment
        text = """# not a comment: inside a string
kept"""
        return text


def fail():
    raise RuntimeError("here")


if sys.argv[1:] == ["fail"]:
    fail()
print(Thing().method(), Thing.__doc__, __doc__, sys.argv[1:])
'''


def _unpacked(text: str) -> str:
    return zlib.decompress(base64.b64decode(text)).decode("utf-8")


def _boot(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-X", "utf8", "-c", PACKED_BOOT, *args],
        env={PROGRAM_VAR: program}, capture_output=True, text=True, timeout=30,
    )


def test_a_packed_program_runs_as_its_source_without_docstrings_and_comment_lines() -> None:
    lean = _unpacked(pack(PROGRAM))
    assert lean.count("\n") == PROGRAM.count("\n")
    assert "docstring" not in lean and "a comment line" not in lean
    assert "an indented comment" not in lean and "# an inline comment stays" in lean
    assert "# not a comment: inside a string\nkept" in lean
    r = _boot(pack(PROGRAM), "a", "b")
    # (a docstring is left empty: the class and the module have "" for their __doc__)
    assert (r.returncode, r.stdout) == (0, "# not a comment: inside a string\nkept   "
                                           "['a', 'b']\n"), r.stderr


def test_a_traceback_names_the_sources_line() -> None:
    line = PROGRAM.splitlines().index('    raise RuntimeError("here")') + 1
    r = _boot(pack(PROGRAM), "fail")
    assert r.returncode == 1 and f"line {line}, in fail" in r.stderr, r.stderr


def test_the_program_leaves_the_environment_before_it_runs() -> None:
    r = _boot(pack(f"import os; print({PROGRAM_VAR!r} in os.environ)"))
    assert r.stdout == "False\n", r.stderr


def _code(text: str) -> str:
    """The program's syntax tree, its docstrings emptied."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                first.value.value = ""
    return ast.dump(tree)


@pytest.mark.parametrize("module", ["file_agent", "supervisor"])
def test_the_sandbox_programs_pack_to_a_fraction_with_the_same_code(module: str) -> None:
    text = packed(module)
    assert len(text) < len(source(module)) // 3
    lean = _unpacked(text)
    assert lean.count("\n") == source(module).count("\n")
    assert _code(lean) == _code(source(module))
    assert len(lean) < 0.85 * len(source(module))  # the docstrings and comments went


def test_python_launch_runs_a_packed_program_given_as_an_argument() -> None:
    r = subprocess.run(
        ["/bin/sh", "-c", PYTHON_LAUNCH, "capybara-test",
         pack("import os, sys; print(sys.argv[1:], 'CAPYBARA_PROGRAM' in os.environ)"),
         "x", "y"],
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )
    assert r.stdout == "['x', 'y'] False\n", r.stderr

