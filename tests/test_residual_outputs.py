"""Residual outputs (`residual: true`): written by the kernel for the backward pass, not returned.

The checks (E416 to E418 are pinned in test_diagnostics.py; here the bindings and partition specs
that misuse one), the generated functions of a throwaway spec (the package function and the
reference return the other outputs, a backend function returns every output with residuals=True,
jax.grad runs through the saved residual, verify's run and grad rows pass), and the shipped flash
attention, whose backward kernels recompute the probabilities from its residual log-sum-exp.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import invoke_kspec, mutate

BLOCK = '{block_shape: [bm, N], index_map: "i -> (i, 0)"}'

# o = x * x, with t = 2x written beside it for the backward pass: dx = t * do.
SQ = f"""\
kspec: 1
name: sq
params: {{bm: 16}}
inputs:
  x: {{shape: [M, N], dtype: [float32, bfloat16]}}
outputs:
  o: {{shape: [M, N], dtype: x}}
  t: {{shape: [M, N], dtype: float32, residual: true, doc: "2x, saved for the backward pass."}}
grid: {{i: "cdiv(M, bm)"}}
blocks: {{x: {BLOCK}, o: {BLOCK}, t: {BLOCK}}}
body: |
  x = x_ref[...].astype(jnp.float32)
  o_ref[...] = (x * x).astype(o_ref.dtype)
  t_ref[...] = 2 * x
reference: |
  return x * x
cases: [{{M: 16, N: 128}}, {{name: ragged, M: 24, N: 128, dtype: bfloat16}}]
backends: {{interpret: null, mosaic_tpu: null}}
vjp:
  residuals: [t]
  backward:
    - spec: sq_dx.yaml
      inputs: {{t: t, g: grad(o)}}
      grads: {{dx: x}}
"""
SQ_DX = f"""\
kspec: 1
name: sq_dx
params: {{bm: 16}}
inputs:
  t: {{shape: [M, N], dtype: float32}}
  g: {{shape: [M, N], dtype: [float32, bfloat16]}}
outputs:
  dx: {{shape: [M, N], dtype: g}}
grid: {{i: "cdiv(M, bm)"}}
blocks: {{t: {BLOCK}, g: {BLOCK}, dx: {BLOCK}}}
body: |
  dx_ref[...] = (t_ref[...] * g_ref[...].astype(jnp.float32)).astype(dx_ref.dtype)
reference: |
  return (t * g.astype(jnp.float32)).astype(g.dtype)
cases: [{{M: 16, N: 128}}, {{name: ragged, M: 24, N: 128}}]
backends: {{interpret: null, mosaic_tpu: null}}
"""


def _project(tmp_path: Path, specs: dict) -> Path:
    (tmp_path / "specs").mkdir(parents=True)
    for name, text in specs.items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    return tmp_path


def _check(tmp_path: Path, sq: str) -> list:
    _project(tmp_path, {"sq": sq, "sq_dx": SQ_DX})
    r = invoke_kspec("check", "specs/sq.yaml", cwd=tmp_path)
    return [r.rc] + r.out.splitlines()


def test_a_residual_output_checks(tmp_path):
    assert _check(tmp_path, SQ) == [0, "2 spec(s) OK"]


def test_a_residual_output_has_no_cotangent(tmp_path):
    bad = mutate(SQ, ("inputs: {t: t, g: grad(o)}", "inputs: {t: grad(t), g: grad(o)}"))
    assert _check(tmp_path, bad) == [
        2,
        "specs/sq.yaml:20:15: error[E422]: vjp.residuals: `t` is saved but no backward kernel takes it",
        "  = help: drop it from vjp.residuals",
        "specs/sq.yaml:23:19: error[E422]: sq_dx.yaml: inputs: t: output `t` is `residual: true`, so it is not "
        "returned and `grad(t)` does not exist",
        "  = help: bind `t` itself, the saved residual",
        "2 error(s) in 1 of 2 spec(s)",
    ]


def test_a_residual_output_is_not_sharded(tmp_path):
    sharded = mutate(SQ, ("vjp:", "sharding:\n  mesh: {d: 2}\n  specs: {x: [d], o: [d], t: [d]}\nvjp:"))
    assert _check(tmp_path, sharded) == [
        2,
        "specs/sq.yaml:21:27: error[E802]: partition spec for `t`, a residual output, which the sharded function "
        "does not return",
        "  = help: drop the partition spec of t",
        "1 error(s) in 1 of 2 spec(s)",
    ]


# Defined for every `_python` source: the number of results of the kernel (a pallas_call, or a mesh
# kernel's primitive) inside a jitted function's jaxpr.
KERNEL_RESULTS = """
def kernel_results(jaxpr):
    for e in jaxpr.eqns:
        if e.primitive.name in ("jit", "pjit"):
            return kernel_results(e.params["jaxpr"].jaxpr)
        if any("jaxpr" in key for key in e.params):
            return len(e.outvars)
