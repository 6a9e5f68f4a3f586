"""E602: every name a spec's code reads resolves, checked before anything runs.

A body, a reference, a competitor or an input's init code is the body of a function in a generated
module (init code: of `key`, the dims, params and `dtype`, in reference.py). It may read
the names it binds itself, the function's arguments (the refs, params, dims and grid indices of a
kernel; the inputs, params and dims of a reference), the names the module imports, and Python's
builtins. The imports are read from the templates themselves, so the two cannot drift apart. The
code is parsed, never run.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from importlib import resources

from kspec.codegen.backends import BACKENDS
from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.spec.model import Code, KernelSpec, SpecKind, Variant

_IMPORT = re.compile(r"^(?:import ([\w.]+)(?: as (\w+))?|from [\w.]+ import ([\w, ]+))$", re.M)


@functools.lru_cache(maxsize=None)
def template_imports(template: str) -> frozenset:
    """The names the import lines of a template bind at module level."""
    text = (resources.files("kspec") / "templates" / template).read_text(encoding="utf-8")
    return frozenset(_bound_by_imports(line for line in text.splitlines()))


def _bound_by_imports(lines) -> set:
    out = set()
    for line in lines:
        m = _IMPORT.match(line.strip())
        if not m:
            continue
        if m.group(1):
            out.add(m.group(2) or m.group(1).split(".")[0])
        else:
            for item in m.group(3).split(","):
                name, _, alias = item.strip().partition(" as ")
                out.add((alias or name).strip())
    return out


def check(spec: KernelSpec) -> list:
    """E602 for each name the spec's code reads that nothing provides."""
    out = []
    inputs, dims = [o.name for o in spec.inputs], set(spec.dims)
    params = {p.name for v in spec.variants.values() for p in v.params}
    reference_scope = set(inputs) | params | dims | set(spec.mesh_sizes) | template_imports("reference.py.j2")
    out += _unknown(spec.reference, "reference", reference_scope)
    for c in spec.competitors:
        out += _unknown(c.body, f"competitor `{c.name}`", reference_scope)
    out += _wrapper(spec, params | dims)
    for op in spec.inputs:
        if op.init is not None and op.init.code is not None:
            out += _unknown(op.init.code, f"{op.name}.init.code",
                            {"key", *spec.init_args(op)} | template_imports("reference.py.j2"))
    seen = set()
    for variant in spec.variants.values():
        if variant.body.origin in seen:
            continue  # one body shared by several backends: its names are checked against the first
        seen.add(variant.body.origin)
        given = {o.given_flag for o in spec.inputs if o.optional}
        out += _unknown(variant.body, "body", _kernel_scope(spec.kernel_view, variant) | given)
    return out


def _wrapper(spec: KernelSpec, static: set) -> list:
    """The prologue reads the inputs, the epilogue the kernel's outputs and the inputs; both the
    params, the dims and the imports of the backend modules they are rendered into."""
    w = spec.wrapper
    if w is None:
        return []
    scope = {o.name for o in spec.inputs} | static | template_imports("kernel.py.j2")
    out = _unknown(w.prologue, "prologue", scope) if w.prologue is not None else []
    if w.epilogue is not None:
        out += _unknown(w.epilogue, "epilogue", scope | {o.name for o in w.outputs})
    return out


def _kernel_scope(spec: KernelSpec, v: Variant) -> set:
    backend = BACKENDS[v.backend]
    scope = {f"{o.name}_ref" for o in spec.operands} | {f"{s.name}_ref" for s in v.scratch}
    scope |= {p.name for p in v.params} | set(spec.dims) | {a.name for a in v.grid if a.name}
    scope |= set(spec.mesh_sizes)
    scope |= {a.name for a in v.mesh} | {p.name for p in v.pipelines}
    scope |= template_imports("kernel.py.j2") | _bound_by_imports(backend.imports)
    if spec.kind == SpecKind.MESH:
        scope |= template_imports("mesh.py.j2")
    return scope


def _unknown(code: Code, what: str, scope: set) -> list:
    try:
        tree = ast.parse(code.source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []  # E600 reports it
    bound = _bound(tree)
    known = scope | bound | set(dir(builtins))
    out, reported = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known:
            if node.id in reported:
                continue
            reported.add(node.id)
            out.append(Diagnostic(
                "E602", f"{what}: unknown name `{node.id}`", code.loc_of(node.lineno, node.col_offset),
                did_you_mean(node.id, known - set(dir(builtins))) or "a name the code reads must be bound in it, "
                "or be a ref, param, dim, grid index, input, import of the generated module or a builtin"))
    return out


def _bound(tree: ast.AST) -> set:
    """Every name the code binds, in any of its scopes (a permissive reading: a name bound anywhere
    is taken as known everywhere, so a correct body is never refused)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            out.add(node.rest)
    return out
