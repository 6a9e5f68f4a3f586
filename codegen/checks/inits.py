"""E411 and E450 to E453: the initialisers that give test data structure. An input's `init` is a
kind, `code` (plain JAX over `key`, the dims and params) or `same_as` (a copy of another input),
and an index initialiser's `low` and `bound` may read other inputs' values. The inputs are made
in the order they read each other, so those reads form no cycle; a copy has its source's shape
and dtype; and no input kind replaces data that structure rests on. The code is parsed, never
run; its syntax and imports are checked with the other code (E600, E601), its names by names.py
(E602).
"""

from __future__ import annotations

import ast

from kspec.codegen.checks.wrapper import own_nodes
from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.spec.model import InitKind, KernelSpec, Operand

# the keys each way of saying what the data is takes (besides `kind`, `code` and `same_as` themselves)
_KIND_KEYS = {"low", "high", "mean", "std", "of", "dim", "bound"}


def check(spec: KernelSpec) -> list:
    out = []
    inputs = {o.name: o for o in spec.inputs}
    for op in spec.inputs:
        init = op.init
        if init is None:
            continue
        out += _form(op)
        if init.same_as is not None:
            out += _same_as(spec, op, inputs)
        if init.code is not None:
            out += _returns(op)
    out += _cycle(spec)
    return out + _kinds(spec)


def _form(op: Operand) -> list:
    """E411: exactly one of kind, code and same_as; the keys of a kind only with one."""
    init, what = op.init, f"{op.name}.init"
    given = [k for k in ("kind", "code", "same_as") if k in init.keys]
    if len(given) != 1:
        if not given:
            return [Diagnostic("E411", f"{what}: has none of `kind`, `code` and `same_as`; an initialiser has exactly "
                               "one", init.loc, "add `kind: normal`, `code: ...` or `same_as: <input>`")]
        return [Diagnostic("E411", f"{what}: has {' and '.join(f'`{k}`' for k in given)}; an initialiser has exactly "
                           "one of `kind`, `code` and `same_as`", init.loc, "keep the one that says what the data is")]
    extra = [k for k in init.keys if k in _KIND_KEYS]
    if init.kind is None and extra:
        return [Diagnostic("E411", f"{what}: `{extra[0]}` goes with `kind`, not with `{given[0]}`", init.loc,
                           f"drop `{extra[0]}`, or use `kind: index` with low and bound")]
    if init.low_expr is not None and init.kind != InitKind.INDEX:
        return [Diagnostic("E411", f"{what}: `low` is an expression, which only an index initialiser takes", init.loc,
                           "give a number")]
    return []


def _same_as(spec: KernelSpec, op: Operand, inputs: dict) -> list:
    """E411 for a copy of an unknown input; E451 for one of another shape or dtype."""
    name, what = op.init.same_as, f"{op.name}.init"
    source = inputs.get(name)
    if source is None or name == op.name:
        hint = did_you_mean(name, [n for n in inputs if n != op.name]) or f"name another input: {', '.join(inputs)}"
        return [Diagnostic("E411", f"{what}: `same_as` names {'itself' if source else f'unknown input `{name}`'}",
                           op.init.loc, hint)]
    out = []
    mine, theirs = [e.shown for e in op.shape], [e.shown for e in source.shape]
    if mine != theirs:
        out.append(Diagnostic("E451", f"{what}: same_as {name}, of shape [{', '.join(theirs)}], but {op.name} has "
                              f"shape [{', '.join(mine)}]", op.init.loc, f"give {op.name} the shape of {name}"))
    if not _same_dtype(spec, op, source):
        out.append(Diagnostic("E451", f"{what}: same_as {name}, of dtype {_dtype_shown(spec, source)}, but {op.name} "
                              f"has dtype {_dtype_shown(spec, op)}", op.init.loc, f"write `dtype: {_root(spec, source).name}`"))
    return out


def _root(spec: KernelSpec, op: Operand) -> Operand:
    """The input whose dtype `op` has (itself, or the input its `dtype:` names)."""
    seen = set()
    while op.follows is not None and op.follows not in seen:
        seen.add(op.name)
        op = spec.operand(op.follows) or op
        if op.follows is None:
            break
    return op


def _dtype_shown(spec: KernelSpec, op: Operand) -> str:
    """An input's dtype as a message says it: `int32`, or `[float32, bfloat16]` for a choice."""
    dtypes = _root(spec, op).dtypes or ()
    return dtypes[0] if len(dtypes) == 1 else f"[{', '.join(dtypes)}]"


def _same_dtype(spec: KernelSpec, a: Operand, b: Operand) -> bool:
    """Whether two inputs have the same dtype in every call."""
    ra, rb = _root(spec, a), _root(spec, b)
    if ra.name == rb.name:
        return True
    return ra.dtypes is not None and rb.dtypes is not None and len(ra.dtypes) == 1 and ra.dtypes == rb.dtypes


def _returns(op: Operand) -> list:
    """E452: init code is one expression, or a function body that returns its value."""
    code = op.init.code
    try:
        tree = ast.parse(code.source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []  # E600 reports it
    if code.expression or any(isinstance(n, ast.Return) and n.value is not None for n in own_nodes(tree)):
        return []
    return [Diagnostic("E452", f"{op.name}.init.code: returns nothing; it must return the data of {op.name}",
                       code.loc_of(1, 0), "end it with `return <array>`, or write one expression")]


def _cycle(spec: KernelSpec) -> list:
    """E450: the inputs that initialisers read (same_as, an index's low and bound, init code) form no cycle."""
    reads = spec.init_reads
    for start in (o.name for o in spec.inputs if o.name in reads):
        path = _path_back(start, reads)
        if path is not None and path[0] == min(path, key=[o.name for o in spec.inputs].index):
            op = spec.operand(start)
            return [Diagnostic("E450", f"input initialisers read each other in a cycle: {' -> '.join(path + [start])}",
                               op.init.loc, "make one of them from dims and params alone")]
    return []


def _path_back(start: str, reads: dict) -> list | None:
    """A path of reads from `start` back to itself ([start, ...]), or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        name, path = stack.pop()
        for nxt in reads.get(name, ()):
            if nxt == start:
                return path
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def _kinds(spec: KernelSpec) -> list:
    """E453: input kinds would replace data made by code or copied, or data that other inputs' initialisers
    keep a structure with (init code that reads an input computes its data again from any kind's)."""
    out = []
    readers = {}
    for reader, names in spec.init_keeps.items():
        for name in names:
            readers.setdefault(name, reader)
    for op in spec.inputs:
        if not op.kinds:
            continue
        if op.init is not None and op.init.structured:
            why = f"its data is made by `{'code' if op.init.code is not None else 'same_as'}`"
        elif op.name in readers:
            why = f"{readers[op.name]}.init reads its values"
        else:
            continue
        out.append(Diagnostic("E453", f"{op.name}.kinds: {why}; an input kind would break that structure",
                              op.kinds_loc, "drop `kinds`, or write `kinds: []`"))
    return out
