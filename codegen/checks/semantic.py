"""Stage 4: semantic checks over the model. Nothing here traces JAX or runs spec code.

`check(spec)` returns every diagnostic for the file. Per-case checks evaluate the
spec's expressions for each case (and each backend's variant) into an `Instance`,
the concrete numbers that the backend hardware rules in `rules.py` also read.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import math
import re
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.checks import inits as _init_structure
from kspec.codegen.checks import mesh as _mesh
from kspec.codegen.checks import names as code_names
from kspec.codegen.checks import wrapper as _wrapper
from kspec.codegen.backends import BACKENDS
from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.spec.expr import Expr, ExprError, IndexMap
from kspec.codegen.checks.instances import (
    MAX_DTYPE_COMBINATIONS,
    MAX_SPEC_GRID_POINTS,
    _dtype_choices,
    dtype_assignments,
    dtype_combinations,
    instantiate,
    unmet,
)
from kspec.codegen.spec.model import Case, Code, DimKind, InitKind, KernelSpec, MeshRole, Role, ScratchKind, SpecKind, Variant

# Names the generated modules use; spec names may not shadow them.
# Names the templates bind where a spec's names live: each generated module's own (imports,
# functions, tables), and the locals of the functions that take a spec's inputs, params and dims
# as locals (an output is never one). tests/test_no_exec.py derives both from the library's
# generated code and checks that they are here.
TEMPLATE_NAMES = frozenset({
    "AUTO", "AXIS_NAMES", "BACKENDS", "CHECK_VMA", "COMPETITORS", "COMPETITOR_REQUIRES", "DEFAULTS", "INITS", "IN_SPECS",
    "MESH_AXES",
    "NamedSharding", "NoGradientError", "OUT_SPECS", "P", "PASSED_ON", "PLATFORMS", "REFERENCE_PARAMS", "TABLE", "available_backends", "bind", "bucket",
    "contextlib", "crop", "differentiable", "importlib", "make_mesh", "manual_axis_type", "resolve",
    "satisfies_constraints", "select_backend", "select_sharded_backend", "whole", "whole_blocks",
    "KernelFallbackWarning", "UnsupportedCallError", "SLOWER", "GRAD_SPEEDUP", "check_call", "choose", "defaults",
    "reference_gradient", "runnable", "slower", "why_not", "itemsizes",
})
TEMPLATE_LOCALS = frozenset({"chosen", "mesh", "module", "num_sms", "options", "out", "params", "ran"})
RESERVED = frozenset(
    {"jax", "jnp", "lax", "pl", "np", "functools", "math", "pltpu", "plgpu", "pltriton"}
    | {"backend", "interpret", "cdiv", "residuals", "out_dtype"}
    | TEMPLATE_NAMES
    | set(keyword.kwlist)
    | set(dir(builtins))
)
MAX_TUNE_SPACE = 1 << 16  # configs one backend's params may offer `kspec tune` (the library's largest: 125)
ALLOWED_IMPORT_ROOTS = frozenset({"jax", "numpy"}) | frozenset(sys.stdlib_module_names)


def check(spec: KernelSpec) -> list[Diagnostic]:
    from kspec.codegen.backends import rules

    kernel = spec.kernel_view  # blocks, bodies and the hardware rules see the kernel's own operands
    diags = _names(spec) + _dtypes(spec) + _dtype_maps(spec) + _code(spec) + _wrapper.check(spec)
    diags += _prefetch(kernel) + _inits(spec) + _aliases(kernel) + _residuals(spec)
    for variant in spec.variants.values():
        diags += _structure(kernel, variant) + _backend_surface(kernel, variant) + _tune_space(variant)
        diags += rules.stores_in_flight(variant)
        diags += _mesh.structure(kernel, variant, _unknown)
    if spec.cost is not None:
        scope = set(spec.dims) | {p.name for v in spec.variants.values() for p in v.params}
        for e in (spec.cost.flops, spec.cost.transcendentals, spec.cost.bytes_accessed):
            diags += _unknown(e, scope, "cost_estimate")
    if not diags:  # the names a body reads, once every name the spec declares is sound
        diags += code_names.check(spec)
    if not diags:
        for case in spec.cases + spec.bench:
            diags += _case_bindings(spec, case)
        diags += _families(spec)
    if not diags:
        budget = [MAX_SPEC_GRID_POINTS]  # shared by every case x backend walk of this spec
        diags += _per_case(spec, spec.cases + spec.bench, budget)
    if spec.sharding is not None:
        from kspec.codegen.checks import sharding

        diags += sharding.check(spec, per_case=not any(d.severity == "error" for d in diags))
    for variant in spec.variants.values():
        diags += _unread_params(spec, variant)
    diags += _mesh_residuals(spec)
    if not any(d.severity == "error" for d in diags):
        diags += _derived_checks(spec)
    if not any(d.severity == "error" for d in diags):
        from kspec.codegen.checks import ragged

        diags += ragged.check(spec, lambda case: _case_is_valid(spec, case))
    return _unique(diags)


def _per_case(spec: KernelSpec, cases: tuple, budget: list | None) -> list:
    """The per-case checks (E5xx) and backend hardware rules (E7xx) of `cases` on every backend
    that takes them."""
    from kspec.codegen.backends import rules
    from kspec.codegen.checks import static_index

    diags, e511_at = [], set()
    for case in cases:
        for variant in spec.variants.values():
            # dtypes change no shape or index map: instantiate (and walk the grid) once per
            # case x backend, then apply the dtype-dependent hardware rules per combination
            supported = (d for d in dtype_assignments(spec, case) if variant.supports(d))
            first = next(supported, None)
            if first is None or unmet(variant, case):
                continue  # the backend does not take this case: verify skips it
            inst, found = instantiate(spec.kernel_view, variant, case, first, budget=budget)
            diags += found
            if inst is not None:
                for d in static_index.check(inst):  # E511 once per place: the first case that shows it
                    if d.loc not in e511_at:
                        e511_at.add(d.loc)
                        diags.append(d)
                diags += rules.check(inst)
                for dtypes in supported:
                    diags += rules.check(dataclasses.replace(inst, dtypes=dtypes))
    return diags


def _case_is_valid(spec: KernelSpec, case: Case) -> bool:
    """Whether a case that the spec does not declare would pass the per-case checks, the
    hardware rules and, for a sharded spec, the per-shard checks, on every backend."""
    if _case_bindings(spec, case) or any(d.severity == "error" for d in _per_case(spec, (case,), [MAX_SPEC_GRID_POINTS])):
        return False
    if spec.sharding is not None:
        from kspec.codegen.checks import sharding

        split, found = sharding.dim_split(spec)
        if found or sharding.case_checks(spec, case, spec.sharding.sizes(), split):
            return False
    return True


# What rules a shape out as a case: a constraint that fails (E501), a grid, mesh or pipeline axis, a
# shape or a block with no elements (E505, E506): an empty problem, not one the kernel gets wrong.
NOT_A_CASE = frozenset({"E501", "E505", "E506"})


def _fits(spec: KernelSpec, case: Case) -> bool:
    """Whether a case the spec does not declare binds its dims and meets its constraints (E501),
    has no empty grid axis or shape (E505, E506), and meets every backend's hardware rules (E7xx)
    and, for a sharded spec, the per-shard checks: what a derived case must do. The per-case proofs
    (bounds, coverage) are not asked: a derived case is checked against them."""
    from kspec.codegen.backends import rules

    if _case_bindings(spec, case):
        return False
    for variant in spec.variants.values():
        assign = next((d for d in dtype_assignments(spec, case) if variant.supports(d)), None)
        if assign is None or unmet(variant, case):
            continue
        inst, found = instantiate(spec, variant, case, assign, budget=[0])
        if any(d.code in NOT_A_CASE for d in found):
            return False
        if inst is not None:
            for dtypes in (d for d in dtype_assignments(spec, case) if variant.supports(d)):
                if any(d.severity == "error" for d in rules.check(dataclasses.replace(inst, dtypes=dtypes))):
                    return False
    if spec.sharding is not None:
        from kspec.codegen.checks import sharding

        split, found = sharding.dim_split(spec)
        if found or sharding.case_checks(spec, case, spec.sharding.sizes(), split):
            return False
    return True


def derived_cases(spec: KernelSpec, exhaustive: bool = False) -> list:
    """The cases verify derives from the spec (codegen/checks/derive.py), each a `derive.Derived`."""
    from kspec.codegen.checks import derive

    return derive.derive(spec, lambda case: _fits(spec, case), exhaustive)


def _derived_checks(spec: KernelSpec) -> list:
    """The per-case proofs and hardware rules on the derived cases verify runs by default: an error
    that only a derived case exposes, located where the spec goes wrong, its hint naming the case
    the derived one was made from."""
    out = []
    budget = [MAX_SPEC_GRID_POINTS]  # shared by every derived case's walks, as the declared ones share theirs
    for d in derived_cases(spec):
        for diag in _per_case(spec, (d.case,), budget):
            hint = f"derived by verify from {d.note}" + (f"; {diag.hint}" if diag.hint else "")
            out.append(dataclasses.replace(diag, hint=hint))
    return out


def _tune_space(v: Variant) -> list:
    """E415: `kspec tune` searches the product of the params' choices; past MAX_TUNE_SPACE
    configs no search could cover it (and pruning alone would take hours)."""
    tunable = [p for p in v.params if p.choices]
    size = math.prod(len(p.choices) for p in tunable)
    if size <= MAX_TUNE_SPACE:
        return []
    widest = sorted(tunable, key=lambda p: -len(p.choices))[:3]
    return [Diagnostic(
        "E415", f"{v.backend}: the params' choices make {size:.3g} configs to tune; at most {MAX_TUNE_SPACE} allowed",
        tunable[0].loc, "give fewer choices, e.g. to " + ", ".join(f"{p.name} ({len(p.choices)})" for p in widest))]


def _reads(obj) -> set:
    """Every name that the expressions, index maps and code inside `obj` read (parsed, never run)."""
    if isinstance(obj, (Expr, IndexMap, Code)):
        return set(obj.names)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return set().union(*(_reads(getattr(obj, f.name)) for f in dataclasses.fields(obj)))
    if isinstance(obj, Mapping):
        return set().union(*(_reads(v) for v in obj.values()))
    if isinstance(obj, (list, tuple)):
        return set().union(*(_reads(v) for v in obj))
    return set()


def _unread_params(spec: KernelSpec, v: Variant) -> list:
    """W901: a param with several choices that nothing in this backend's kernel reads: `kspec tune`
    would compile and time the same kernel once per choice (e.g. a top-level block size that a
    backend's own grid and blocks replace)."""
    read = _reads(v) | _reads((spec.inputs, spec.outputs, spec.constraints, spec.cost, spec.reference, spec.vjp,
                               spec.wrapper))
    return [
        Diagnostic(
            "W901",
            f"{v.backend}: param `{p.name}` has choices {list(p.choices)}, but nothing in the {v.backend} kernel reads it",
            p.loc,
            f"kspec tune would time the same kernel once per choice: declare `{p.name}` under "
            "backends.<name>.params of the backends that read it, or drop its choices",
            severity="warning",
        )
        for p in v.params
        if p.choices and len(set(p.choices)) > 1 and p.name not in read
    ]


def _mesh_residuals(spec: KernelSpec) -> list:
    """W904: a mesh kernel's residual output that its body does not compare with None: every call
    writes it, also one outside jax.grad that returns the other outputs alone (a pallas_call's
    body gets a stand-in that drops the stores; a mesh body's copies need the test)."""
    if spec.kind != SpecKind.MESH:
        return []
    out = []
    for o in spec.outputs:
        if not o.residual:
            continue
        untested = [b for b, v in spec.variants.items() if not v.leaves_out(o)]
        if untested:
            out.append(Diagnostic(
                "W904",
                f"{', '.join(untested)}: the mesh kernel writes residual output `{o.name}` in every call, also "
                "outside jax.grad, where nothing reads it",
                o.residual_loc,
                f"put its writes under `if {o.name}_ref is not None:` in the body: a call that does not ask for "
                "the residual outputs then leaves it out of the kernel, and the body gets None for it",
                severity="warning",
            ))
    return out


def _unique(diags: list) -> list:
    seen, out = set(), []
    for d in diags:
        key = (d.loc, d.code, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return sorted(out, key=lambda d: (d.loc, d.code))


# -- names --------------------------------------------------------------------


def _names(spec: KernelSpec) -> list:
    out = []
    owners: dict = {}

    def claim(name: str, what: str, loc) -> None:
        local = what not in ("output", "output ref", "kernel")  # names the generated functions hold as locals
        if name in RESERVED or name.startswith("_") or (local and name in TEMPLATE_LOCALS):
            out.append(
                Diagnostic(
                    "E400",
                    f"{what} `{name}` clashes with a name the generated code uses",
                    loc,
                    "rename it; reserved: Python keywords and builtins, the modules and helpers generated code "
                    "uses (jax, jnp, lax, pl, np, bind, params, select_backend, ...), and names starting with _",
                )
            )
        elif name in owners and owners[name][0] != what:
            out.append(
                Diagnostic(
                    "E400",
                    f"{what} `{name}` has the same name as {owners[name][0]} `{name}`",
                    loc,
                    "give each operand, dim, param and scratch buffer its own name",
                )
            )
        else:
            owners.setdefault(name, (what, loc))

    claim(spec.name, "kernel", spec.loc)
    owners.pop(spec.name, None)
    inputs = {o.name for o in spec.inputs}
    for op in spec.operands + spec.kernel_only:
        if op.kernel and op.role == "input" and op.name in inputs:
            continue  # a kernel input may take an input's name: what the prologue returns for it
        role = f"kernel {op.role}" if op.kernel else op.role  # a kernel operand is a local of the function
        claim(op.name, role, op.loc)
        claim(op.name + "_ref", f"{role} ref", op.loc)
    for variant in spec.variants.values():
        for p in variant.params:
            claim(p.name, "param", p.loc)
        for s in variant.scratch:
            claim(s.name + "_ref", "scratch ref", s.loc)
    for dim in spec.dims:
        op = next(o for o in spec.inputs if any(e.source == dim for e in o.shape))
        claim(dim, "dim", op.loc)
    for axis in (a for v in spec.variants.values() for a in v.grid if a.name):
        claim(axis.name, "grid axis", axis.loc)  # the body receives it as a keyword argument
    for v in spec.variants.values():  # mesh kernels: these reach the body as keyword arguments too
        for axis in v.mesh:
            claim(axis.name, "mesh axis", axis.loc)
        for pipe in v.pipelines:
            claim(pipe.name, "pipeline", pipe.loc)
    if spec.mesh_sizes:  # a mesh-only spec's sized mesh axes are locals of its kernel and reference
        for axis in (a for a in spec.sharding.mesh if a.name in spec.mesh_sizes):
            claim(axis.name, "mesh axis", axis.loc)
    for c in spec.competitors:  # rendered as `<kernel>_<name>` beside `<kernel>_reference`
        if c.name == "reference":
            out.append(Diagnostic("E400", f"competitor `reference` would be generated as `{spec.name}_reference`, "
                                  "the reference's own name", c.loc, "rename the competitor"))
    return out


def _dtypes(spec: KernelSpec) -> list:
    out = []
    inputs = {o.name for o in spec.inputs}
    free = {o.name for o in spec.inputs if o.follows is None}
    share = "an operand can only share the dtype of an input that has a dtype of its own"
    for op in spec.operands:
        if op.follows is not None:
            if op.follows not in free:  # x: {dtype: x}, or a chain through another input
                message = f"{op.name}: dtype refers to input `{op.follows}`, which has no dtype of its own"
                out.append(Diagnostic("E407", message, op.dtype_loc, share))
            continue
        for name in op.dtypes:
            if name in dt.DTYPES:
                continue
            if name in {o.name for o in spec.outputs}:
                out.append(Diagnostic("E407", f"{op.name}: dtype refers to output `{name}`", op.dtype_loc, share))
                continue
            hint = did_you_mean(name, list(dt.DTYPES) + sorted(inputs))
            out.append(Diagnostic("E401", f"{op.name}: unknown dtype `{name}`", op.dtype_loc, hint))
    inputs |= {o.name for o in spec.kernel_only if o.role == Role.INPUT}  # a scratch buffer may take a kernel input's
    arrays = (ScratchKind.ARRAY, ScratchKind.ACCUMULATOR)
    for s in (s for v in spec.variants.values() for s in v.scratch if s.kind in arrays):
        if s.dtype is None and s.dtype_map is None:
            if s.kind == ScratchKind.ARRAY:  # an accumulator is float32 unless it says otherwise
                out.append(Diagnostic("E202", f"scratch {s.name}: an array buffer needs a dtype", s.loc))
        elif s.dtype is not None and s.dtype not in dt.DTYPES and s.dtype not in inputs:  # `dtype: x` follows input x
            hint = did_you_mean(s.dtype, list(dt.DTYPES) + sorted(inputs))
            out.append(Diagnostic("E401", f"scratch {s.name}: unknown dtype `{s.dtype}`", s.loc, hint))
    return out


def _dtype_maps(spec: KernelSpec) -> list:
    """E419, E401: a `{from: x, map: {...}}` dtype looks up an input with dtypes of its own, by
    known dtypes, with an entry for every dtype that input can take."""
    out = []
    free = {o.name: o for o in spec.inputs if o.follows is None}
    owners = [(f"{o.name}", o.dtype_map, o.dtype_loc) for o in spec.outputs if o.dtype_map is not None]
    owners += [(f"scratch {s.name}", s.dtype_map, s.loc) for v in spec.variants.values() for s in v.scratch
               if s.dtype_map is not None]
    seen = set()
    for label, m, loc in owners:
        if (label, loc) in seen:
            continue  # a base scratch buffer that every backend inherits: reported once
        seen.add((label, loc))
        for name in (*(k for k, _ in m.table), *m.targets):
            if name not in dt.DTYPES:
                out.append(Diagnostic("E401", f"{label}: unknown dtype `{name}` in its dtype map", loc,
                                      did_you_mean(name, list(dt.DTYPES))))
        source = free.get(m.source)
        if source is None:
            out.append(Diagnostic("E419", f"{label}: dtype map reads `{m.source}`, which is not an input with dtypes of its own",
                                  loc, did_you_mean(m.source, sorted(free)) or f"name one of: {', '.join(sorted(free))}"))
            continue
        missing = [d for d in source.dtypes if m.of(d) is None]
        if missing:
            out.append(Diagnostic("E419", f"{label}: dtype map has no entry for {m.source} of dtype {', '.join(missing)}",
                                  loc, f"add `{missing[0]}: <dtype>` to the map"))
    return out


# -- Python code --------------------------------------------------------------


def _code(spec: KernelSpec) -> list:
    out = _parse_code(spec.reference, "reference")
    for c in spec.competitors:
        out += _parse_code(c.body, f"competitor `{c.name}`")
    if spec.wrapper is not None:
        out += [d for what in ("prologue", "epilogue") if getattr(spec.wrapper, what) is not None
                for d in _parse_code(getattr(spec.wrapper, what), what)]
    out += [d for op in spec.inputs if op.init is not None and op.init.code is not None
            for d in _parse_code(op.init.code, f"{op.name}.init.code")]
    bodies = {v.body.origin: v.body for v in spec.variants.values()}
    for body in bodies.values():
        out += _parse_code(body, "body")
    return out


def _parse_code(code: Code, what: str) -> list:
    wrapped = "def _f():\n" + textwrap.indent(code.source, "    ", lambda line: True)
    try:
        tree = ast.parse(wrapped)
    except SyntaxError as e:
        line = max((e.lineno or 2) - 1, 1)
        col = max((e.offset or 1) - 1 - 4, 0)
        return [Diagnostic("E600", f"{what}: {e.msg}", code.loc_of(line, col))]
    except (RecursionError, MemoryError, ValueError):
        return [Diagnostic("E600", f"{what}: code too deeply nested", code.loc_of(1, 0))]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for mod in mods:
                if node.__class__ is ast.ImportFrom and node.level:
                    mod = "." + mod
                if mod.split(".")[0] not in ALLOWED_IMPORT_ROOTS:
                    out.append(
                        Diagnostic(
                            "E601",
                            f"{what}: import of `{mod}`",
                            code.loc_of(node.lineno - 1, max(node.col_offset - 4, 0)),
                            "generated modules may import only jax, numpy and the standard library",
                        )
                    )
    return out


# -- structure (per variant) ----------------------------------------------------


def _unknown(e: Expr | Any, allowed: set, what: str) -> list:
    if e is None:
        return []
    out = []
    for name in sorted(e.names - allowed):
        out.append(
            Diagnostic("E301", f"{what}: unknown name `{name}`", e.loc, did_you_mean(name, allowed))
        )
    return out


def _structure(spec: KernelSpec, v: Variant) -> list:
    out = []
    params = {p.name for p in v.params}
    dims = set(spec.dims)
    scope = params | dims
    for op in spec.operands:
        for e in op.shape:
            for name in sorted(e.names - scope - (set(spec.mesh_sizes) if op.role == "output" else set())):
                out.append(
                    Diagnostic(
                        "E408",
                        f"{op.name}: `{name}` is not a dim bound by an input shape, nor a param",
                        e.loc,
                        _mesh_axis_hint(spec, op, name) or "use it alone as a dim of some input's shape, or declare it under params",
                    )
                )
    for axis in v.grid:
        out += _unknown(axis.size, scope | set(spec.grid_scalars), "grid")
    for name, bound in spec.grid_scalars.items():
        out += _unknown(bound, scope, f"{name}.max")
    for c in spec.constraints:
        out += _unknown(c.expr, scope, "constraint")
    for c in v.constraints:
        out += _unknown(c.expr, scope, f"{v.backend} constraint")
    if v.shared_memory is not None:
        out += _unknown(v.shared_memory, scope, f"{v.backend} shared_memory")
        buffers = [o.name for o in spec.operands] + [s.name for s in v.scratch]
        for name in sorted(v.shared_memory.sized - set(buffers)):
            out.append(Diagnostic("E301", f"{v.backend} shared_memory: `itemsize({name})`: `{name}` is not an operand "
                                          "or scratch buffer of the kernel", v.shared_memory.loc, did_you_mean(name, buffers)))
    for p in v.params:
        if isinstance(p.default, Expr):  # evaluated per call, before any param is known
            out += _unknown(p.default, dims, f"default of param `{p.name}`")
    for key, value in v.compiler_params.items():
        if isinstance(value, Expr):
            out += _unknown(value, scope, f"compiler_params.{key}")
    for s in v.scratch:
        for e in s.shape:
            out += _unknown(e, scope, f"scratch {s.name}")
    operands = {o.name: o for o in spec.operands}
    for name, allowed in v.dtypes.items():
        op = operands.get(name)
        if op is None or op.role != Role.INPUT or op.follows is not None:
            out.append(
                Diagnostic(
                    "E407",
                    f"{v.backend}: dtypes restricts `{name}`, which is not an input with its own dtype",
                    v.loc,
                    did_you_mean(name, [o.name for o in spec.inputs if o.follows is None]),
                )
            )
        else:
            for d in allowed:
                if d not in op.dtypes:
                    out.append(
                        Diagnostic("E504", f"{v.backend}: dtypes allows {d} for {name}, which only takes {', '.join(op.dtypes)}", v.loc)
                    )
    for name, block in v.blocks.items():
        op = operands.get(name)
        if op is None:
            out.append(
                Diagnostic("E405", f"block spec for unknown operand `{name}`", block.loc, did_you_mean(name, operands))
            )
            continue
        if block.block_shape is None:
            continue  # memory_space without block_shape: the whole array
        for e in block.block_shape:
            out += _unknown(e, scope, f"{name}.block_shape")
        if len(block.block_shape) != op.rank:
            out.append(
                Diagnostic(
                    "E402",
                    f"{name}: block_shape has {len(block.block_shape)} dims but {name} has rank {op.rank}",
                    block.shape_loc,
                    "give one entry per array dim; null squeezes a dim",
                )
            )
        imap = block.index_map
        prefetched = [o.name for o in spec.prefetched]
        if len(imap.args) != len(v.grid) + len(prefetched):
            refs = f" and {_count(prefetched, 'scalar-prefetch ref', 'scalar-prefetch refs')}" if prefetched else ""
            out.append(
                Diagnostic(
                    "E403",
                    f"{name}: index_map takes {_count(imap.args, 'grid index', 'grid indices')} "
                    f"but the grid has {_count(v.grid, 'axis', 'axes')}{refs}",
                    imap.loc,
                    f"write one name per grid axis, e.g. `{', '.join(list('ijklmn'[: len(v.grid)]) + prefetched) or ''} -> ...`",
                )
            )
        if len(imap.results) != len(block.block_shape):
            out.append(
                Diagnostic(
                    "E404",
                    f"{name}: index_map returns {_count(imap.results, 'block index', 'block indices')} "
                    f"but the block has {_count(block.block_shape, 'dim', 'dims')}",
                    imap.loc,
                    "return one block index per dim of block_shape",
                )
            )
        out += _unknown_map(imap, scope, name)
    return out


def _mesh_axis_hint(spec: KernelSpec, op, name: str) -> str | None:
    """E408's help for a mesh axis named in a shape: where its size may be read."""
    sh = spec.sharding
    axis = next((a for a in sh.mesh if a.name == name), None) if sh is not None else None
    if axis is None:
        return None
    if op.role != "output":
        return "a mesh axis size may be read in output shapes only"
    if axis.size is None:
        return f"mesh axis {name} is sized by the device count; give it a size to read it in a shape"
    return "a mesh axis size may be read in the output shapes of a spec with `sharding.mesh_only: true`"


def _prefetch(spec: KernelSpec) -> list:
    """E410: a scalar-prefetch input is an integer array (of rank 1 or more) with an index initialiser and no block."""
    out = []
    for op in spec.prefetched:
        dtypes = op.dtypes or next(o.dtypes for o in spec.inputs if o.name == op.follows) or ()
        problems = []
        if op.rank == 0:
            problems.append("has rank 0; give it shape [1]")
        if any(dt.DTYPES.get(d, (0, ""))[1] not in ("i", "u") for d in dtypes):
            problems.append(f"has dtype {', '.join(dtypes)}, not an integer type")
        if op.init is None or op.init.kind != InitKind.INDEX:
            problems.append("has no `init: {kind: index, ...}` saying what values it holds")
        for v in spec.variants.values():
            if op.name in v.blocks:
                problems.append(f"has a block spec ({v.backend}); it is passed whole, to SMEM")
        if op.max is not None and [e.constant for e in op.shape] != [1]:
            problems.append(f"has `max` (a grid extent) but shape [{', '.join(e.shown for e in op.shape)}], not [1]")
        for p in problems:
            out.append(
                Diagnostic(
                    "E410",
                    f"scalar-prefetch input {op.name} {p}",
                    op.loc,
                    "a prefetched input holds indices: a shape such as [n] or [B, n], an int dtype, init {kind: index, bound: ...}",
                )
            )
    for op in (o for o in spec.inputs if o.kernel and o.init is not None and not o.prefetch):
        out.append(Diagnostic("E410", f"kernel input {op.name} has `init` but is not scalar-prefetched", op.loc,
                              "the prologue makes a kernel input: `init` gives the range of a prefetched one's values"))
    for op in (o for o in spec.inputs if o.max is not None and not o.prefetch):
        out.append(Diagnostic("E410", f"input {op.name} has `max` but is not scalar-prefetched", op.loc,
                              "a grid extent read in the kernel is a `prefetch: true` input of shape [1]"))
    return out


def _inits(spec: KernelSpec) -> list:
    """E411: initialisers name real operands and dims, and make sense for the dtype."""
    out = _init_structure.check(spec)
    # an index initialiser's low and bound may read other inputs' values too
    scope = set(spec.dims) | {p.name for v in spec.variants.values() for p in v.params} | {o.name for o in spec.inputs}
    for op in spec.inputs:
        out += _input_kinds(spec, op)
        init = op.init
        if init is None:
            continue
        what = f"{op.name}.init"
        if init.kind == InitKind.INDEX:
            target = spec.operand(init.of) if init.of else None
            if init.of is None and init.bound_expr is None:
                out.append(Diagnostic("E411", f"{what}: an index initialiser needs `bound` or `of`", init.loc))
            elif init.of is not None and target is None:
                out.append(
                    Diagnostic("E411", f"{what}: `of` names unknown operand `{init.of}`", init.loc,
                               did_you_mean(init.of, [o.name for o in spec.operands]))
                )
            elif target is not None and init.dim >= target.rank:
                out.append(Diagnostic("E411", f"{what}: dim {init.dim} of {init.of}, which has rank {target.rank}", init.loc))
            for e in (init.low_expr, init.bound_expr):
                out += [dataclasses.replace(d, code="E411") for d in _unknown(e, scope, what)]
        if init.kind == InitKind.UNIFORM and init.low >= init.high:
            out.append(Diagnostic("E411", f"{what}: low {init.low:g} is not below high {init.high:g}", init.loc))
    return out


def _input_kinds(spec: KernelSpec, op) -> list:
    """E411: `kinds` (the input kinds verify runs besides normal data) on an input that can take them."""
    if not op.kinds:
        return []
    dtypes = op.dtypes or next((o.dtypes for o in spec.inputs if o.name == op.follows), None) or ()
    if op.prefetch:
        why = "a scalar-prefetch input holds indices"
    elif dtypes and all(d == "bool" for d in dtypes):
        why = "a bool input has only its normal data"
    else:
        return []
    return [Diagnostic("E411", f"{op.name}.kinds: {why}; it takes no input kinds", op.kinds_loc, "drop `kinds`, or write `kinds: []`")]


def _aliases(spec: KernelSpec) -> list:
    """E412: each alias pairs an output with a distinct input of the same shape and dtype."""
    out = []
    seen: dict = {}
    for o_name, i_name in spec.aliases.items():
        o, i = spec.operand(o_name), spec.operand(i_name)
        problem = None
        if o is None or o.role != Role.OUTPUT:
            problem = f"`{o_name}` is not an output", did_you_mean(o_name, [x.name for x in spec.outputs])
        elif i is None or i.role != Role.INPUT:
            problem = f"`{i_name}` is not an input", did_you_mean(i_name, [x.name for x in spec.inputs])
        elif i_name in seen:
            problem = f"input {i_name} is aliased to both {seen[i_name]} and {o_name}", None
        elif i.prefetch:
            problem = f"input {i_name} is a scalar-prefetch input", None
        elif [e.source for e in o.shape] != [e.source for e in i.shape]:
            shown = lambda x: "[" + ", ".join(e.source for e in x.shape) + "]"
            problem = f"output {o_name} has shape {shown(o)} but input {i_name} has {shown(i)}", None
        elif _dtype_root(spec, o) != _dtype_root(spec, i):
            problem = f"output {o_name} and input {i_name} may differ in dtype", f"write `dtype: {i.follows or i_name}` for {o_name}"
        seen.setdefault(i_name, o_name)
        if problem:
            message, hint = problem
            out.append(Diagnostic("E412", f"input_output_aliases: {message}", spec.aliases_loc,
                                  hint or "alias an output to an input of the same shape and dtype"))
    for v in spec.variants.values():
        if spec.aliases and not BACKENDS[v.backend].aliases:
            out.append(Diagnostic("E412", f"input_output_aliases: the {v.backend} backend does not alias buffers", spec.aliases_loc,
                                  "drop the alias or this backend"))
    return out


def _residuals(spec: KernelSpec) -> list:
    """E416 to E418: a residual output (`residual: true`) is saved for a backward pass that
    takes it, and the kernel still returns something."""
    residual = [o for o in spec.outputs if o.residual]
    out = []
    for o in residual:
        if spec.vjp is None:
            out.append(Diagnostic("E416", f"output `{o.name}` is `residual: true` but {spec.name} has no `vjp:` section",
                                  o.residual_loc, "a residual output exists for the backward pass: add a `vjp:` "
                                  f"that saves `{o.name}` in vjp.residuals, or drop `residual: true`"))
        elif o.name not in spec.vjp.residuals:
            out.append(Diagnostic("E417", f"output `{o.name}` is `residual: true` but vjp.residuals does not save it",
                                  o.residual_loc, f"add `{o.name}` to vjp.residuals and bind it to a backward kernel's "
                                  "input, or drop `residual: true`"))
    if residual and len(residual) == len(spec.outputs):
        names = ", ".join(o.name for o in residual)
        out.append(Diagnostic("E418", f"every output of {spec.name} is `residual: true` ({names}): it would return nothing",
                              residual[0].residual_loc, "leave at least one output without `residual: true`"))
    return out


def _dtype_root(spec: KernelSpec, op):
    """What decides an operand's dtype: a fixed dtype, or the input whose choice it takes."""
    if op.follows:
        op = spec.operand(op.follows)
    return (op.dtypes[0],) if len(op.dtypes) == 1 or op.role == Role.OUTPUT else op.name


def _backend_surface(spec: KernelSpec, v: Variant) -> list:
    """E410, E413, E414: block kinds, memory spaces, pipeline modes, prefetch and scratch kinds the backend takes."""
    backend = BACKENDS[v.backend]
    out = []
    if spec.prefetched and not backend.prefetch:
        names = ", ".join(o.name for o in spec.prefetched)
        out.append(Diagnostic("E410", f"{v.backend}: scalar prefetch ({names}) needs a TPU-style backend", v.loc,
                              "use the mosaic_tpu or interpret backend for this kernel"))
    for name, block in v.blocks.items():
        where = f"{v.backend}: {name}"
        if block.block_shape is not None:
            for d in range(len(block.block_shape)):
                if block.kind(d) not in backend.block_kinds:
                    out.append(Diagnostic("E413", f"{where}: block dim {d} is {block.kind(d)}, which {v.backend} does not take",
                                          block.shape_loc, f"{v.backend} takes {', '.join(backend.block_kinds)} dims"))
                elif block.kind(d) == DimKind.ELEMENT and any(block.padding[d]) and not backend.element_padding:
                    out.append(Diagnostic("E413", f"{where}: block dim {d} is element with padding {list(block.padding[d])}, "
                                          f"which {v.backend} does not take", block.shape_loc,
                                          f"{v.backend} takes element dims without padding: drop `padding`, or pad the "
                                          "array before the call"))
        if block.memory_space is not None and block.memory_space not in backend.memory_spaces:
            allowed = ", ".join(backend.memory_spaces) or "none"
            out.append(Diagnostic("E413", f"{where}: memory_space {block.memory_space} is not one of {v.backend}'s", block.loc,
                                  f"memory spaces on {v.backend}: {allowed}"))
        if block.buffers is not None and not backend.pipeline_mode:
            out.append(Diagnostic("E413", f"{where}: pipeline_mode is not supported by {v.backend}", block.loc,
                                  "mosaic_tpu and interpret take pipeline_mode; on mosaic_gpu use max_concurrent_steps"))
    clusters = {a.name for a in v.mesh_axes(MeshRole.CLUSTER)}
    for s in v.scratch:
        if s.kind not in backend.scratch_kinds:
            out.append(Diagnostic("E414", f"{v.backend}: scratch {s.name} is a {s.kind}, which {v.backend} does not have", s.loc,
                                  f"scratch kinds on {v.backend}: {', '.join(backend.scratch_kinds)}"))
        for axis in s.collective_axes:
            problem = (
                "only a barrier spans a cluster" if s.kind != ScratchKind.BARRIER
                else f"`{axis}` is not a cluster axis of the mesh" if axis not in clusters
                else None
            )
            if problem:
                out.append(Diagnostic("E432", f"{v.backend}: scratch {s.name} collective_axes [{axis}]: {problem}", s.loc,
                                      "give a barrier of a mesh kernel the `mesh.cluster` axis whose CTAs all arrive on it"))
    return out


def _count(items, one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def _unknown_map(imap, scope: set, name: str) -> list:
    allowed = scope | set(imap.args)
    return [
        Diagnostic("E301", f"{name}.index_map: unknown name `{n}`", imap.loc, did_you_mean(n, allowed))
        for n in sorted(imap.names - allowed)
    ]


# -- cases --------------------------------------------------------------------


def _case_bindings(spec: KernelSpec, case: Case) -> list:
    out = []
    for dim in spec.dims:
        if dim not in case.dims:
            out.append(Diagnostic("E500", f"case `{case.name}` does not bind dim `{dim}`", case.loc, f"add `{dim}: <int>`"))
    for key in case.dims:
        if key not in spec.dims:
            out.append(
                Diagnostic(
                    "E500",
                    f"case `{case.name}` binds `{key}`, which is not a dim (dims: {', '.join(spec.dims) or 'none'})",
                    case.loc,
                    did_you_mean(key, spec.dims),
                )
            )
    all_params = {p.name for v in spec.variants.values() for p in v.params}
    nullable = {p.name for v in spec.variants.values() for p in v.params if p.default is None}
    for key, value in case.params.items():
        if key not in all_params:
            out.append(Diagnostic("E500", f"case `{case.name}` sets `{key}`, which is not a param", case.loc))
        elif value is None and key not in nullable:
            out.append(Diagnostic("E500", f"case `{case.name}` sets `{key}` to null, but its default is not null",
                                  case.loc, "only a param with `default: null` takes None"))
    for name in case.backends:
        if name not in spec.variants:
            out.append(Diagnostic("E500", f"case `{case.name}` runs on backend `{name}`, which the spec does not "
                                  f"generate (backends: {', '.join(spec.variants)})", case.loc,
                                  did_you_mean(name, list(spec.variants))))
    competitors = [c.name for c in spec.competitors]
    for name in case.min_speedup_over:
        if name not in competitors:
            out.append(Diagnostic(
                "E509", f"case `{case.name}`: min_speedup_over names `{name}`, which is not a competitor "
                f"(competitors: {', '.join(competitors) or 'none'})",
                case.min_speedup_over_locs.get(name, case.loc), did_you_mean(name, competitors)))
    out += _case_dtypes(spec, case)
    return out


def _families(spec: KernelSpec) -> list:
    """Each family's shapes bind the spec's dims and params, and meet its constraints over dims
    (E501). The backends' rules are not applied: the dispatcher passes over a backend that
    cannot run a shape, which is what a sweep measures. One diagnostic per family and problem."""
    out = []
    dims = set(spec.dims)
    for family in spec.families:
        seen = set()
        for case in family.cases:
            for d in _case_bindings(spec, case) + _dims_constraints(spec, case, dims):
                key = (d.code, re.sub(r"case `[^`]*`( \([^)]*\))?", "", d.message))
                if key not in seen:
                    seen.add(key)
                    out.append(d)
    return out


def _dims_constraints(spec: KernelSpec, case: Case, dims: set) -> list:
    out = []
    for c in spec.constraints:
        if not c.expr.names <= dims or not all(d in case.dims for d in c.expr.names):
            continue
        try:
            ok = c.expr.eval(case.dims)
        except ExprError:
            continue
        if ok is False:
            values = ", ".join(f"{n}={case.dims[n]}" for n in sorted(c.expr.names))
            shown = c.message or f"`{c.expr.shown}` does not hold"
            out.append(Diagnostic("E501", f"case `{case.name}` ({values}): {shown}", case.loc,
                                  f"constraint at line {c.loc.line}; leave the shape out of the family"))
    return out


def _case_dtypes(spec: KernelSpec, case: Case) -> list:
    out = []
    free = {o.name: o for o in spec.inputs if o.follows is None}
    if isinstance(case.dtype, str):
        for op in free.values():
            if len(op.dtypes) > 1 and case.dtype not in op.dtypes:
                out.append(
                    Diagnostic(
                        "E504",
                        f"case `{case.name}`: dtype {case.dtype} is not allowed for {op.name} ({', '.join(op.dtypes)})",
                        case.loc,
                    )
                )
        if not any(len(op.dtypes) > 1 for op in free.values()) and not any(
            case.dtype in op.dtypes for op in free.values()
        ):
            out.append(Diagnostic("E504", f"case `{case.name}`: no input takes dtype {case.dtype}", case.loc))
    elif isinstance(case.dtype, dict):
        for name, value in case.dtype.items():
            op = free.get(name)
            if op is None:
                out.append(Diagnostic("E504", f"case `{case.name}`: `{name}` is not an input with its own dtype", case.loc))
            elif value not in op.dtypes:
                out.append(
                    Diagnostic(
                        "E504",
                        f"case `{case.name}`: dtype {value} is not allowed for {name} ({', '.join(op.dtypes)})",
                        case.loc,
                    )
                )
    if not out:
        count = dtype_combinations(spec, case)
        if count > MAX_DTYPE_COMBINATIONS:
            many = [(name, options) for name, options in _dtype_choices(spec, case) if len(options) > 1]
            shown = ", ".join(f"{name} ({len(options)})" for name, options in many[:8]) + (", ..." if len(many) > 8 else "")
            out.append(
                Diagnostic(
                    "E507",
                    f"case `{case.name}` runs {count} dtype combinations; at most {MAX_DTYPE_COMBINATIONS} allowed",
                    case.loc,
                    f"pin some inputs' dtypes in the case, e.g. `dtype: {{{many[0][0]}: {many[0][1][0]}}}`, "
                    f"or give them fewer choices: {shown}",
                )
            )
    return out


