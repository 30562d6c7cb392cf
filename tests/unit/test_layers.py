"""The library's layers, as ``docs/architecture.md`` draws them: every import points down
the layers (or stays inside one folder), the four resource folders never import each other,
only ``transport/`` imports ``requests``/``urllib3``, the package root stays small and no
module is a warehouse. Read from the source as text: nothing here imports the package."""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set, Tuple

import pytest
from source_tree import code_lines, imports, modules

import e2b_provider

ROOT = os.path.dirname(os.path.abspath(e2b_provider.__file__))
PKG = "e2b_provider"
MODULES = modules(ROOT, PKG)

#: Each part of the package (a root module or a folder) and its layer, bottom (0) to top.
#: A part may import parts of a lower layer and its own modules, nothing else.
LAYERS: Dict[str, int] = {
    "errors": 0,
    "sandbox_side": 0,  # files sent whole into sandboxes: they import nothing of the library
    "_version": 0,
    "cancel": 1,
    "models": 1,
    "_watchdog": 1,
    "protocol": 2,
    "config": 3,
    "emulator": 4,  # imports only the foundation and protocol/ (the library never imports it)
    "transport": 4,
    "clients": 5,
    "core": 6,
    "sandboxes": 7,
    "commands": 7,
    "files": 7,
    "ports": 7,
    "interpreter": 7,
    "provider": 8,
    "extension": 9,
    "cli": 9,
    "__main__": 10,
}
RESOURCES = ("sandboxes", "commands", "files", "ports", "interpreter")
#: The one module allowed above 600 lines of code: it is sent whole into sandboxes.
LARGE_ALLOWED = {f"{PKG}.sandbox_side.file_agent"}
MAX_CODE_LINES = 600


def _part(mod: str) -> str:
    """The part a module belongs to: its folder under the package, or itself at the root."""
    rest = mod[len(PKG) + 1 :] if mod != PKG else ""
    return rest.split(".")[0] if rest else ""


def _arrows() -> List[Tuple[str, str]]:
    """(importer, imported) for every import between two of the package's modules; a
    module's own parent packages (initialised before it) and the root ``__init__`` (it only
    re-exports, lazily) left out."""
    known = set(MODULES)
    found = []
    for mod, path in MODULES.items():
        if mod == PKG:
            continue
        for dep in imports(mod, path, known):
            if dep in known and dep != PKG and not (mod + ".").startswith(dep + "."):
                found.append((mod, dep))
    return found


def test_every_part_has_a_layer() -> None:
    parts = {_part(m) for m in MODULES} - {""}
    assert parts <= set(LAYERS), f"parts without a layer: {sorted(parts - set(LAYERS))}"


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for mod, dep in _arrows():
        a, b = _part(mod), _part(dep)
        if a != b and not LAYERS[b] < LAYERS[a]:
            wrong.append(f"{mod} -> {dep}")
    assert wrong == []


def test_resource_folders_never_import_each_other() -> None:
    wrong = [
        f"{mod} -> {dep}"
        for mod, dep in _arrows()
        if _part(mod) in RESOURCES and _part(dep) in RESOURCES and _part(mod) != _part(dep)
    ]
    assert wrong == []


def test_the_emulator_uses_only_the_foundation_and_the_protocol() -> None:
    allowed = {"errors", "_version", "cancel", "models", "config", "protocol", "emulator"}
    wrong = [
        f"{mod} -> {dep}"
        for mod, dep in _arrows()
        if _part(mod) == "emulator" and _part(dep) not in allowed
    ]
    assert wrong == []
    # The library reaches the emulator only from the command line (``e2b-provider emulator``).
    users = {_part(mod) for mod, dep in _arrows() if _part(dep) == "emulator"}
    assert users <= {"emulator", "cli"}


def test_no_import_cycle_between_folders() -> None:
    graph: Dict[str, Set[str]] = {}
    for mod, dep in _arrows():
        a, b = _part(mod), _part(dep)
        if a != b:
            graph.setdefault(a, set()).add(b)
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_only_the_transport_imports_the_http_stack() -> None:
    users = set()
    for mod, path in MODULES.items():
        names = imports(mod, path, set(MODULES))
        if {n.split(".")[0] for n in names} & {"requests", "urllib3"}:
            users.add(_part(mod))
    assert users == {"transport"}


def test_the_root_is_small_and_the_folders_show_the_layers() -> None:
    root_modules = [n for n in os.listdir(ROOT) if n.endswith(".py")]
    folders = [
        n for n in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, n, "__init__.py"))
    ]
    assert len(root_modules) <= 12, sorted(root_modules)
    assert len(folders) >= 5, sorted(folders)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_every_module_says_what_it_owns(mod: str) -> None:
    with open(MODULES[mod], encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    assert doc and doc.strip(), f"{mod} has no header docstring"


def test_no_module_is_a_warehouse() -> None:
    large = {
        mod: n
        for mod, path in MODULES.items()
        if (n := code_lines(path)) > MAX_CODE_LINES and mod not in LARGE_ALLOWED
    }
    assert large == {}
