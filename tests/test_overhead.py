"""The generated wrapper adds nothing to a hand-written pallas_call of the same kernel.

Shape/dtype checks, param resolution (tuning tables) and dispatch all run in Python
at trace time: the traced program is the same, equation for equation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import generated.add.interpret as add_interpret
import generated.matmul.mosaic_tpu as matmul_tpu


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@jax.jit
def add(x, y):
    M, N = x.shape
    bm, bn = 8, 128
    spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    return pl.pallas_call(
        _add_kernel,
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
        grid=(pl.cdiv(M, bm), pl.cdiv(N, bn)),
        in_specs=[spec, spec],
        out_specs=spec,
        cost_estimate=pl.CostEstimate(flops=M * N, transcendentals=0, bytes_accessed=3 * M * N * x.dtype.itemsize),
        interpret=True,
        name="add",
    )(x, y)


def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...]


@jax.jit
def matmul(x, y):
    (M, K), N = x.shape, y.shape[1]
    bm, bn, bk = 64, 128, 128
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        grid=(pl.cdiv(M, bm), pl.cdiv(N, bn), K // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(
            flops=2 * M * N * K, transcendentals=0, bytes_accessed=(M * K + K * N + M * N) * 4
        ),
        name="matmul",
    )(x, y)


def _jaxpr(fn, *args) -> str:
    return str(jax.make_jaxpr(fn)(*args))


def test_generated_add_traces_to_the_hand_written_program():
    x = jnp.ones((64, 256), jnp.float32)
    assert _jaxpr(add_interpret.add, x, x) == _jaxpr(add, x, x)


def test_generated_tpu_matmul_traces_to_the_hand_written_program():
    x, y = jnp.ones((256, 512), jnp.float32), jnp.ones((512, 256), jnp.float32)
    assert _jaxpr(matmul_tpu.matmul, x, y) == _jaxpr(matmul, x, y)


def test_the_comparison_can_fail():
    x = jnp.ones((64, 256), jnp.float32)
    assert _jaxpr(add_interpret.add, x, x) != _jaxpr(functools.partial(add_interpret.add, bm=16), x, x)
