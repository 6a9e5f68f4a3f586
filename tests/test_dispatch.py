"""backend="auto" at any shape a spec admits: the library's norms and softmax run any width on
Triton (masked rows), the dispatcher knows before tracing what a backend cannot run, and a call
the spec's constraints refuse raises an error naming the constraint.

The Triton kernels are lowered for CUDA on the CPU (the lowering is where Pallas Triton refuses
arrays that are not a power of two), and their bodies run in Pallas' interpreter: the same
function with interpret=True."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

WIDTHS = (768, 1000, 5120)  # BERT-base, a ragged width, LLaMA-13B
NORMS = ("softmax", "softmax_dx", "rms_norm", "rms_norm_bwd", "layer_norm", "layer_norm_bwd")


def _package(name: str):
    return importlib.import_module(f"generated.{name}")


def _interpreted_triton(name: str):
    """generated/<name>/triton.py's function with interpret=True: the Triton body in Pallas' interpreter."""
    module = importlib.import_module(f"generated.{name}.triton")
    return types.SimpleNamespace(**{name: functools.partial(getattr(module, name), interpret=True)})


def _inputs(name: str, M: int, N: int, dtype=jnp.float32):
    keys = iter(jax.random.split(jax.random.key(M * 7919 + N), 8))
    row = lambda: jax.random.normal(next(keys), (1, N), jnp.float32).astype(dtype)  # noqa: E731
    full = lambda: jax.random.normal(next(keys), (M, N), jnp.float32).astype(dtype)  # noqa: E731
    if name == "softmax":
        return (full(),)
    if name == "softmax_dx":
        return (jax.nn.softmax(full().astype(jnp.float32), axis=-1).astype(dtype), full())
    if name == "rms_norm":
        return (full(), row())
    if name == "layer_norm":
        return (full(), row(), row())
    return (full(), row(), full())  # layer_norm_bwd, rms_norm_bwd: x, gamma, dy


def _lowers_for_cuda(fn, *args) -> str | None:
    """None if `fn` lowers for CUDA, else the error's first line."""
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except Exception as e:  # noqa: BLE001 - whatever Pallas raises is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return None


@pytest.mark.parametrize("name", NORMS)
def test_triton_norms_run_any_width_in_the_interpreter_and_lower_for_cuda(name):
    pkg, kernel = _package(name), _interpreted_triton(name)
    for N in WIDTHS:
        M = 6 if N > 1000 else 19
        args = _inputs(name, M, N)
        got = getattr(kernel, name)(*args)
        want = getattr(pkg, f"{name}_reference")(*args)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            if g.ndim == 3:  # partial sums, one per block of rows: the blocks are the backend's, the sums agree
                g, w = g.sum(axis=0), w.sum(axis=0)
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5, err_msg=f"{name} N={N}")
        shapes = [jax.ShapeDtypeStruct(a.shape, jnp.bfloat16) for a in args]
        module = importlib.import_module(f"generated.{name}.triton")
        assert _lowers_for_cuda(getattr(module, name), *shapes) is None
        assert pkg._dispatch.why_not("triton", *shapes) is None


def test_auto_on_gpu_takes_triton_at_model_widths_without_a_warning():
    for name in NORMS:
        pkg = _package(name)
        for N in WIDTHS + (12288,):
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _inputs(name, 64, N)]
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert pkg._dispatch.choose("auto", *args, platform="gpu") == "triton"


def test_the_dispatcher_agrees_with_the_lowering_on_what_triton_cannot_run():
    """softmax_rows' Triton blocks are whole rows, loaded unmasked: at a width that is not a
    power of two Pallas Triton refuses them. The dispatcher says so before tracing, and says
    nothing where the lowering succeeds."""
    pkg = _package("softmax_rows")
    module = importlib.import_module("generated.softmax_rows.triton")
    for N in (512, 768, 1024, 1000):
        x = jax.ShapeDtypeStruct((64, N), jnp.float32)
        why = pkg._dispatch.why_not("triton", x)
        lowered = _lowers_for_cuda(module.softmax_rows, x)
        assert (why is None) == (lowered is None), (N, why, lowered)
        if why is not None:
            assert "power of 2" in lowered and why.endswith("is not all powers of two, which Triton needs")


