"""The toolchain's layout: dependencies point one way, with no import cycle.

Every import between modules of kspec counts, including those inside functions (a
function-level import hides a cycle; it does not remove it). The layers, lowest first:

    codegen (the package docstring) -> diagnostics -> spec -> backends -> checks -> emit -> cache -> project -> run -> verify, bench, tune -> cli

A module may import its own layer's modules and lower layers, never a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["codegen", "diagnostics", "spec", "backends", "checks", "emit", "cache", "project", "run", ("verify", "bench", "tune"), "cli"]


def _layer(module: str) -> int:
    parts = module.split(".")
    top = "cli" if parts[:2] == ["kspec", "cli"] else (parts[2] if len(parts) > 2 else "codegen")
    for n, layer in enumerate(LAYERS):
        if top == layer or (isinstance(layer, tuple) and top in layer):
            return n
    raise AssertionError(f"{module}: not in any layer of {LAYERS}")


def _modules() -> dict:
    """{dotted name: path} of cli.py and every module under codegen/."""
    found = {"kspec.cli": ROOT / "cli.py"}
    for path in sorted((ROOT / "codegen").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        found[".".join(["kspec", *parts])] = path
    return found


def _imports(name: str, path: Path, modules: dict) -> set:
    """The kspec modules `name` imports, anywhere in the file (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t != "kspec":
                out.add(t)
    return out


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict) -> list | None:
    state: dict = {}
    stack: list = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_dependencies_point_down_the_pipeline():
    upward = sorted(
        f"{a} imports {b}" for a, deps in _graph().items() for b in deps if b.startswith("kspec.") and _layer(b) > _layer(a)
    )
    assert upward == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(_modules()))
def test_every_module_is_in_a_layer(module):
    _layer(module)
