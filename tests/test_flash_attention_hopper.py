"""specs/flash_attention_hopper.yaml, the FlashAttention-3 style Mosaic GPU forward: it checks clean,
lowers for CUDA on a CPU (every case, the bench shapes, every config its params allow, either
schedule), writes its residual outputs only when asked, refuses a ring that does not fit shared
memory, and (slow) runs in Mosaic GPU interpret mode under both schedules."""

from __future__ import annotations

import functools
import importlib
import itertools

import jax
import jax.numpy as jnp
import pytest
from conftest import REPO, invoke_kspec, mutate
from test_mesh import _run_interpreted

NAME = "flash_attention_hopper"


def _lower(module, shape, **params) -> str:
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    fn = functools.partial(getattr(module, NAME), **params)
    return jax.jit(fn).trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text()


def test_spec_checks_clean_with_its_backward_specs():
    r = invoke_kspec("check", f"specs/{NAME}.yaml", cwd=REPO)
    assert (r.rc, r.out) == (0, "3 spec(s) OK\n"), r.both


def test_lowers_for_cuda_at_every_bench_shape_causal_or_not():
    module = importlib.import_module(f"generated.{NAME}.mosaic_gpu")
    for shape, causal in itertools.product(((4, 4096, 32, 128), (4, 4096, 32, 64), (1, 16384, 32, 128)), (False, True)):
        assert "mosaic_gpu" in _lower(module, shape, causal=causal), (shape, causal)


def test_the_ping_pong_schedule_lowers_for_cuda_causal_or_not():
    module = importlib.import_module(f"generated.{NAME}.mosaic_gpu")
    for shape, causal in itertools.product(((4, 4096, 32, 128), (2, 512, 8, 64)), (False, True)):
        assert "mosaic_gpu" in _lower(module, shape, causal=causal, pingpong=True), (shape, causal)


def test_128_query_rows_a_consumer_lower_for_cuda_under_either_schedule():
    module = importlib.import_module(f"generated.{NAME}.mosaic_gpu")
    for causal, pingpong in itertools.product((False, True), (False, True)):
        assert "mosaic_gpu" in _lower(module, (4, 4096, 32, 64), causal=causal, pingpong=pingpong, bq=128, bk=64)


def test_a_call_outside_grad_leaves_the_residual_outputs_out_of_the_kernel():
    """lse [B, H, S] float32 and o_err are written only with residuals=True, as under jax.grad: the
    body finds their refs None otherwise and skips their copies."""
    module = importlib.import_module(f"generated.{NAME}.mosaic_gpu")
    lse_type = "tensor<2x8x1024xf32>"
    assert lse_type not in _lower(module, (2, 1024, 8, 64))
    assert lse_type in _lower(module, (2, 1024, 8, 64), residuals=True)
    x = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16)
    o, lse, o_err = jax.eval_shape(functools.partial(module.flash_attention_hopper, residuals=True), x, x, x)
    assert (o.shape, lse.shape, o_err.shape, o_err.dtype) == (x.shape, (2, 8, 1024), x.shape, jnp.bfloat16)


@pytest.mark.slow
def test_lowers_for_cuda_under_every_config_that_fits():
    """Every (bk, slots) choice that the shared-memory constraint lets through, at D 64 and 128,
    causal or not, under either schedule, from S 512 to 32768."""
    module = importlib.import_module(f"generated.{NAME}.mosaic_gpu")
    lowered = 0
    for (b, s, h, d), causal, bq, bk, slots, pingpong in itertools.product(
        ((2, 512, 8, 64), (8, 2048, 32, 128), (2, 32768, 8, 128)), (False, True), (64, 128), (64, 128), (2, 3, 4),
        (False, True)
    ):
        if 4 * slots * bk * d + 8 * bq * d > 220 * 1024:
            continue
        assert "mosaic_gpu" in _lower(module, (b, s, h, d), causal=causal, bq=bq, bk=bk, slots=slots, pingpong=pingpong)
        lowered += 1
    # bq 64: 6 configs at D 64, 4 at D 128 (bk 128 only with 2 slots); bq 128: 6 at D 64, 1 at D 128
    # (bk 64, 2 slots); causal or not, two schedules
    assert lowered == 4 * (12 + 2 * 5)


