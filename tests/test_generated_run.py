"""Run the checked-in generated code on the CPU: the interpret backend against the reference.

One test per spec, case and dtype combination (codegen.instances.dtype_assignments), on
random inputs, compared with codegen.dtypes.tolerance. Then the package-level
function with backend="auto" under jax.jit, and select_backend's errors.
"""

from __future__ import annotations

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kspec.codegen.spec import dtypes as dt
from kspec.codegen import project as pipeline
from kspec.codegen.checks.instances import dtype_assignments, instantiate
from conftest import REPO

ALL_SPECS = {c.spec.name: c.spec for c in map(pipeline.compile_spec, pipeline.discover([], root=REPO))}
# pallas_call specs all have the interpret backend; mesh kernels (tests/test_mesh.py) run
# on the CPU only through TPU interpret mode, and Mosaic GPU ones lower.
SPECS = {name: spec for name, spec in ALL_SPECS.items() if spec.kind == "pallas_call"}


def _runs():
    for name, spec in sorted(SPECS.items()):
        for case in spec.cases:
            for dtypes in dtype_assignments(spec, case):
                label = "-".join(dtypes[o.name] for o in spec.inputs)
                yield pytest.param(name, case.name, dtypes, id=f"{name}-{case.name}-{label}")


def _inputs(spec, case, dtypes, seed=0):
    inst, diags = instantiate(spec, spec.variants["interpret"], case, dtypes)
    if spec.kernel_only:  # the kernel's own operands (a prologue's) are checked by `kspec check`, not here
        assert inst is not None, diags
    else:
        assert inst is not None and not diags, diags
    if any(op.init is not None and (op.init.code is not None or op.init.same_as is not None) for op in spec.inputs):
        # structured data (group sizes summing to M, say), made as verify makes it
        import importlib
        import types

        from kspec.codegen.run.inputs import make_inputs

        task = types.SimpleNamespace(seed=seed, kernel=spec.name, case=case.name, dtype_label="-".join(dtypes.values()))
        inits = getattr(importlib.import_module(f"generated.{spec.name}.reference"), "INITS", {})
        return make_inputs(task, spec, inst, dtypes, case.absent, inits)
    rng = np.random.default_rng(seed)
    out = []
    for op in spec.inputs:
        shape, dtype = inst.shapes[op.name], dtypes[op.name]
        init = op.init.kind if op.init is not None else None
        if dt.is_float(dtype) and init == "uniform":  # data the spec says the kernel meets, as verify makes it
            values = rng.uniform(op.init.low, op.init.high, size=shape).astype(np.float32)
        elif dt.is_float(dtype):
            values = rng.standard_normal(shape, dtype=np.float32)
        elif init == "index":  # indices in their range (a page table, lengths), as verify makes them
            values = rng.integers(0, max(op.init.bound(inst.env, inst.shapes), 1), size=shape, dtype=np.int32)
        else:
            values = rng.integers(-100, 100, size=shape, dtype=np.int32)
        out.append(jnp.asarray(values, dtype=jnp.dtype(dtype)))
    return out


def _params(spec, case, backend="interpret"):
    names = {p.name for p in spec.variants[backend].params}
    return {k: v for k, v in case.params.items() if k in names}


def _assert_close(got, want, spec, case, dtypes):
    tol = dt.tolerance(set(dtypes.values()), spec.tolerance, case.tolerance)
    got, want = (got if isinstance(got, (tuple, list)) else [got]), (want if isinstance(want, (tuple, list)) else [want])
    assert len(got) == len(want) == len(spec.returned)  # a residual output is not returned
    for g, w, op in zip(got, want, spec.returned):
        assert g.shape == w.shape, op.name
        assert g.dtype == jnp.dtype(dtypes[op.name]), op.name
        np.testing.assert_allclose(
            np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64), atol=tol["atol"], rtol=tol["rtol"]
        )


def test_every_spec_is_run():
    assert sorted(ALL_SPECS) == sorted(p.stem for p in (REPO / "specs").glob("*.yaml"))
    assert all("interpret" in s.variants for s in SPECS.values())
    assert {n for n, s in ALL_SPECS.items() if s.kind == "mesh"} == {
        "matmul_persistent", "matmul_bias_gelu_persistent", "matmul_pingpong", "matmul_bias_gelu_pingpong",
        "rms_norm_cores", "layer_norm_tma", "rms_norm_tma", "softmax_tma", "flash_attention_hopper"}


@pytest.mark.parametrize("name, case_name, dtypes", list(_runs()))
def test_interpret_matches_reference(name, case_name, dtypes):
    spec = SPECS[name]
    case = next(c for c in spec.cases if c.name == case_name)
    kernel = importlib.import_module(f"generated.{name}.interpret")
    reference = importlib.import_module(f"generated.{name}.reference")
    args = _inputs(spec, case, dtypes)
    got = getattr(kernel, name)(*args, **_params(spec, case))
    want = getattr(reference, f"{name}_reference")(*args, **_params(spec, case))
    _assert_close(got, want, spec, case, dtypes)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_package_auto_backend_under_jit(name):
    spec = SPECS[name]
    case = spec.cases[-1]
    dtypes = dtype_assignments(spec, case)[0]
    package = importlib.import_module(f"generated.{name}")
    assert jax.default_backend() == "cpu"
    assert package.select_backend("auto") == "interpret"
    args = _inputs(spec, case, dtypes, seed=1)
    fn = jax.jit(lambda *a: getattr(package, name)(*a, backend="auto"))
    got = fn(*args)
    want = getattr(package, f"{name}_reference")(*args)
    _assert_close(got, want, spec, case, dtypes)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_select_backend_errors_name_platform_and_runnable_backends(name):
    spec = SPECS[name]
    package = importlib.import_module(f"generated.{name}")
    assert package.BACKENDS == spec.backends
    assert package.available_backends("cpu") == ("interpret",)
    for backend in spec.backends:
        if backend == "interpret":
            continue
        message = f"{name}: backend '{backend}' cannot run on platform 'cpu'; backends that can: interpret"
        with pytest.raises(ValueError, match=re.escape(message)):
            package.select_backend(backend)
    with pytest.raises(ValueError, match=re.escape(f"{name}: unknown backend 'cuda'; declared: {', '.join(spec.backends)}")):
        package.select_backend("cuda")
    with pytest.raises(ValueError, match=re.escape(f"{name}: no backend for platform 'metal'")):
        package.select_backend("auto", platform="metal")


def test_package_call_with_a_gpu_backend_on_cpu_fails_before_tracing():
    package = importlib.import_module("generated.add")
    x = jnp.ones((8, 128), jnp.float32)
    message = "add: backend 'triton' cannot run on platform 'cpu'; backends that can: interpret"
    with pytest.raises(ValueError, match=re.escape(message)):
        package.add(x, x, backend="triton")


def test_generated_signature_checks_operands():
    package = importlib.import_module("generated.add")
    x = jnp.ones((8, 128), jnp.float32)
    with pytest.raises(ValueError, match=re.escape("add: y must have shape (8, 128), got (8, 64)")):
        package.add(x, jnp.ones((8, 64), jnp.float32))
    with pytest.raises(TypeError, match=re.escape("add: y must have dtype float32, got int32")):
        package.add(x, jnp.ones((8, 128), jnp.int32))
    with pytest.raises(ValueError, match=re.escape("add: x must have rank 2, got shape (8,)")):
        package.add(jnp.ones((8,), jnp.float32), jnp.ones((8,), jnp.float32))
