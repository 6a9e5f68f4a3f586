"""Checks of the `vjp:` section: the kernel's gradient, computed by backward kernels that are specs.

`check(spec, linked)` reports E421 to E425 and E427 to E429: names, the binding of each
backward kernel's inputs, params and outputs, and, per case and dtype, that the backward
kernels take the shapes and dtypes the forward pass gives them and give back gradients
shaped like the inputs. The section's model is codegen/spec/vjp.py.
The backward specs are other files: `pipeline` loads and checks them (E420 when one
cannot be used, E426 for a cycle) and passes the valid ones here as `linked`.
A residual output (`residual: true`) may be saved and bound like any output, but it is not
returned, so it has no cotangent; semantic.py checks that it is saved (E416 to E418).
"""

from __future__ import annotations

from collections.abc import Mapping

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.checks import instances
from kspec.codegen.spec import model
from kspec.codegen.backends import rules
from kspec.codegen.backends import AUTO, BACKENDS
from kspec.codegen.diagnostics import Diagnostic, Location, did_you_mean
from kspec.codegen.spec.expr import ExprError, NotEvaluable
from kspec.codegen.spec.vjp import Backward, Binding
from kspec.codegen.spec.model import Role

# -- diagnostics for backward specs that pipeline could not link -------------------


def unreadable(entry: Backward, reason: str) -> Diagnostic:
    return Diagnostic("E420", f"backward spec `{entry.spec}` cannot be read: {reason}", entry.loc,
                      "name a spec file in the same folder as this one")


def invalid(entry: Backward, errors: int) -> Diagnostic:
    return Diagnostic("E420", f"backward spec `{entry.spec}` has {errors} error(s), reported in that file",
                      entry.loc, "fix the backward spec first")


def cycle(entry: Backward, chain: list) -> Diagnostic:
    return Diagnostic("E426", f"backward spec `{entry.spec}` closes a cycle: {' -> '.join(chain)}",
                      entry.loc, "a backward kernel may have a vjp of its own, but no spec can be its own backward kernel, directly or not")


# -- checks ---------------------------------------------------------------------


def check(spec, linked: Mapping[int, object], per_case: bool = True) -> list:
    """E421 to E425 and E427 to E429 for the spec's vjp. `linked`: backward entry index ->
    the backward KernelSpec, for the entries pipeline could load and check; the per-case
    checks run only with `per_case` (the caller turns them off while the spec has errors)."""
    out = _names(spec)
    for n, entry in enumerate(spec.vjp.backward):
        bspec = linked.get(n)
        if bspec is None:
            continue
        found = _against(spec, entry, bspec)
        if not found and per_case and not out:
            found = _cases(spec, entry, bspec)
        out += found
    seen, unique = set(), []
    for d in out:
        if (d.loc, d.code, d.message) not in seen:
            seen.add((d.loc, d.code, d.message))
            unique.append(d)
    return sorted(unique, key=lambda d: (d.loc, d.code))


def _own(spec, op):
    """The operand whose dtypes are op's: op, or the input it follows; None when that is
    not an input with dtypes of its own (E407 reports it)."""
    if op.follows is None:
        return op
    source = spec.operand(op.follows)
    return source if source is not None and source.follows is None else None


def _floating(spec, op) -> bool:
    """Whether the operand can have a floating-point dtype."""
    own = _own(spec, op)
    return own is not None and any(dt.DTYPES.get(d, (0, ""))[1] in "fc" for d in own.dtypes)


def _root(spec, op) -> tuple | None:
    """What decides an operand's dtype: ("fixed", dtype) or ("input", the input whose choice it takes)."""
    own = _own(spec, op)
    if own is None:
        return None
    if len(own.dtypes) == 1 or own.role == Role.OUTPUT:
        return ("fixed", own.dtypes[0])
    return ("input", own.name)


def dtype_witness(spec, name: str) -> tuple | None:
    """How the backward pass knows input `name`'s dtype: ("fixed", dtype), ("residual", r) or
    ("cotangent", output), something with the same dtype that it has; None if nothing."""
    root = _root(spec, spec.operand(name))
    if root is None or root[0] == "fixed":
        return root
    for r in spec.vjp.residuals:
        if spec.operand(r) is not None and _root(spec, spec.operand(r)) == root:
            return ("residual", r)
    for o in spec.returned:  # a residual output has no cotangent
        if _root(spec, o) == root:
            return ("cotangent", o.name)
    return None