def test_a_ring_over_the_shared_memory_budget_is_refused_before_tracing():
    dispatch = importlib.import_module(f"generated.{NAME}._dispatch")
    x = jnp.zeros((1, 512, 1, 128), jnp.bfloat16)
    assert dispatch.why_not("mosaic_gpu", x, x, x, bk=128, slots=2) is None
    assert dispatch.why_not("mosaic_gpu", x, x, x, bk=128, slots=3) == (
        "the K and V ring (2 * slots * bk * D), the query blocks and o's rounding error (4 * bq * D) must fit 220 KiB"
        " of shared memory (D=128, bk=128, bq=64, slots=3)")
    assert dispatch.why_not("mosaic_gpu", x, x, x, bk=64, slots=4) is None


def _interpretable() -> str:
    """The spec as `fa3_interp`, rewritten where Mosaic GPU interpret mode (jax 0.10.2) cannot follow
    it; the producer, the ring, the barriers, the block counts, the masks and the online softmax
    stay as written. The interpreter has no register layouts (the layout hints go), no wgmma from
    registers or of a transposed ref (p and k^T pass through shared memory), and no run_state (the
    p v accumulator starts at zero and the rescaled output is added to it). No residual outputs
    (lse and o_err are plain outputs, always written) and no vjp (the backward specs are not in
    the copy); one small case, no bench or families."""
    text = (REPO / "specs" / f"{NAME}.yaml").read_text()
    text = text[: text.index("\ncases:")] + "\ncases:\n  - {name: small, B: 1, S: 256, H: 1, D: 64}\n" + \
        text[text.index("\nbackends:") + 1: text.index("\n# The gradient:")] + "\n"
    text = mutate(
        text,
        (f"name: {NAME}", "name: fa3_interp"),
        (", residual: true", ""),
        (", residual: true", ""),
        ("  lse_smem: {", "  kt_smem: {shape: [2, D, bk], dtype: q, memory_space: smem, transforms: {tiling: [8, 64], swizzle: 128}}\n"
                         "  p_smem: {shape: [2, bq, bk], dtype: q, memory_space: smem, transforms: {tiling: [8, 64], swizzle: 128}}\n"
                         "  lse_smem: {"),
        # the overlapped schedule's wgmmas, then the ping-pong schedule's
        ("plgpu.wgmma(s_acc, qo, plgpu.transpose_ref(k_smem_ref.at[slot], (1, 0)))",
         "kt_smem_ref[wg] = k_smem_ref[slot].T\n          plgpu.wgmma(s_acc, qo, kt_smem_ref.at[wg])"),
        ("plgpu.wgmma(o_acc, p, v_smem_ref.at[slot])",
         "p_smem_ref[wg] = p\n                  plgpu.wgmma(o_acc, p_smem_ref.at[wg], v_smem_ref.at[slot])"),
        ("o_new = pl.run_state(pv)(plgpu.ACC.init(o_scaled))",
         "o_new = o_scaled + pl.run_scoped(lambda acc: (pv(acc), acc[...])[1], plgpu.ACC((bq, D), jnp.float32))"),
        ("plgpu.wgmma(s_acc, qo, plgpu.transpose_ref(k_smem_ref.at[slot], (1, 0)))",
         "kt_smem_ref[wg] = k_smem_ref[slot].T\n              plgpu.wgmma(s_acc, qo, kt_smem_ref.at[wg])"),
        ("plgpu.wgmma(o_acc, p, v_smem_ref.at[slot])",
         "p_smem_ref[wg] = p\n              plgpu.wgmma(o_acc, p_smem_ref.at[wg], v_smem_ref.at[slot])"),
        ("o_new = pl.run_state(pv)(plgpu.ACC.init(o_scaled))",
         "o_new = o_scaled + pl.run_scoped(lambda acc: (pv(acc), acc[...])[1], plgpu.ACC((bq, D), jnp.float32))"),
    )
    hints = {"plgpu.broadcasted_iota(": 2, ", layout=plgpu.Layout.WGMMA)": 2, "plgpu.layout_cast(": 3,
             ", plgpu.Layout.WGMMA.reduce(1))": 2, ", plgpu.Layout.WGMMA)": 1}
    for hint, count in hints.items():
        assert text.count(hint) == count, hint
        text = text.replace(hint, {"plgpu.broadcasted_iota(": "lax.broadcasted_iota(", "plgpu.layout_cast(": "("}.get(hint, ")"))
    return text


