"""`kspec verify`'s grad mode, inside the worker: the generated jax.custom_vjp (generated/
<kernel>/_vjp.py) against jax.vjp of the reference, for the same random cotangents.

Gradients are taken with respect to the floating-point inputs (the others are held
fixed); each is compared with the reference's, run at higher precision, by the rule and
tolerance of the forward check. A failure names the input whose gradient is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import time

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.run.compare import compare_within, verdict_result
from kspec.codegen.run import inputs
from kspec.codegen.run.inputs import rng_for, upcast
from kspec.codegen.run.tasks import Result, Status, result


def _wrt(prep) -> list:
    """Positions of the inputs gradients are taken for: the floating-point ones."""
    return [i for i, op in enumerate(prep.spec.inputs)
            if dt.is_float(prep.dtypes[op.name]) and prep.inputs[i] is not None]  # None: an absent optional input


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
    if rng is None:
        return out
    if out.size > inputs.DEVICE_THRESHOLD:  # drawn on the device, as big inputs are
        return inputs.device_normal(rng, out.shape, str(out.dtype))
    return jnp.asarray(rng.standard_normal(out.shape)).astype(out.dtype)


@dataclasses.dataclass(frozen=True)
class Gradients:
    """A differentiable function's outputs and gradients (for the inputs at `wrt`) under seeded
    random cotangents, beside the reference's at higher precision for the same cotangents."""

    wrt: list
    outs: object
    grads: tuple
    cotangents: list
    ref_outs: object
    ref_grads: tuple
    seconds: float  # from the task's start to the function's gradients


def gradients(task, prep, fn, start: float) -> Gradients:
    """jax.vjp of `fn` (the package's custom_vjp) and of the reference, run at higher precision:
    float32 inputs, matmuls at the highest precision."""
    import jax

    wrt = _wrt(prep)
    shapes = jax.eval_shape(_on(fn, prep.inputs, wrt), *[prep.inputs[i] for i in wrt])
    cotangents = [_cotangent(o, rng_for(task, f"grad({op.name})")) for op, o in zip(prep.spec.returned, _flat(shapes))]
    inexact = tuple(c.dtype != jax.dtypes.float0 for c in cotangents)
    given = [c for c, k in zip(cotangents, inexact) if k]
    outs, grads = jax.block_until_ready(_vjp_of(fn, tuple(wrt), inexact, False)(list(prep.inputs), given))
    seconds = round(time.monotonic() - start, 3)
    ref = functools.partial(prep.ref_fn, **prep.ref_params)
    with jax.default_matmul_precision("highest"):
        ref_outs, ref_grads = _vjp_of(ref, tuple(wrt), inexact, True)(list(prep.inputs), given)
    return Gradients(wrt, outs, tuple(grads), cotangents, ref_outs, tuple(ref_grads), seconds)


def _vjp_of(fn, wrt: tuple, inexact: tuple, wide: bool):
    """`fn`'s outputs and its gradients for the inputs at `wrt` as one compiled function of (inputs,
    the cotangents of the outputs that are `inexact`); `wide`: low-precision floats seen as float32,
    as the reference sees them. Op by op, each intermediate of a function that runs as jax ops (a
    reference; a kernel's where dispatch runs it) would be allocated in full: 8 GiB apiece at 2**31
    elements."""
    import jax
    import numpy as np

    def both(args, cotangents):
        args = [upcast(x) for x in args] if wide else args
        outs, pullback = jax.vjp(_on(fn, args, list(wrt)), *[args[i] for i in wrt])
        given = iter(cotangents)
        full = [(upcast(next(given)) if wide else next(given)) if k else np.zeros(o.shape, jax.dtypes.float0)
                for k, o in zip(inexact, _flat(outs))]
        return outs, pullback(_like(outs, full))

    return jax.jit(both)


def judge(task, prep, g: Gradients) -> Result:
    """The result row for `g`: each gradient has its input's dtype, and the outputs and the
    gradients match the reference's by the forward check's rule and tolerance."""
    spec = prep.spec
    tol = dt.tolerance(list(prep.dtypes.values()), spec.tolerance, prep.case.tolerance)
    for i, grad_ in zip(g.wrt, g.grads):
        if grad_.dtype != prep.inputs[i].dtype:
            name = spec.inputs[i].name
            message = f"grad of {name} has dtype {grad_.dtype} but {name} is {prep.inputs[i].dtype}"
            return result(task, Status.FAIL, message, seconds=g.seconds, tolerance=tol)
    named = [(f"output {op.name}", o, r) for op, o, r in zip(spec.returned, _flat(g.outs), _flat(g.ref_outs))]
    # the gradients under their own bounds, where the spec gives them (a tolerance's `grad`)
    own = dt.for_gradients(tol)
    named += [(f"grad of {spec.inputs[i].name}", x, r, own) for i, x, r in zip(g.wrt, g.grads, g.ref_grads)]
    return verdict_result(task, compare_within(named, dt.for_outputs(tol)), g.seconds, tol)


def grad(task, prep, module, interpret, start: float) -> Result:
    """Compare gradients for one task; `module` is the kernel's generated _vjp.py."""
    fn = module.differentiable(task.backend, tuple(sorted(prep.params.items())), interpret)
    return judge(task, prep, gradients(task, prep, fn, start))


def lower(task, prep, module, start: float) -> Result:
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
    return result(task, Status.PASS, f"lowered for {lowering.shown(task.backend)} ({len(text)} characters of StableHLO)",
                  seconds=round(time.monotonic() - start, 3))