def _names(spec) -> list:
    """What the section says about this spec alone: residuals, bindings, params and grads."""
    vjp, out = spec.vjp, []
    operands = [o.name for o in spec.operands]
    inputs = [o.name for o in spec.inputs]
    for r, loc in vjp.residual_locs.items():
        if r not in operands:
            out.append(Diagnostic("E421", f"vjp.residuals: `{r}` is not an input or output of {spec.name}", loc,
                                  did_you_mean(r, operands)))
    for name, loc in vjp.no_grad_locs.items():
        if name not in inputs:
            out.append(Diagnostic("E421", f"vjp.no_grad: `{name}` is not an input of {spec.name}", loc,
                                  did_you_mean(name, inputs)))
    used, fed, owner = set(), set(), {}
    for entry in vjp.backward:
        for b in entry.inputs:
            out += _binding(spec, entry, b)
            (fed if b.cotangent else used).add(b.source)
        for bparam, fparam in entry.params.items():
            out += _param(spec, entry, fparam, entry.param_locs[bparam])
        for g in entry.grads:
            op = spec.operand(g.input)
            where = f"{entry.spec}: grads: {g.output}"
            if op is None:
                out.append(Diagnostic("E421", f"{where}: `{g.input}` is not an input of {spec.name}", g.loc,
                                      did_you_mean(g.input, inputs)))
            elif op.role == Role.OUTPUT:
                out.append(Diagnostic("E423", f"{where}: `{g.input}` is an output of {spec.name}; gradients are for inputs",
                                      g.loc))
            elif _own(spec, op) is not None and not _floating(spec, op):
                out.append(Diagnostic("E423", f"{where}: input `{g.input}` is not floating-point, so it has no gradient",
                                      g.loc, "leave it out: integer and boolean inputs get no gradient"))
            elif g.input in vjp.no_grad:
                out.append(Diagnostic("E423", f"{where}: input `{g.input}` is listed in vjp.no_grad", g.loc,
                                      "drop it from vjp.no_grad or from grads"))
            elif g.input in owner:
                out.append(Diagnostic("E423", f"{where}: input `{g.input}` already gets its gradient from {owner[g.input]}",
                                      g.loc, "give each input one gradient"))
            else:
                owner[g.input] = f"{entry.spec} ({g.output})"
                if g.reduce and _root(spec, op) is not None and dtype_witness(spec, g.input) is None:
                    out.append(Diagnostic("E424", f"{where}: the backward pass cannot tell `{g.input}`'s dtype, which the "
                                          "summed partials are cast to", g.loc,
                                          f"save `{g.input}` or an input it takes its dtype from in vjp.residuals"))
    for r, loc in vjp.residual_locs.items():
        if r in operands and r not in used:
            out.append(Diagnostic("E422", f"vjp.residuals: `{r}` is saved but no backward kernel takes it", loc,
                                  "drop it from vjp.residuals"))
    for o in spec.returned:
        if _floating(spec, o) and o.name not in fed:
            out.append(Diagnostic("E422", f"vjp: no backward kernel takes grad({o.name}), the cotangent of output {o.name}",
                                  vjp.loc, f"bind grad({o.name}) to an input of a backward kernel"))
    for op in spec.inputs:
        if _floating(spec, op) and op.name not in owner and op.name not in vjp.no_grad:
            out.append(Diagnostic("E425", f"vjp: input `{op.name}` is floating-point but no backward kernel gives its gradient",
                                  vjp.loc, f"assign a backward output to `{op.name}` under grads, or list it in vjp.no_grad"))
    return out


