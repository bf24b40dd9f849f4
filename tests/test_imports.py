"""tent_core's modules import cleanly on their own and never import each other in a circle.

Regression: `Request` lived in engine.py, so engine -> staged -> engine (and batch -> engine)
closed circles that only worked because of the order modules happened to be imported in."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tent_core

PKG = Path(tent_core.__file__).parent
# plugin templates are text for `tent new-plugin`, not modules of the core
SKIP = {"templates"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        if rel.parts[0] in SKIP:
            continue
        parts = ["tent_core", *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (annotations only; never executed)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """tent_core modules `name` imports when it runs: at module level or lazily inside functions."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            if t in known and t != name and t != "tent_core":
                found.add(t)
    return found


def test_no_import_cycles_in_tent_core():
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items() if m != "tent_core"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_public_names_stay_where_callers_find_them():
    import tent_core.engine as engine_mod
    from tent_core import Engine, LocalBuffer, Request
    from tent_core.request import LocalBuffer as LB
    from tent_core.request import Request as R

    assert engine_mod.Engine is Engine and engine_mod.Request is Request is R and engine_mod.LocalBuffer is LocalBuffer is LB
    assert engine_mod.parse_segment_name("h:1/s") == ("h:1", "s")
