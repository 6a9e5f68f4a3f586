"""The modules around the kernels: the package's __init__.py, reference.py (the reference and
the competitors), _tuning.py (the tuned table) and _dispatch.py (what each backend needs of
a call)."""

from __future__ import annotations

from kspec.codegen.backends import AUTO, BACKENDS
from kspec.codegen.emit.signature import Signature
from kspec.codegen.emit.source import literal, out_dtype_outputs, tuple_src
from kspec.codegen.spec.expr import Expr


def reference(sig: Signature) -> dict:
    """reference.py: the reference, the competitors and the inputs' init code, as the spec writes them."""
    base = sig.reference_variant
    competitors = [
        {"name": c.name, "doc": c.doc or f"The `{c.name}` competitor.", "platforms": c.platforms,
         "platforms_repr": repr(tuple(c.platforms)), "requires_repr": repr(tuple(c.requires)),
         "body": c.body.source}
        for c in sig.spec.competitors
    ]
    inits = [_init_code(op, sig.spec.init_args(op)) for op in sig.spec.inputs
             if op.init is not None and op.init.code is not None]
    return dict(sig.common(), signature=sig.signature_of(base), reference=sig.spec.reference.source,
                mesh_sizes=list(sig.spec.mesh_sizes.items()), competitors=competitors, inits=inits,
                requiring=[c for c, spec_c in zip(competitors, sig.spec.competitors) if spec_c.requires])


def _init_code(op, scope: tuple) -> dict:
    """An input's init code as reference.py renders it: `<kernel>_init_<input>(key, <the names of
    the dims, params, `dtype` and other inputs it reads>)`, and those names for INITS."""
    args = op.init.code_args(scope)
    return {"input": op.name, "args": ["key", *args], "names": tuple_src(map(repr, args)),
            "body": op.init.code.returning}


def tuning(sig: Signature, tuned: dict, linked: tuple = ()) -> dict:
    """_tuning.py: the config `tuning.best` picks per device, backend, dtype and shape bucket in `tuned`
    ({device kind: tuning entries}), and each backend's defaults. `linked`: the backward
    KernelSpecs of the spec's `vjp:`, whose hashes `kspec tune --grad`'s entries are recorded for."""
    from kspec.codegen.spec import tuning as tg

    table, slower, grad_speedup = [], [], []
    spec, ref = sig.spec, sig.spec.reference_sha  # what sustained and grad entries were timed against
    gradient_sha = (tg.grad_sha(spec.kernel_sha, [b.kernel_sha for b in linked], ref)
                    if sig.reference_gradient else None)
    choices = tg.choices_of(sig.spec.variants)
    for device_kind, entries in sorted(tuned.items()):
        for (backend, dtype, bucket, fixed), params in tg.best(entries, spec.kernel_sha, choices, ref).items():
            if backend in sig.spec.variants:
                table.append((literal((device_kind, backend, dtype, bucket, fixed)), literal(params)))
        if sig.spec.reference_when_faster:
            for (backend, dtype, bucket, fixed), x in tg.slower(entries, spec.kernel_sha, ref, choices).items():
                if backend in sig.spec.variants:
                    slower.append((literal((device_kind, backend, dtype, bucket, fixed)), literal(x)))
        if gradient_sha is not None:
            for (backend, dtype, bucket, fixed), x in tg.grad_speedups(entries, gradient_sha).items():
                if backend in sig.spec.variants:
                    grad_speedup.append((literal((device_kind, backend, dtype, bucket, fixed)), literal(x)))
    defaults = [
        (b, "{" + ", ".join(f"{p.name!r}: {p.default.render() if isinstance(p.default, Expr) else literal(p.default)}"
                            for p in v.params if p.resolved) + "}")
        for b, v in sig.spec.variants.items()
    ]
    def read(constraints) -> set:  # the params they read
        return set().union(*(c.expr.names for c in constraints)) - set(sig.spec.dims)

    def conjunction(constraints) -> str:
        return " and ".join(f"({c.expr.render()})" for c in constraints) or "True"

    from kspec.codegen.backends import requirements as rq

    constraint_params = sorted(read(sig.spec.constraints))
    constraints = conjunction(sig.spec.constraints)
    # A backend's own constraints hold for its tuned configs too, and so does the shared memory it declares,
    # at the call's itemsizes: [(backend, the other params they read, source)]
    backend_constraints, sizes = [], {}
    kernel = sig.spec.kernel_view
    for b, v in sig.spec.variants.items():
        smem = rq.shared_memory(v)
        if not v.constraints and smem is None:
            continue
        names = read(v.constraints) | (set(v.shared_memory.names) - set(sig.spec.dims) if smem else set())
        source = conjunction(v.constraints) if v.constraints else ""
        if smem is not None:
            source = (source + " and " if source else "") + f"({smem.condition})"
            sizes.update((n, src) for n, src in rq.itemsizes(kernel, v) if n in v.shared_memory.sized)
        backend_constraints.append((b, sorted(names - set(constraint_params)), source))
    return dict(
        sig.common(), table=table, defaults=defaults, constraint_params=constraint_params,
        itemsizes="{" + ", ".join(f"{k!r}: {src}" for k, src in sorted(sizes.items())) + "}" if sizes else None,
        constraints=constraints, backend_constraints=backend_constraints, slower=slower, reference_when_faster=sig.spec.reference_when_faster,
        grad_speedup=grad_speedup, grad_trusted_low=tg.GRAD_TRUSTED_LOW, grad_clear=tg.GRAD_CLEAR, reference_gradient=sig.reference_gradient,
        dims_args=", ".join(sig.spec.dims),
    )