def _binding(spec, entry: Backward, b: Binding) -> list:
    where = f"{entry.spec}: inputs: {b.target}"
    if b.source is None:
        return [Diagnostic("E422", f"{where}: `{b.text}` is neither a residual nor grad(<output>)", b.loc,
                           "write a residual's name, or grad(y) for the cotangent of output y")]
    op = spec.operand(b.source)
    if b.cotangent:
        if op is None or op.role != Role.OUTPUT:
            return [Diagnostic("E421", f"{where}: `{b.source}` in `{b.text}` is not an output of {spec.name}", b.loc,
                               did_you_mean(b.source, [o.name for o in spec.returned]))]
        if op.residual:
            return [Diagnostic("E422", f"{where}: output `{b.source}` is `residual: true`, so it is not returned and "
                               f"`{b.text}` does not exist", b.loc, f"bind `{b.source}` itself, the saved residual")]
        return []
    if op is None:
        return [Diagnostic("E421", f"{where}: `{b.source}` is not an input or output of {spec.name}", b.loc,
                           did_you_mean(b.source, [o.name for o in spec.operands]))]
    if b.source not in spec.vjp.residuals:
        return [Diagnostic("E422", f"{where}: `{b.source}` is not saved for the backward pass", b.loc,
                           f"add `{b.source}` to vjp.residuals")]
    return []


def _param(spec, entry: Backward, fparam: str, loc: Location) -> list:
    where = f"{entry.spec}: params"
    for v in spec.variants.values():
        p = next((p for p in v.params if p.name == fparam), None)
        if p is None:
            known = [p.name for p in v.params]
            return [Diagnostic("E421", f"{where}: `{fparam}` is not a param of {spec.name} ({v.backend})", loc,
                               did_you_mean(fparam, known))]
        if p.choices:
            return [Diagnostic("E422", f"{where}: `{fparam}` has choices ({v.backend}), so its value is tuned per call",
                               loc, "pass on only params without choices")]
    return []


def bound_inputs(entry: Backward, bspec) -> list:
    """The backward spec's inputs the entry binds: all but the optional ones it leaves out (None)."""
    return [op for op in bspec.inputs if entry.binding(op.name) is not None]


def _against(spec, entry: Backward, bspec) -> list:
    """The entry against the backward spec: every input bound, names that exist, backends."""
    out = []
    binputs = [o.name for o in bspec.inputs]
    boutputs = [o.name for o in bspec.outputs]
    for b in entry.inputs:
        if b.target not in binputs:
            out.append(Diagnostic("E422", f"{entry.spec}: inputs: `{b.target}` is not an input of {bspec.name}", b.loc,
                                  did_you_mean(b.target, binputs)))
    for name in binputs:
        if entry.binding(name) is None and not bspec.operand(name).optional:  # an optional one left unbound gets None
            out.append(Diagnostic("E422", f"{entry.spec}: input `{name}` of {bspec.name} is not bound", entry.inputs_loc,
                                  "bind it to a residual or to grad(<output>)"))
    bparams = {p.name for v in bspec.variants.values() for p in v.params}
    for name, loc in entry.param_locs.items():
        if name not in bparams:
            out.append(Diagnostic("E422", f"{entry.spec}: params: `{name}` is not a param of {bspec.name}", loc,
                                  did_you_mean(name, bparams)))
    assigned = {g.output for g in entry.grads}
    for g in entry.grads:
        if g.output not in boutputs:
            out.append(Diagnostic("E423", f"{entry.spec}: grads: `{g.output}` is not an output of {bspec.name}", g.loc,
                                  did_you_mean(g.output, boutputs)))
    for name in boutputs:
        if name not in assigned:
            out.append(Diagnostic("E423", f"{entry.spec}: output `{name}` of {bspec.name} is not assigned to an input",
                                  entry.grads_loc, "name the input it is the gradient of under grads"))
    for backend in spec.backends:
        missing = [p for p, chosen in backward_backends(bspec, backend).items() if chosen is None]
        if missing:
            out.append(Diagnostic("E429", f"{entry.spec}: {bspec.name} has no backend for {_count(missing, 'platform')} "
                                  f"{', '.join(missing)}, where this kernel's {backend} backend runs", entry.loc,
                                  f"add `{backend}` to the backends of {entry.spec}"))
    return out


def _count(items: list, word: str) -> str:
    return word if len(items) == 1 else word + "s"


