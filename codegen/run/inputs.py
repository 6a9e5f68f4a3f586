"""Inputs of a task, made in the worker: random data per operand from a seed that names the task,
the spec's initialisers honoured, and the reference's view of them (low-precision floats as float32)."""

from __future__ import annotations

import hashlib

import numpy as np

from kspec.codegen.run.tasks import Task
from kspec.codegen.spec import dtypes as dt


def rng_for(task: Task, operand: str) -> np.random.Generator:
    key = f"{task.seed}/{task.kernel}/{task.case}/{task.dtype_label}/{operand}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


def make_input(task: Task, op, shape: tuple, dtype: str, env: dict, shapes: dict):
    """Random data for one input: the spec's initialiser, else a per-dtype default."""
    import jax.numpy as jnp

    rng = rng_for(task, op.name)
    init = getattr(op, "init", None)
    kind = init.kind if init else None
    if kind == "index":
        high = init.bound(env, shapes)
        data = rng.integers(0, max(high, 1), size=shape)
    elif kind == "uniform":
        data = rng.uniform(init.low, init.high, size=shape)
    elif kind == "positive":
        data = np.abs(rng.standard_normal(shape)) + 0.5
    elif kind in ("ones", "zeros"):
        data = np.full(shape, 1.0 if kind == "ones" else 0.0)
    elif kind == "normal":
        data = rng.normal(init.mean, init.std, size=shape)
    else:
        info = dt.DTYPES[dtype]
        if info[1] == "b":
            data = rng.integers(0, 2, size=shape).astype(bool)
        elif info[1] == "i":
            bound = min(100, 2 ** (8 * info[0] - 2))
            data = rng.integers(-bound, bound, size=shape)
        elif info[1] == "u":
            data = rng.integers(0, min(100, 2 ** (8 * info[0] - 1)), size=shape)
        else:
            data = rng.standard_normal(shape)
    return jnp.asarray(np.asarray(data)).astype(jnp.dtype(dtype))


def upcast(x):
    """The reference sees low-precision floats as float32."""
    import jax.numpy as jnp

    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize < 4:
        return x.astype(jnp.float32)
    return x
