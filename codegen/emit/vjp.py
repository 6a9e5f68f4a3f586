"""_vjp.py: the jax.custom_vjp around the kernel, its backward pass calling the backward kernels
of the spec's `vjp:`."""

from __future__ import annotations

from kspec.codegen.checks import vjp as _vjp
from kspec.codegen.emit.signature import Signature
from kspec.codegen.emit.source import jnp_dtype, literal, tuple_src


def vjp(sig: Signature, linked: tuple) -> dict:
    """_vjp.py: the custom_vjp around the kernel, calling the backward kernels `linked`
    (the backward KernelSpecs, in `vjp.backward` order)."""
    spec, vjp = sig.spec, sig.spec.vjp
    passed = list(dict.fromkeys(f for e in vjp.backward for f in e.params.values()))
    entries, grads = [], {}
    for entry, bspec in zip(vjp.backward, linked):
        by_output = {g.output: g for g in entry.grads}
        for o in bspec.outputs:
            g = by_output[o.name]
            grads[g.input] = f"_grad_{g.input}"
            if g.reduce:
                extra = o.rank - spec.operand(g.input).rank
                kind, what = _vjp.dtype_witness(spec, g.input)
                dtype = {"fixed": jnp_dtype(what), "residual": f"{what}.dtype", "cotangent": f"_grad_{what}.dtype"}[kind]
                grads[g.input] = f"_sum_partials(_grad_{g.input}, {extra}, {dtype})"
        args = [
            "None" if b is None else f"_grad_{b.source}" if b.cotangent else b.source  # None: an optional input left out
            for b in (entry.binding(op.name) for op in bspec.inputs)
        ]
        made = ", ".join(f"{g.output} -> {g.input}" + (" (summed)" if g.reduce else "") for g in entry.grads)
        entries.append({
            "package": bspec.name,
            "local": f"_{bspec.name}",
            "params": "{" + ", ".join(f'"{b}": _passed["{f}"]' for b, f in entry.params.items()) + "}",
            "args": args,
            "lhs": ", ".join(f"_grad_{by_output[o.name].input}" for o in bspec.outputs),
            "doc": f"{bspec.name}({', '.join(args)}): {made}",
        })
    outputs = [o.name for o in spec.outputs]
    residuals = list(vjp.residuals)
    returned = [o.name for o in spec.returned]
    return dict(
        sig.common(),
        outputs=outputs,
        returned=returned,
        hidden=[o.name for o in spec.outputs if o.residual],
        outputs_lhs=", ".join(o.name if not o.residual else "_" for o in spec.outputs),
        returned_value=", ".join(returned),
        residuals=residuals,
        output_residuals=any(r in outputs for r in residuals),
        residuals_lhs=", ".join(residuals) if len(residuals) != 1 else f"({residuals[0]},)",
        residuals_value=tuple_src(residuals),
        # a residual output is not returned: its cotangent is always zero, and unused
        cotangents=[f"_grad_{o.name}" if not o.residual else "_" for o in spec.outputs],
        entries=entries,
        packages=sorted({e["package"] for e in entries}),
        passed=passed,
        passed_on=literal({b: {f: v.param_defaults[f] for f in passed} for b, v in spec.variants.items()}),
        # With no residual outputs, the reference can stand in for the forward kernel (backward kernels kept).
        reference_forward=sig.reference_forward,
        reference_gradient=sig.reference_gradient,
        reference_params=sig.reference_params,
        reference_passed=literal({f: sig.reference_variant.param_defaults[f] for f in passed}),
        returns=tuple_src(grads.get(name, "None") for name in sig.inputs),
        sums=any(g.reduce for e in vjp.backward for g in e.grads),
    )