def backward_backends(bspec, backend: str) -> dict:
    """{platform: the backward kernel's backend} when the forward runs `backend` there: the
    same backend if the backward spec declares it, else its backend="auto" choice (None: none)."""
    platforms = BACKENDS[backend].platforms
    if backend in bspec.variants:
        return {p: backend for p in platforms}
    return {p: next((b for b in bspec.backends if b in AUTO.get(p, ())), None) for p in platforms}


# -- per case -------------------------------------------------------------------


def _cases(spec, entry: Backward, bspec) -> list:
    """E424, E427 and E428 for every case and bench case, and every dtype combination."""

    out = []
    budget = [instances.MAX_SPEC_GRID_POINTS]
    for case in spec.cases + spec.bench:
        shapes = _forward_shapes(spec, case)
        if shapes is None:
            continue  # the spec's own checks report it
        bdims = _backward_dims(entry, bspec, shapes)
        for backend in dict.fromkeys(b for f in spec.backends for b in backward_backends(bspec, f).values() if b):
            env = dict(_defaults(bspec.variants[backend], bdims), **bdims)
            env.update({bp: _param_value(spec, case, fp) for bp, fp in entry.params.items()})
            out += _shapes(entry, bspec, case, shapes, env)
        if out:
            return out
        for assign in instances.dtype_assignments(spec, case):
            found = _dtypes(entry, bspec, case, assign)
            out += found
            if not found:
                out += _runs(spec, entry, bspec, case, assign, bdims, budget)
    return out


def _defaults(variant, dims: dict) -> dict:
    """The variant's param defaults at these dims (an expression default that fails is left out:
    the spec's own checks report it)."""
    out = dict(variant.param_defaults)
    for p in variant.params:
        if p.name not in out:
            try:
                out[p.name] = p.default_at(dims)
            except (ExprError, NotEvaluable):
                pass
    return out


def _param_value(spec, case, name: str):
    base = next(iter(spec.variants.values()))
    return case.params.get(name, _defaults(base, case.dims).get(name))


def _forward_shapes(spec, case) -> dict | None:
    base = next(iter(spec.variants.values()))
    env = _defaults(base, case.dims)
    env.update({k: v for k, v in case.params.items() if k in {p.name for p in base.params}})
    env.update(case.dims)
    try:
        return {op.name: tuple(e.eval(env) for e in op.shape) for op in spec.operands}
    except (ExprError, NotEvaluable, KeyError):
        return None


def _backward_dims(entry: Backward, bspec, shapes: dict) -> dict:
    """The backward kernel's dims, read from the shapes its inputs are bound to."""
    dims: dict = {}
    for op in bound_inputs(entry, bspec):
        b = entry.binding(op.name)
        for e, n in zip(op.shape, shapes[b.source]):
            if e.source in bspec.dims:
                dims.setdefault(e.source, n)
    return dims


def _eval_shape(op, env: dict):
    try:
        return tuple(e.eval(env) for e in op.shape)
    except (ExprError, NotEvaluable):
        return None


def _shown(op) -> str:
    return "[" + ", ".join(e.source for e in op.shape) + "]"


def _shapes(entry: Backward, bspec, case, shapes: dict, env: dict) -> list:
    out = []
    for op in bound_inputs(entry, bspec):
        b = entry.binding(op.name)
        want, got = _eval_shape(op, env), shapes[b.source]
        if want != got:
            shown = want if want is not None else _shown(op)
            out.append(Diagnostic("E427", f"case `{case.name}`: {bspec.name} input {op.name} is {_shown(op)} = {shown}, "
                                  f"but `{b.text}` has shape {got}", b.loc,
                                  f"bind {op.name} to a value of shape {_shown(op)}"))
    for g in entry.grads:
        op = bspec.operand(g.output)
        got, want = _eval_shape(op, env), shapes[g.input]
        if got is None:
            continue
        if g.reduce and (len(got) <= len(want) or got[len(got) - len(want):] != want):
            out.append(Diagnostic("E424", f"case `{case.name}`: {bspec.name} output {op.name} is {got}; summed over "
                                  f"its leading axes it must give {g.input}'s shape {want}", g.loc,
                                  f"make {op.name} the shape of {g.input} with leading axes of partial sums"))
        elif not g.reduce and got != want:
            out.append(Diagnostic("E424", f"case `{case.name}`: {bspec.name} output {op.name} is {got} but input "
                                  f"{g.input} is {want}", g.loc,
                                  f"a gradient has its input's shape; use `{{input: {g.input}, reduce: sum}}` for partial sums"))
    return out


