"""run/bounds.py: the out-of-bounds check of loads and stores in Pallas interpret mode, on one kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _head(index: int):
    """A kernel that reads head `index` (a static Python int) of a (rows, 1, 128) block."""

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[:, index, :] * 2

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=True)


def test_a_static_index_past_its_axis_is_counted_and_one_inside_is_not():
    """Interpret mode clamps a static index past an axis back onto it, so `x_ref[:, 1, :]` of a block with one
    head reads head 0 and the values come out right; compiled, it reads past the block. The check counts it
    as it counts a dynamic one; head 0, and a negative index counting from the end, are in bounds."""
    from kspec.codegen.run import bounds

    assert bounds.install()
    bounds.take()
    x = jnp.ones((8, 1, 128))
    assert float(jax.block_until_ready(_head(1)(x))[0, 0]) == 2.0
    (access,) = bounds.take()
    assert (access.kind, access.line, access.outside) == ("load", _head.__code__.co_firstlineno + 4, 8 * 128)
    assert access.describe() == "a load from [0:8, 1, 0:128] of a (8, 1, 128) ref reads 1024 element(s) outside it"
    for inside in (0, -1):
        jax.block_until_ready(_head(inside)(x))
        assert bounds.take() == []
