"""The emulator's layout: imports point one way (handle/api → runtime; agent and runtime
never import the host API), no import cycle, and the sandbox's PID 1 uses the standard
library only (it runs by file path with ``python -S``)."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import sysconfig
from typing import Dict, List, Set

from source_tree import imports, modules

import e2b_provider.emulator as emulator

ROOT = os.path.dirname(os.path.abspath(emulator.__file__))
PKG = "e2b_provider.emulator"


MODULES = modules(ROOT, PKG)


def _imports(mod: str) -> Set[str]:
    """Every module ``mod`` imports (at any depth of its code), absolute names."""
    return imports(mod, MODULES[mod], set(MODULES))


def _internal(mod: str) -> Set[str]:
    """The emulator modules ``mod`` imports; its own parent packages (always initialised
    before it) left out."""
    return {m for m in _imports(mod) if m in MODULES and not (mod + ".").startswith(m + ".")}


def test_agent_and_runtime_never_import_the_host_api_or_the_handle() -> None:
    for mod in MODULES:
        if mod.startswith((f"{PKG}.agent", f"{PKG}.runtime")):
            bad = {
                m
                for m in _internal(mod)
                if m.startswith((f"{PKG}.api", f"{PKG}.handle", f"{PKG}.__main__"))
            }
            assert not bad, f"{mod} imports {sorted(bad)}"
    for mod in MODULES:
        if mod.startswith(f"{PKG}.agent"):
            assert not {m for m in _internal(mod) if m.startswith(f"{PKG}.runtime")}, mod


def test_no_import_cycle() -> None:
    graph = {mod: _internal(mod) for mod in MODULES}
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(mod: str, stack: List[str]) -> None:
        state[mod] = 1
        stack.append(mod)
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    assert cycles == []


def _in_stdlib(name: str) -> bool:
    if name in sys.builtin_module_names or name == "__future__":
        return True
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    if origin in ("built-in", "frozen"):
        return True
    stdlib = sysconfig.get_paths()["stdlib"]
    return origin is not None and os.path.realpath(origin).startswith(
        os.path.realpath(stdlib) + os.sep
    ) and "site-packages" not in origin


def test_sandbox_init_is_standard_library_only() -> None:
    # PID 1 is every module of runtime/pid1: init.py runs by path, its siblings are imported
    # by top-level name (sys.path[0]); each may import only the standard library and them
    # (``from .sibling import …`` too, for type checkers; never through e2b_provider).
    folder = os.path.join(ROOT, "runtime", "pid1")
    files = sorted(name for name in os.listdir(folder) if name.endswith(".py"))
    siblings = {name[:-3] for name in files if name != "__init__.py"}
    assert "init" in siblings and len(siblings) > 1
    assert [name for name in sorted(siblings) if _in_stdlib(name)] == []  # none shadows one
    for name in files:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        used: Set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                used.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                used.add(node.module or "")
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1, (name, node.module)
                used.update([node.module] if node.module else [a.name for a in node.names])
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                used.add("importlib.import_module")  # not allowed: no imports by name
        assert used or name == "__init__.py", name  # the package (host side) imports nothing
        bad = [m for m in sorted(used) if m not in siblings and not _in_stdlib(m.split(".")[0])]
        assert bad == [], name
        assert "importlib.import_module" not in used, name
