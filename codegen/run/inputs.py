"""Inputs of a task, made in the worker: random data per operand from a seed that names the task,
the spec's initialisers honoured, and the reference's view of them (low-precision floats as float32)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

import numpy as np

from kspec.codegen.run import kinds
from kspec.codegen.run.tasks import Task
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.spec.model import InitKind


def rng_for(task: Task, operand: str) -> np.random.Generator:
    key = f"{task.seed}/{task.kernel}/{task.case}/{task.dtype_label}/{operand}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


LARGE = 30.0  # `large`: standard normal times this
# Elements above which a normal input is drawn on the device (device_normal): the host's float64
# draw and its transfer took longer than the timing of a sweep's largest shapes.
DEVICE_THRESHOLD = 1 << 22
NEGATIVE = 1e3  # `negative_rows`: rows near minus this (less for dtypes whose range is smaller)


class InitError(Exception):
    """An input's init code made data of another shape or dtype than the input's."""


def make_inputs(task: Task, spec, inst, dtypes: Mapping, absent, inits: Mapping, kind: str = kinds.NORMAL) -> list:
    """Every input of a task, in the spec's order (None for an optional input the case leaves out),
    made in the order their initialisers read each other (spec.init_order). `inits` is the
    generated reference module's INITS: {input: (its init code's function, the names it takes
    after the key)}."""
    made: dict = {}
    for op in spec.init_order:
        made[op.name] = None if op.name in absent else make_input(
            task, op, inst.shapes[op.name], dtypes[op.name], inst.env, inst.shapes, kind, made, inits.get(op.name), spec,
            kind == kinds.NORMAL or kinds.leads(spec, op, kind, dtypes))
    return [made[op.name] for op in spec.inputs]


def make_input(task: Task, op, shape: tuple, dtype: str, env: dict, shapes: dict, kind: str = kinds.NORMAL,
               made: Mapping | None = None, code=None, spec=None, lead: bool = True):
    """Random data for one input of one input kind (codegen/run/kinds.py): `normal` is the spec's
    initialiser, else a per-dtype default; another kind is made from its own stream, for the
    inputs that take it (kinds.takes), and is the normal data for the others. `made` holds the
    inputs made before (those `same_as`, `low`, `bound` and init code read); `code`, the init code's
    (function, argument names); `lead`: the input is the first that takes the kind (kinds.leads;
    only `opposed_rows` tells the two apart)."""
    import jax.numpy as jnp

    if kind != kinds.NORMAL and kind in kinds.takes(op, dtype, spec):
        data = _of_kind(rng_for(task, f"{op.name}/{kind}"), kind, shape, dtype, lead)
        return jnp.asarray(data).astype(jnp.dtype(dtype))
    rng = rng_for(task, op.name)
    init = getattr(op, "init", None)
    made = made or {}
    if init is not None and init.same_as is not None:
        return made[init.same_as]  # the checks hold it to the same shape and dtype
    if init is not None and init.code is not None:
        return _from_code(rng, op.name, code, shape, dtype, env, made)
    kind = init.kind if init else None
    if kind == InitKind.INDEX:
        low = _elementwise(init.low_expr, env, made, shape) if init.low_expr is not None else 0
        high = (_elementwise(init.bound_expr, env, made, shape) if init.bound_expr is not None
                else init.bound(env, shapes))
        data = rng.integers(low, np.maximum(high, np.add(low, 1)), size=shape)
    elif kind == InitKind.UNIFORM:
        data = rng.uniform(init.low, init.high, size=shape)
    elif kind == InitKind.POSITIVE:
        data = np.abs(rng.standard_normal(shape)) + 0.5
    elif kind in (InitKind.ONES, InitKind.ZEROS):
        data = np.full(shape, 1.0 if kind == InitKind.ONES else 0.0)
    elif kind == InitKind.NORMAL:
        if _on_device(shape, dtype):
            return device_normal(rng, shape, dtype, init.mean, init.std)
        data = rng.normal(init.mean, init.std, size=shape)
    elif _on_device(shape, dtype):
        return device_normal(rng, shape, dtype)
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


def _on_device(shape: tuple, dtype: str) -> bool:
    return dt.DTYPES[dtype][1] == "f" and int(np.prod(shape, dtype=np.int64)) > DEVICE_THRESHOLD


def device_normal(rng: np.random.Generator, shape: tuple, dtype: str, mean: float = 0.0, std: float = 1.0):
    """Normal data of a large float input, drawn by jax.random in float32 on the default device
    from a key taken from the input's own stream: as reproducible as the host's draw. One compiled
    computation, so that only the result is allocated in full (op by op, the float32 draw, its
    scaled and shifted copies and the cast would each be: 32 GiB at 2**31 elements)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.key(int(rng.integers(2**31)))
    return _draw_normal(tuple(int(d) for d in shape), str(jnp.dtype(dtype)))(key, jnp.float32(mean), jnp.float32(std))