def test_auto_passes_over_a_backend_that_cannot_run_a_call_and_warns_once(kspec, write_spec, tmp_path):
    """A backend's own constraint rules it out for a call: auto goes on to the reference, warns
    once per reason, and the result is the reference's. A named backend that cannot run the call,
    and a call that breaks the spec's constraint over dims, raise errors naming why."""
    import sys

    path = write_spec(_SPEC)
    assert kspec("generate", "--out", "dispatch_out", str(path)).rc == 0
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module("dispatch_out.scale_even")
        x = jnp.arange(12.0).reshape(3, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert np.array_equal(pkg.scale_even(x), x * 2)  # N even: interpret runs it
        y = jnp.arange(15.0).reshape(3, 5)
        with pytest.warns(pkg.KernelFallbackWarning) as record:
            out = pkg.scale_even(y)
            pkg.scale_even(y)
        assert np.array_equal(out, y * 2)
        assert [str(w.message) for w in record] == [
            "scale_even: backend 'interpret' cannot run this call (interpret runs even widths only (N=5)); "
            "trying the reference"
        ]
        with pytest.raises(pkg.UnsupportedCallError, match=r"^scale_even: backend 'interpret' cannot run this call: "
                           r"interpret runs even widths only \(N=5\)$"):
            pkg.scale_even(y, backend="interpret")
        with pytest.raises(pkg.UnsupportedCallError, match=r"^scale_even: M must be at most 64 \(M=65, N=4\)$"):
            pkg.scale_even(jnp.zeros((65, 4)))
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == "dispatch_out" or m.startswith("dispatch_out.")]:
            del sys.modules[mod]


def test_a_call_without_the_params_an_input_shape_uses_takes_their_defaults(kspec, write_spec, tmp_path):
    """x's shape is [M, bk] with bk tunable, s's is [h] with h a constant param: a call that leaves
    them out checks the shapes against the resolved values, in the package function and in a
    backend's own function, and a shape that disagrees with them names the shape it needed."""
    import sys

    path = write_spec(_WIDTH_SPEC, name="width_param")
    assert kspec("generate", "--out", "width_out", str(path)).rc == 0
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module("width_out.width_param")
        interpret = importlib.import_module("width_out.width_param.interpret")
        x, s = jnp.arange(128.0).reshape(16, 8), jnp.ones((2,), jnp.float32)
        assert np.array_equal(pkg.width_param(x, s), x * 2 + 2)
        assert np.array_equal(interpret.width_param(x, s), x * 2 + 2)
        wide = jnp.ones((16, 16), jnp.float32)
        assert np.array_equal(pkg.width_param(wide, s, bk=16), wide * 2 + 2)
        with pytest.raises(ValueError, match=r"^width_param: x must have shape \(16, 8\), got \(16, 16\)"):
            pkg.width_param(wide, s)
        with pytest.raises(ValueError, match=r"^width_param: x must have shape \(16, 8\), got \(16, 16\)"):
            interpret.width_param(wide, s)
        with pytest.raises(ValueError, match=r"^width_param: s must have shape \(2,\), got \(3,\)"):
            pkg.width_param(x, jnp.ones((3,), jnp.float32))
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == "width_out" or m.startswith("width_out.")]:
            del sys.modules[mod]


