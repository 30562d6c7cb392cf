"""Reading the package's source as text: its modules, what each imports, its lines of code.

The layout tests (the library's layers, the emulator's one-way imports) judge the tree by
these; nothing here imports the modules it reads.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from typing import Dict, Set


def modules(root: str, package: str) -> Dict[str, str]:
    """Every module below ``root`` (the folder of ``package``): dotted name -> file path."""
    found: Dict[str, str] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join([package, *parts])] = path
    return found


def imports(mod: str, path: str, known: Set[str]) -> Set[str]:
    """Every module ``mod`` (at ``path``) imports, at any depth of its code, as absolute
    names; ``from package import name`` counts as the module ``package.name`` when that is
    one of ``known``, and ``import_module("...")`` calls with a literal name count too."""
    package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
    out: Set[str] = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())

    def absolute(name: str, level: int) -> str:
        if not level:
            return name
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - level + 1])
        return base + "." + name if name else base

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node.module or "", node.level)
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out.update(subs or {base})
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                name = arg.value
                dots = len(name) - len(name.lstrip("."))
                out.add(absolute(name.lstrip("."), dots))
    return out


def code_lines(path: str) -> int:
    """How many lines of ``path`` hold code: docstrings, comments and blank lines left out."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    docstrings: Set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    lines: Set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(lines)
