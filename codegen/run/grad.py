"""`kspec verify`'s grad mode, inside the worker: the generated jax.custom_vjp (generated/
<kernel>/_vjp.py) against jax.vjp of the reference, for the same random cotangents.

Gradients are taken with respect to the floating-point inputs (the others are held
fixed); each is compared with the reference's, run at higher precision, by the rule and
tolerance of the forward check. A failure names the input whose gradient is wrong.
"""

from __future__ import annotations

import functools
import time

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.run.compare import compare_all, verdict_result
from kspec.codegen.run.inputs import rng_for, upcast
from kspec.codegen.run.tasks import result


def _wrt(prep) -> list:
    """Positions of the inputs gradients are taken for: the floating-point ones."""
    return [i for i, op in enumerate(prep.spec.inputs) if dt.is_float(prep.dtypes[op.name])]


def _on(fn, args: list, wrt: list):
    """`fn` as a function of the inputs at `wrt` only, the others fixed to `args`."""

    def restricted(*chosen):
        full = list(args)
        for i, x in zip(wrt, chosen):
            full[i] = x
        return fn(*full)

    return restricted


def _like(outs, items: list):
    """`items` in the structure of a function's outputs: one array, or a tuple/list of them."""
    return type(outs)(items) if isinstance(outs, (tuple, list)) else items[0]


def _flat(outs) -> list:
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


def _cotangent(out, rng=None):
    """A cotangent for one output: seeded random numbers from `rng`, or with no rng the
    output itself; zeros of float0 for an output that is not floating-point."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, jax.dtypes.float0)
    return out if rng is None else jnp.asarray(rng.standard_normal(out.shape)).astype(out.dtype)


def grad(task, prep, module, interpret, start: float) -> dict:
    """Compare gradients for one task; `module` is the kernel's generated _vjp.py."""
    import jax


    spec, wrt = prep.spec, _wrt(prep)
    fn = module.differentiable(task.backend, tuple(sorted(prep.params.items())), interpret)
    outs, pullback = jax.vjp(_on(fn, prep.inputs, wrt), *[prep.inputs[i] for i in wrt])
    cotangents = [_cotangent(o, rng_for(task, f"grad({op.name})")) for op, o in zip(spec.returned, _flat(outs))]
    grads = jax.block_until_ready(pullback(_like(outs, cotangents)))
    seconds = round(time.monotonic() - start, 3)
    ref = functools.partial(prep.ref_fn, **prep.ref_params)
    wide = [upcast(x) for x in prep.inputs]
    with jax.default_matmul_precision("highest"):
        ref_outs, ref_pullback = jax.vjp(_on(ref, wide, wrt), *[wide[i] for i in wrt])
        ref_grads = ref_pullback(_like(ref_outs, [c if c.dtype == jax.dtypes.float0 else upcast(c) for c in cotangents]))
    tol = dt.tolerance(list(prep.dtypes.values()), spec.tolerance, prep.case.tolerance)
    for i, g in zip(wrt, grads):
        if g.dtype != prep.inputs[i].dtype:
            name = spec.inputs[i].name
            message = f"grad of {name} has dtype {g.dtype} but {name} is {prep.inputs[i].dtype}"
            return result(task, "fail", message, seconds=seconds, tolerance=tol)
    named = [(f"output {op.name}", o, r) for op, o, r in zip(spec.returned, _flat(outs), _flat(ref_outs))]
    named += [(f"grad of {spec.inputs[i].name}", g, r) for i, g, r in zip(wrt, grads, ref_grads)]
    return verdict_result(task, compare_all(named, tol["atol"], tol["rtol"], rel_err=tol.get("rel_err")), seconds, tol)


def lower(task, prep, module, start: float) -> dict:
    """Lower the forward and backward pass together for the backend's own platform (and, off a
    TPU, a named TPU chip: codegen.run.lowering)."""
    import contextlib
    import io

    import jax

    from kspec.codegen.run import lowering

    wrt = _wrt(prep)
    fn = _on(module.differentiable(task.backend, tuple(sorted(prep.params.items()))), prep.inputs, wrt)

    def forward_and_backward(*chosen):
        outs, pullback = jax.vjp(fn, *chosen)
        return pullback(_like(outs, [_cotangent(o) for o in _flat(outs)]))

    shapes = [jax.ShapeDtypeStruct(prep.inputs[i].shape, prep.inputs[i].dtype) for i in wrt]
    with contextlib.redirect_stderr(io.StringIO()), lowering.target(task.backend):
        text = jax.jit(forward_and_backward).trace(*shapes).lower(
            lowering_platforms=(lowering.platform(task.backend),)).as_text()
    return result(task, "pass", f"lowered for {lowering.shown(task.backend)} ({len(text)} characters of StableHLO)",
                  seconds=round(time.monotonic() - start, 3))
