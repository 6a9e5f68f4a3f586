"""codegen.dtypes is kspec's jax-free dtype table: check it against jax.numpy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kspec.codegen.spec import dtypes as dt


@pytest.mark.parametrize("name", sorted(dt.DTYPES))
def test_dtype_is_real_with_recorded_itemsize_and_kind(name):
    itemsize, kind = dt.DTYPES[name]
    real = jnp.dtype(name)
    assert real.name == name
    assert real.itemsize == itemsize
    if name == "bool":
        assert real == jnp.bool_
    elif kind == "f":
        assert jnp.issubdtype(real, jnp.floating)
    elif kind == "c":
        assert jnp.issubdtype(real, jnp.complexfloating)
    elif kind == "i":
        assert jnp.issubdtype(real, jnp.signedinteger)
    else:
        assert kind == "u" and jnp.issubdtype(real, jnp.unsignedinteger)
    assert dt.itemsize(name) == itemsize
    assert dt.is_float(name) == (kind in "fc")


@pytest.mark.parametrize("name", sorted(dt.TOLERANCES))
def test_every_float_dtype_has_a_tolerance(name):
    assert name in dt.DTYPES and dt.is_float(name)


def test_float_dtypes_all_have_tolerances():
    assert {n for n in dt.DTYPES if dt.is_float(n)} == set(dt.TOLERANCES)


def test_tolerances_loosen_with_precision():
    """Fewer mantissa bits (finfo) never gets a tighter tolerance."""
    order = sorted(dt.TOLERANCES, key=lambda n: jnp.finfo(jnp.dtype(n)).nmant)
    for looser, tighter in zip(order, order[1:]):
        assert dt.TOLERANCES[looser]["atol"] >= dt.TOLERANCES[tighter]["atol"]
        assert dt.TOLERANCES[looser]["rtol"] >= dt.TOLERANCES[tighter]["rtol"]


def test_least_precise_matches_finfo():
    for a in dt.TOLERANCES:
        for b in dt.TOLERANCES:
            got = dt.least_precise([a, b, "int32"])
            assert jnp.finfo(jnp.dtype(got)).nmant == min(jnp.finfo(jnp.dtype(a)).nmant, jnp.finfo(jnp.dtype(b)).nmant)
    assert dt.least_precise(["int32", "bool"]) is None


def test_tolerance():
    assert dt.tolerance(["float32", "bfloat16"]) == dt.TOLERANCES["bfloat16"]
    assert dt.tolerance(["int32"]) == dt.EXACT
    spec = {"bfloat16": {"atol": 1e-2}}
    case = {"bfloat16": {"rtol": 0.5}, "float32": {"atol": 9.0}}
    assert dt.tolerance(["float32", "bfloat16"], spec, case) == {"atol": 1e-2, "rtol": 0.5, "rel_err": 5e-3}
    assert dt.tolerance(["int32"], {"int32": {"atol": 1}}) == {"atol": 1, "rtol": 0.0}
    assert np.finfo(np.float32).eps < dt.TOLERANCES["float32"]["rtol"]