def _backward_dtypes(entry: Backward, bspec, assign: dict) -> dict:
    """The backward kernel's operand dtypes, from the dtypes of what its inputs are bound to."""
    out = {op.name: assign[entry.binding(op.name).source] for op in bound_inputs(entry, bspec)}
    for op in bspec.outputs:
        if op.dtype_map is not None:
            out[op.name] = op.dtype_map.of(out[op.dtype_map.source])
        else:
            out[op.name] = out[op.follows] if op.follows else op.dtypes[0]
    return out


def _dtypes(entry: Backward, bspec, case, assign: dict) -> list:
    out = []
    bdtypes = _backward_dtypes(entry, bspec, assign)
    for op in bound_inputs(entry, bspec):
        got = bdtypes[op.name]
        allowed = (bdtypes[op.follows],) if op.follows else op.dtypes
        if got not in allowed:
            b = entry.binding(op.name)
            takes = f"takes {op.follows}'s dtype ({allowed[0]})" if op.follows else f"takes {', '.join(allowed)}"
            hint = f"bind {op.name} and {op.follows} to values of one dtype" if op.follows else f"let {op.name} take {got}"
            out.append(Diagnostic("E427", f"case `{case.name}`: {bspec.name} input {op.name} {takes}, but `{b.text}` is {got}",
                                  b.loc, hint))
    if out:
        return out
    for g in entry.grads:
        got, want = bdtypes[g.output], assign[g.input]
        if g.reduce and not dt.is_float(got):
            out.append(Diagnostic("E424", f"case `{case.name}`: {bspec.name} output {g.output} is {got}, not "
                                  "floating-point partial sums", g.loc, "write the partial sums in float32"))
        elif not g.reduce and got != want:
            out.append(Diagnostic("E424", f"case `{case.name}`: {bspec.name} output {g.output} is {got} but input "
                                  f"{g.input} is {want}", g.loc, "a gradient has the dtype of its input"))
    return out


def _runs(spec, entry: Backward, bspec, case, assign: dict, bdims: dict, budget: list) -> list:
    """E428: the backward kernels' own checks on the problem this forward case gives them."""

    bdtypes = _backward_dtypes(entry, bspec, assign)
    bound = bound_inputs(entry, bspec)
    bcase = model.Case(
        case.name, bdims, {op.name: bdtypes[op.name] for op in bound if op.follows is None},
        {bp: _param_value(spec, case, fp) for bp, fp in entry.params.items()}, {}, case.loc,
        absent=tuple(op.name for op in bspec.inputs if op not in bound),
    )
    label = ",".join(dict.fromkeys(assign[o.name] for o in spec.inputs))
    out = []
    for forward, variant in spec.variants.items():
        if not variant.supports(assign):
            continue
        for backend in dict.fromkeys(b for b in backward_backends(bspec, forward).values() if b):
            bvariant = bspec.variants[backend]
            where = f"case `{case.name}` ({label}): backward kernel {bspec.name} ({backend})"
            if not bvariant.supports(bdtypes):
                out.append(Diagnostic("E428", f"{where} does not take these dtypes", case.loc,
                                      f"allow them in {entry.spec}'s backends.{backend}.dtypes"))
                continue
            # The pallas_call's operands: a backward spec with a prologue runs its kernel on its own.
            inst, found = instances.instantiate(bspec.kernel_view, bvariant, bcase, instances.completed(bspec, bdtypes),
                                                budget=budget)
            found += rules.check(inst) if inst is not None else []
            out += [Diagnostic("E428", f"{where} cannot run it: {d.message} [{d.code}]", case.loc,
                               f"in {entry.spec}: {d.hint}" if d.hint else f"see {d.loc}")
                    for d in found if d.severity == "error"]
    return out
