"""backend="auto" at any shape a spec admits: the library's norms and softmax run any width on
Triton (masked rows), the dispatcher knows before tracing what a backend cannot run, and a call
the spec's constraints refuse raises an error naming the constraint.

The Triton kernels are lowered for CUDA on the CPU (the lowering is where Pallas Triton refuses
arrays that are not a power of two), and their bodies run in Pallas' interpreter: the same
module with pallas_call(interpret=True)."""

from __future__ import annotations

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
NORMS = ("softmax", "softmax_dx", "rms_norm", "layer_norm", "layer_norm_dx", "layer_norm_dparams")


def _package(name: str):
    return importlib.import_module(f"generated.{name}")


def _interpreted_triton(name: str):
    """generated/<name>/triton.py as written, but with pallas_call(interpret=True)."""
    origin = importlib.util.find_spec(f"generated.{name}.triton").origin
    source = Path(origin).read_text(encoding="utf-8")
    assert source.count("interpret=False,") == 1
    module = types.ModuleType(f"generated.{name}.triton_interpreted")
    module.__package__ = f"generated.{name}"
    exec(compile(source.replace("interpret=False,", "interpret=True,"), origin, "exec"), module.__dict__)
    return module


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
    if name == "layer_norm_dx":
        return (full(), row(), full())
    return (full(), full())  # layer_norm_dparams: x, dy


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