# Runs generated/fa3_interp in Mosaic GPU interpret mode; prints, per config, the largest errors of o
# (against the reference) and of lse (against logsumexp of the scaled, masked scores).
INTERP_SCRIPT = """
import itertools
import math
import jax, jax.numpy as jnp, numpy as np
from jax._src.pallas.mosaic_gpu.interpret import params
from generated.fa3_interp.mosaic_gpu import fa3_interp
from generated.fa3_interp.reference import fa3_interp_reference
B, S, H, D = 1, 256, 1, 64
q, k, v = (jax.random.normal(key, (B, S, H, D), jnp.float32).astype(jnp.bfloat16) for key in jax.random.split(jax.random.key(0), 3))
# 64-key blocks through 2 or 3 slots. Causal: the two CTAs take 2 and 4 blocks, and the first
# consumer's last block lies wholly past its rows. Not causal: 4 blocks. Each schedule: the
# overlapped one, and the consumers' ping-pong. Then 128 query rows a consumer: one CTA.
configs = [(causal, 64, 64, slots, pingpong) for causal, slots, pingpong in itertools.product((True, False), (2, 3), (False, True))]
configs += [(causal, 128, 64, 2, pingpong) for causal, pingpong in itertools.product((True, False), (False, True))]
for causal, bq, bk, slots, pingpong in configs:
    with params.force_gpu_interpret_mode(params.InterpretGPUParams()):
        o, lse, o_err = fa3_interp(q, k, v, causal=causal, bq=bq, bk=bk, slots=slots, pingpong=pingpong)
    want = fa3_interp_reference(q, k, v, causal=causal)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(D)
    if causal:
        s = jnp.where(jnp.arange(S)[:, None] >= jnp.arange(S)[None, :], s, -jnp.inf)
    o_diff = np.max(np.abs(np.asarray(o, np.float32) - np.asarray(want, np.float32)))
    lse_err = np.max(np.abs(np.asarray(lse) - np.asarray(jax.nn.logsumexp(s, axis=-1))))
    # o_err, o's rounding error: at most half a bfloat16 ulp of o (up to 2^-8 of it), and not all zero
    o, o_err = np.asarray(o, np.float32), np.asarray(o_err, np.float32)
    rounding = np.max(np.abs(o_err) / np.maximum(np.abs(o), 1e-30))
    print(causal, bq, bk, slots, pingpong, float(o_diff), float(lse_err), float(rounding), int(np.count_nonzero(o_err)))
"""


@pytest.mark.slow
def test_ring_masks_and_softmax_run_in_mosaic_gpu_interpret_mode(tmp_path):
    """The producer's ring (refills after both consumers free a slot, the drain of the last
    releases), the causal block counts and masks, the softmax overlapped with the next block's
    scores or taking turns with the other consumer's matmuls (ping-pong), the log-sum-exp and o's
    rounding error, in Mosaic GPU interpret mode on the CPU (with the rewrites of _interpretable). A barrier with a release too few or too many hangs: the subprocess then
    times out and fails the test; a phase left unwaited fails it too."""
    pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
    rows = _run_interpreted(tmp_path, "fa3_interp", _interpretable(), INTERP_SCRIPT)
    assert [r[:5] for r in rows] == [[str(c), "64", "64", str(s), str(p)] for c in (True, False) for s in (2, 3)
                                     for p in (False, True)] + [[str(c), "128", "64", "2", str(p)] for c in (True, False)
                                                                for p in (False, True)]
    for *_, o_diff, lse_err, rounding, nonzero in rows:
        assert float(o_diff) <= 2e-2 and float(lse_err) <= 1e-5, rows  # bf16 outputs; float32 lse
        assert float(rounding) <= 2.0 ** -8 and int(nonzero) > 1000, rows  # of 256 * 64 elements