def test_the_dispatcher_agrees_with_the_mosaic_tpu_lowering_on_1d_blocks(kspec, write_spec, tmp_path):
    """A 1-D block on Mosaic TPU is the whole dim, a multiple of 1024 or a power of two of at least
    128 x packing: why_not says so before tracing exactly where the lowering (for the TPU chip
    `kspec verify --lower` names) refuses the block."""
    import sys

    from kspec.codegen.run import lowering

    path = write_spec(_VECTOR_SPEC, name="scale_vector")
    assert kspec("generate", "--out", "vector_out", str(path)).rc == 0
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module("vector_out.scale_vector")
        module = importlib.import_module("vector_out.scale_vector.mosaic_tpu")
        for n, dtype, bs in [(4096, jnp.float32, 128), (4096, jnp.bfloat16, 128), (4096, jnp.bfloat16, 256),
                             (768, jnp.float32, 384), (6144, jnp.float32, 1536), (6144, jnp.bfloat16, 3072),
                             (768, jnp.float32, 768)]:
            x = jax.ShapeDtypeStruct((n,), dtype)
            why = pkg._dispatch.why_not("mosaic_tpu", x, bs=bs)
            try:
                with lowering.target("mosaic_tpu"):
                    jax.jit(functools.partial(module.scale_vector, bs=bs)).trace(x).lower(lowering_platforms=("tpu",))
                lowered = None
            except ValueError as e:
                lowered = str(e).splitlines()[0]
            assert (why is None) == (lowered is None), (n, dtype, bs, why, lowered)
            if why is not None:
                assert why == (f"x block ({bs},) is not the whole dim, a multiple of 1024 or a power of two of at least "
                               "128 x packing, as Mosaic TPU needs of a 1-D block")
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == "vector_out" or m.startswith("vector_out.")]:
            del sys.modules[mod]


_VECTOR_SPEC = """\
kspec: 1
name: scale_vector
params:
  bs: {default: 1024, choices: [256, 512, 1024]}
inputs:
  x: {shape: [N], dtype: [float32, bfloat16]}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
cases:
  - {name: even, N: 4096}
  - {name: ragged, N: 5000, dtype: float32}
backends:
  interpret:
  mosaic_tpu:
"""


_WIDTH_SPEC = """\
kspec: 1
name: width_param
params:
  bk: {default: 8, choices: [8, 16], doc: Width of x.}
  h: {default: 2, doc: Length of s.}
inputs:
  x: {shape: [M, bk], dtype: [float32]}
  s: {shape: [h], dtype: x}
outputs:
  o: {shape: [M, bk], dtype: x}
grid: ["cdiv(M, 8)"]
blocks:
  x: {block_shape: [8, bk], index_map: "i -> (i, 0)"}
  s: {block_shape: [h], index_map: "i -> (0,)"}
  o: {block_shape: [8, bk], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...] * 2 + jnp.sum(s_ref[...])
reference: |
  return x * 2 + jnp.sum(s)
cases:
  - {name: c, M: 16}
"""


_SPEC = """\
kspec: 1
name: scale_even
inputs:
  x: {shape: [M, N], dtype: [float32]}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M <= 64", message: "M must be at most 64"}
grid: [1]
blocks:
  x: {block_shape: [M, N], index_map: "i -> (0, 0)"}
  o: {block_shape: [M, N], index_map: "i -> (0, 0)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
cases:
  - {name: even, M: 8, N: 16}
  - {name: odd, M: 8, N: 15}
backends:
  interpret:
    constraints:
      - {expr: "N % 2 == 0", message: "interpret runs even widths only"}
"""


@pytest.mark.parametrize("name", ("rms_norm_bwd", "layer_norm_bwd"))
@pytest.mark.parametrize("N", (768, 1000))
def test_norm_backward_kernels_take_whole_rows_or_column_chunks_alike(name, N):
    """The fused norm backward kernels hold whole rows in registers, or at the widest rows read
    them in column chunks (`chunks`; the last chunk ragged at these widths) and add the partial
    sums up in memory: the same gradients either way."""
    kernel = _interpreted_triton(name)
    args = _inputs(name, 21, N)
    fn = getattr(kernel, name)
    whole, chunked = fn(*args, bm=8, chunks=1), fn(*args, bm=8, chunks=4)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    want = getattr(_package(name), f"{name}_reference")(*args, bm=8)
    for g, w in zip(jax.tree.leaves(chunked), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