def dispatch(sig: Signature) -> dict:
    """_dispatch.py: what each backend needs of a call (backends/requirements.py)."""
    from kspec.codegen.backends import requirements as rq

    spec = sig.spec
    per_backend, sizes = [], {}
    kernel = spec.kernel_view  # what the pallas_call takes: the kernel's own operands and blocks
    for name, v in spec.variants.items():
        reqs = rq.requirements(kernel, v)
        per_backend.append({
            "name": name,
            "requirements": reqs,
            "untuned": [(p.name, literal(p.default)) for p in v.params if not p.resolved],
            "resolved": [p.name for p in v.params if p.resolved],
        })
        if any("_itemsize" in r.condition + r.reason for r in reqs):
            sizes.update(rq.itemsizes(kernel, v))
    params = list(dict.fromkeys(p.name for v in spec.variants.values() for p in v.params))
    package = init(sig, "")
    return dict(
        sig.common(),
        backends_tuple=package["backends_tuple"], platforms=package["platforms"], auto=package["auto"],
        dims_constraints=rq.dims_constraints(spec),
        dims_args=", ".join(spec.dims),
        dim_names=tuple_src(repr(d) for d in spec.dims),
        dims_tuple=", ".join(spec.dims) + ("," if len(spec.dims) == 1 else ""),
        per_backend=per_backend,
        needs_itemsize=bool(sizes),
        itemsize_dict="{" + ", ".join(f"{k!r}: {v}" for k, v in sizes.items()) + "}",
        params=params,
        params_dict="{" + ", ".join(f'"{p}": {p}' for p in params) + "}",
        slower=spec.reference_when_faster,
        reference_gradient=sig.reference_gradient,
    )


def init(sig: Signature, spec_path: str) -> dict:
    """The package's __init__.py: its backends, the platforms they run on, and what auto picks."""
    spec = sig.spec
    backends = list(spec.variants)
    platforms = {b: BACKENDS[b].platforms for b in backends}
    # On each platform, the declared backends AUTO allows, in the spec's order.
    auto = {p: tuple(b for b in backends if b in prefs) for p, prefs in AUTO.items()}
    auto = {p: bs for p, bs in auto.items() if bs}
    params = []
    for v in spec.variants.values():
        params += [p.name for p in v.params if p.name not in params]
    return dict(
        sig.common(),
        spec_path=spec_path,
        backends=backends,
        backends_tuple=tuple_src(repr(b) for b in backends),
        platforms=repr(platforms),
        auto=repr(auto),
        params=params,
        params_dict="{" + ", ".join(f'"{p}": {p}' for p in params) + "}",
        vjp=spec.vjp is not None,
        vjp_reference_forward=sig.reference_forward,
        reference_gradient=sig.reference_gradient,
        out_dtype=_out_dtype_returned(spec),
        reference_params=sig.reference_params,
    )


def _out_dtype_returned(spec) -> str | None:
    """For the package function's out_dtype: per returned output, whether out_dtype sets its
    dtype (a tuple literal); None when no output's dtype is a map."""
    if not out_dtype_outputs(spec):
        return None
    return tuple_src(repr(o.dtype_map is not None) for o in spec.outputs if not o.residual)