"""


def _python(proj: Path, source: str) -> str:
    """Run `source` with the project's generated/ importable (as an application would)."""
    proc = subprocess.run([sys.executable, "-c", KERNEL_RESULTS + textwrap.dedent(source)], cwd=proj,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_functions_return_the_other_outputs_and_differentiate(tmp_path):
    proj = _project(tmp_path, {"sq": SQ, "sq_dx": SQ_DX})
    r = invoke_kspec("generate", cwd=proj)
    assert r.rc == 0, r.both
    out = _python(proj, """
        import jax, jax.numpy as jnp
        from jax.experimental.pallas import tpu as pltpu
        from generated.sq import sq, sq_reference, interpret, mosaic_tpu, _vjp
        x = jnp.linspace(-1.0, 1.0, 24 * 128).reshape(24, 128)
        print(type(sq(x, backend="interpret")).__name__, type(sq_reference(x)).__name__,
              type(interpret.sq(x)).__name__)
        o, t = interpret.sq(x, residuals=True)
        print(float(jnp.abs(o - x * x).max()), float(jnp.abs(t - 2 * x).max()))
        loss = lambda x: jnp.sum(sq(x, backend="interpret") * x)  # d/dx sum(x^3) = 3x^2
        print(float(jnp.abs(jax.jit(jax.grad(loss))(x) - 3 * x * x).max()))
        tpu = _vjp.differentiable("mosaic_tpu", (), pltpu.InterpretParams())
        print(float(jnp.abs(jax.grad(lambda x: jnp.sum(tpu(x) * x))(x) - 3 * x * x).max()))
        rows = jnp.stack([x, -x])
        print(float(jnp.abs(jax.vmap(jax.grad(loss))(rows) - 3 * rows * rows).max()))
    """)
    kinds, values, grads, tpu, mapped = out.splitlines()
    assert kinds.split() == ["ArrayImpl"] * 3
    assert [float(v) for v in values.split()] == [0.0, 0.0]
    assert float(grads) < 1e-6 and float(tpu) < 1e-6 and float(mapped) < 1e-6
    backend = (proj / "generated" / "sq" / "interpret.py").read_text()
    assert "def sq(x, *, bm=16, residuals=False):" in backend
    assert "    return out if residuals else out[0]\n" in backend


def test_a_call_without_residuals_leaves_them_out_of_the_kernel(tmp_path):
    """residuals=False: the pallas_call has the returned outputs only, and the body's ref for a residual
    output drops its stores; a body that loads from it gets a TypeError naming it."""
    proj = _project(tmp_path / "sq", {"sq": SQ, "sq_dx": SQ_DX})
    reads = mutate(SQ, ("  t_ref[...] = 2 * x", "  t_ref[...] = 2 * x\n  t_ref[...] += 0 * x"))
    reading = _project(tmp_path / "reads", {"sq": reads, "sq_dx": SQ_DX})
    assert invoke_kspec("generate", cwd=proj).rc == 0 and invoke_kspec("generate", cwd=reading).rc == 0
    source = """
        import jax, jax.numpy as jnp
        from generated.sq import interpret
        x = jnp.ones((16, 128), jnp.float32)

        try:
            print(*(kernel_results(jax.make_jaxpr(lambda x: interpret.sq(x, residuals=r))(x).jaxpr) for r in (False, True)),
                  float(jnp.abs(interpret.sq(x, residuals=True)[1] - 2).max()), float(jnp.abs(interpret.sq(x) - 1).max()))
        except TypeError as e:
            print(e)
    """
    assert _python(proj, source).splitlines() == ["1 2 0.0 0.0"]
    assert _python(reading, source).splitlines() == ["sq: the body reads t, a residual output, written only with residuals=True"]


# sq as a mesh kernel over one TensorCore: two pipelines, the second writing t only where the call
# asks for the residual outputs (its ref is None otherwise).
SQ_MESH = """\
kspec: 1
name: sq
kind: mesh
params: {bm: 16}
inputs:
  x: {shape: [M, N], dtype: [float32]}
outputs:
  o: {shape: [M, N], dtype: x}
  t: {shape: [M, N], dtype: float32, residual: true}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
mesh:
  cores: {core: 1}
pipelines:
  squares:
    grid: {i: "M // bm"}
    in: {x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}}
    out: {o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}}
  doubles:
    grid: {i: "M // bm"}
    in: {x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}}
    out: {t: {block_shape: [bm, N], index_map: "i -> (i, 0)"}}
body: |
  def square(x_block, o_block):
      o_block[...] = x_block[...] * x_block[...]

  def double(x_block, t_block):
      t_block[...] = 2 * x_block[...]

  squares(square)(x_ref, o_ref)
  if t_ref is not None:
      doubles(double)(x_ref, t_ref)
reference: |
  return x * x
cases: [{M: 32, N: 128}]
backends: {mosaic_tpu: null}
vjp:
  residuals: [t]
  backward:
    - spec: sq_dx.yaml
      inputs: {t: t, g: grad(o)}
      grads: {dx: x}
"""


def test_a_mesh_kernel_leaves_out_the_residual_outputs_its_body_tests_for_none(tmp_path):
    """A mesh kernel whose body compares a residual output's ref with None gets None for it in a
    call without residuals=True, and the kernel (pl.kernel) has the returned outputs only; under
    jax.grad it writes it, in TPU interpret mode. A body that does not test writes it always."""
    proj = _project(tmp_path / "tested", {"sq": SQ_MESH, "sq_dx": SQ_DX})
    always = mutate(SQ_MESH, ("  if t_ref is not None:\n      doubles", "  doubles"))
    untested = _project(tmp_path / "always", {"sq": always, "sq_dx": SQ_DX})
    assert invoke_kspec("generate", cwd=proj).rc == 0 and invoke_kspec("generate", cwd=untested).rc == 0
    source = """
        import jax, jax.numpy as jnp
        from jax.experimental.pallas import tpu as pltpu
        from generated.sq import mosaic_tpu, _vjp
        x = jnp.linspace(-1.0, 1.0, 32 * 128).reshape(32, 128)
        run = pltpu.InterpretParams()
        counts = [kernel_results(jax.make_jaxpr(lambda x: mosaic_tpu.sq(x, interpret=run, residuals=r))(x).jaxpr)
                  for r in (False, True)]
        o, t = mosaic_tpu.sq(x, interpret=run, residuals=True)
        tpu = _vjp.differentiable("mosaic_tpu", (), run)
        grad = jax.grad(lambda x: jnp.sum(tpu(x) * x))(x)  # d/dx sum(x^3) = 3x^2
        print(*counts, float(jnp.abs(mosaic_tpu.sq(x, interpret=run) - x * x).max()),
              float(jnp.abs(t - 2 * x).max()), float(jnp.abs(grad - 3 * x * x).max()) < 1e-6)
    """
    assert _python(proj, source).split() == ["1", "2", "0.0", "0.0", "True"]
    assert _python(untested, source).split() == ["2", "2", "0.0", "0.0", "True"]
    assert "_runtime.inserted(_refs, () if residuals else ((2, None),))" in (proj / "generated" / "sq" / "mosaic_tpu.py").read_text()
    assert "_runtime" not in (untested / "generated" / "sq" / "mosaic_tpu.py").read_text()


def test_a_mesh_kernel_that_writes_a_residual_output_in_every_call_is_a_warning(tmp_path):
    """W904: the body copies t without testing t_ref against None; check still passes."""
    always = mutate(SQ_MESH, ("  if t_ref is not None:\n      doubles", "  doubles"))
    for proj, text in ((tmp_path / "always", always), (tmp_path / "tested", SQ_MESH)):
        _project(proj, {"sq": text, "sq_dx": SQ_DX})
    r = invoke_kspec("check", "specs/sq.yaml", cwd=tmp_path / "always")
    assert (r.rc, r.out.splitlines()) == (0, [
        "specs/sq.yaml:9:48: warning[W904]: mosaic_tpu: the mesh kernel writes residual output `t` in every call, "
        "also outside jax.grad, where nothing reads it",
        "  = help: put its writes under `if t_ref is not None:` in the body: a call that does not ask for the "
        "residual outputs then leaves it out of the kernel, and the body gets None for it",
        "2 spec(s) OK",
    ])
    assert invoke_kspec("check", "specs/sq.yaml", cwd=tmp_path / "tested").out == "2 spec(s) OK\n"


@pytest.mark.parametrize("residuals", [False, True])
def test_flash_attention_writes_its_residuals_only_when_asked(residuals):
    """Lowered for an NVIDIA GPU (no GPU needed): the Triton kernel of a call that returns o alone has one
    result; the vjp's forward pass (residuals=True) also writes lse and o_err."""
    from generated.flash_attention import triton

    x = jax.ShapeDtypeStruct((2, 512, 8, 128), jnp.bfloat16)
    call = functools.partial(triton.flash_attention, causal=True, bq=128, bk=64, warps=4, stages=2, residuals=residuals)
    text = jax.jit(call).trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text()
    kernels = [line for line in text.splitlines() if "stablehlo.custom_call @__gpu$xla.gpu.triton" in line]
    assert len(kernels) == 1
    assert kernels[0].lstrip().startswith("%1:3 = " if residuals else "%1 = ")


def test_verify_compares_the_returned_outputs_and_the_gradient(tmp_path):
    proj = _project(tmp_path, {"sq": SQ, "sq_dx": SQ_DX})
    assert invoke_kspec("generate", cwd=proj).rc == 0
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--backend", "interpret", "--seed", "7", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    rows = json.loads(report.read_text())["results"]
    modes = {(x["kernel"], x["mode"], x["case"]) for x in rows if x["status"] == "pass"}
    assert {("sq", m, c) for m in ("run", "grad") for c in ("case0", "ragged")} <= modes
    assert all(x["status"] == "pass" for x in rows)


# -- the shipped flash attention ---------------------------------------------------------------------


def _attention_inputs(seed: int, shape=(1, 128, 2, 64), dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 4)
    return [jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in keys]


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_writes_the_log_sum_exp(causal):
    from generated.flash_attention import interpret

    q, k, v, _ = _attention_inputs(1)
    o, lse, o_err = interpret.flash_attention(q, k, v, causal=causal, residuals=True)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / math.sqrt(q.shape[-1])
    if causal:
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    assert lse.shape == (1, 2, 128) and lse.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(lse), np.asarray(jax.nn.logsumexp(s, axis=-1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(interpret.flash_attention(q, k, v, causal=causal)))
    # float32 inputs: o is the float32 output, and its rounding error is 0.
    assert o_err.shape == o.shape and o_err.dtype == jnp.float32 and not np.asarray(o_err).any()


def test_flash_attention_saves_the_rounding_error_of_a_bfloat16_output():
    """With bfloat16 inputs the forward pass saves o's rounding error, o_err = (float32 output) - o, for the
    backward kernels' delta = rowsum(do * o): each element is at most half a bfloat16 step of o, so o + o_err
    rounds back to o (or, where o_err's own rounding made it exactly half a step, lies on the tie), and it is
    not zero (the float32 output is not a bfloat16 number)."""
    from generated.flash_attention import interpret

    q, k, v, _ = _attention_inputs(5, dtype=jnp.bfloat16)
    o, _, o_err = interpret.flash_attention(q, k, v, residuals=True)
    o32, err = np.asarray(o, np.float32), np.asarray(o_err, np.float32)
    assert o_err.shape == o.shape and o_err.dtype == jnp.bfloat16
    half_step = 2.0 ** (np.floor(np.log2(np.abs(o32))) - 8)  # bfloat16 keeps 8 significant bits
    assert (np.abs(err) <= half_step).all()
    back = np.asarray(jnp.asarray(o32 + err).astype(jnp.bfloat16)) == np.asarray(o)
    assert (back | (np.abs(err) == half_step)).all() and back.mean() > 0.99
    assert np.count_nonzero(err) > 0.9 * err.size


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_gradients_match_the_reference(causal):
    from generated.flash_attention import flash_attention, flash_attention_reference

    q, k, v, w = _attention_inputs(2)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, causal=causal) * w)

    kernel = lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, backend="interpret")  # noqa: E731
    got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss(flash_attention_reference), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