@functools.lru_cache(maxsize=64)
def _draw_normal(shape: tuple, dtype: str):
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda key, mean, std: (jax.random.normal(key, shape, jnp.float32) * std + mean).astype(dtype))


def _elementwise(expr, env: Mapping, made: Mapping, shape: tuple):
    """An index initialiser's low or bound: a number when it reads only dims and params, else an
    array of `shape`, the expression evaluated per element over the inputs it reads (broadcast
    as numpy broadcasts them)."""
    names = sorted(n for n in expr.names if n in made)
    if not names:
        return expr.eval(env)
    each = np.vectorize(lambda *values: expr.eval({**env, **{n: np.asarray(v).item() for n, v in zip(names, values)}}),
                        otypes=[np.int64])
    return np.broadcast_to(each(*(np.asarray(made[n]) for n in names)), shape)


def _from_code(rng: np.random.Generator, name: str, code, shape: tuple, dtype: str, env: Mapping,
               made: Mapping):
    """An input made by its init code: called with a key from the input's own stream, then the
    dims, params, `dtype` and the other inputs (`made` before it: their data, None for one left out)
    it reads; what it returns must have the input's shape and dtype."""
    import jax
    import jax.numpy as jnp

    fn, names = code
    key = jax.random.key(int(rng.integers(2**31)))
    data = jnp.asarray(fn(key, *(jnp.dtype(dtype) if n == "dtype" else made[n] if n in made else env[n]
                                 for n in names)))
    if tuple(data.shape) != tuple(shape) or data.dtype != jnp.dtype(dtype):
        raise InitError(f"input {name}: its init code returned {data.dtype.name}[{', '.join(map(str, data.shape))}], "
                        f"but {name} is {dtype}[{', '.join(map(str, shape))}] here")
    return data


def _of_kind(rng: np.random.Generator, kind: str, shape: tuple, dtype: str, lead: bool = True) -> np.ndarray:
    """Data of one kind other than normal. Rows are the slices along the last dim (a rank-0 or
    rank-1 array is one row); the row kinds replace rows 0, 2, 4, ... and leave the others
    standard normal (integers: the default range). `opposed_rows` is `negative_rows` in the input
    that leads it and positive everywhere in the others (|standard normal| + 0.5; integers:
    |the default range| + 1), so each row of the first has a very negative product with any row
    of the others."""
    import jax.numpy as jnp

    size, kind_of = dt.DTYPES[dtype]
    integer = kind_of in "iu"
    if integer:
        info = jnp.iinfo(jnp.dtype(dtype))
        low, high = int(info.min), int(info.max)
        bound = min(100, 2 ** (8 * size - 2)) if kind_of == "i" else 0
        base = rng.integers(-bound, bound, size=shape) if kind_of == "i" else rng.integers(0, min(100, 2 ** (8 * size - 1)), size=shape)
        base = base.astype(np.int64)
    else:
        base = rng.standard_normal(shape)
    if kind == "opposed_rows":
        if not lead:
            return np.abs(base) + (1 if integer else 0.5)
        kind = "negative_rows"
    if kind == "large":
        if integer:
            return rng.choice(np.array([low, high], dtype=np.int64), size=shape)
        return base * LARGE
    rows = base.reshape(-1, shape[-1]) if len(shape) >= 1 else base.reshape(1, 1)
    special = rows[0::2]
    if kind == "zero_rows":
        special[...] = 0
    elif kind == "equal_rows":
        special[...] = special[:, :1]
    elif kind == "negative_rows":
        if integer:
            special[...] = low
        else:
            # -1000 where the dtype reaches it with room to spare (float8 does not)
            depth = min(NEGATIVE, float(jnp.finfo(jnp.dtype(dtype)).max) / 16)
            special[...] = special - depth
    return rows.reshape(shape)


def upcast(x):
    """The reference sees low-precision floats as float32 (and None, an absent optional input, as None)."""
    import jax.numpy as jnp

    if x is not None and jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize < 4:
        return x.astype(jnp.float32)
    return x