def _grouped(seed: int, S: int, H: int = 4, Hkv: int = 2, D: int = 64):
    """q and a cotangent of [1, S, H, D], k and v of [1, S, Hkv, D]."""
    keys = jax.random.split(jax.random.key(seed), 4)
    q, w = (jax.random.normal(keys[n], (1, S, H, D), jnp.float32) for n in (0, 3))
    k, v = (jax.random.normal(keys[n], (1, S, Hkv, D), jnp.float32) for n in (1, 2))
    return q, k, v, w


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_with_grouped_heads_packed_sequences_and_ragged_s(causal):
    """4 query heads over 2 key/value heads, three sequences packed into one row (sorted runs of segment
    ids, the keys' taken to be the queries'), S = 200 in blocks of 64: the output and the gradients of q, k
    and v match the reference, and each sequence's output is that of the sequence alone."""
    from generated.flash_attention import flash_attention, flash_attention_reference

    q, k, v, w = _grouped(3, 200)
    ids = jnp.repeat(jnp.arange(3, dtype=jnp.int32), jnp.array([70, 90, 40]), total_repeat_length=200)[None]

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, q_segment_ids=ids, causal=causal) * w)

    kernel = functools.partial(flash_attention, backend="interpret")
    o = kernel(q, k, v, q_segment_ids=ids, causal=causal)
    got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
    with jax.default_matmul_precision("highest"):
        want_o = flash_attention_reference(q, k, v, q_segment_ids=ids, causal=causal)
        want = jax.grad(loss(flash_attention_reference), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(np.asarray(o), np.asarray(want_o), rtol=1e-4, atol=1e-5)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)
    alone = kernel(q[:, 70:160], k[:, 70:160], v[:, 70:160], causal=causal)
    np.testing.assert_allclose(np.asarray(o[:, 70:160]), np.asarray(alone), rtol=1e-5, atol=1e-6)


def test_a_query_without_keys_of_its_segment_gets_zero():
    """Queries 10 to 19 are of a segment no key has: their output is 0 and their lse 0, which the backward
    kernels take as it is (their probabilities are 0), so every gradient is finite and matches the reference."""
    from generated.flash_attention import flash_attention, flash_attention_reference, interpret

    q, k, v, w = _grouped(4, 128, H=2, Hkv=1)
    kv_ids = jnp.zeros((1, 128), jnp.int32)
    q_ids = kv_ids.at[:, 10:20].set(5)
    o, lse, _ = interpret.flash_attention(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids, residuals=True)
    assert not np.asarray(o[:, 10:20]).any() and not np.asarray(lse[:, :, 10:20]).any()
    assert np.asarray(o[:, :10]).all() and np.isfinite(np.asarray(lse)).all()

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids) * w)

    got = jax.grad(loss(functools.partial(flash_attention, backend="interpret")), argnums=(0, 1, 2))(q, k, v)
    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss(flash_attention_reference), argnums=(0, 1, 2))(q, k, v)
    assert not np.asarray(got[0][:, 10:20]).any()
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)
