"""run/bench.py's extra input sets, which bench rotates through so that they do not all sit in
cache: floating inputs are drawn again, but data with structure is kept (init code, and inputs
another initialiser reads) and a copy (`same_as`) copies its source within each set."""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np

from kspec.codegen.run import bench
from conftest import VALID_SPEC, build_spec, mutate

X = "  x: {shape: [N], dtype: float32}\n"
SPEC = mutate(VALID_SPEC, (X, X + "  y: {shape: [N], dtype: float32, init: {same_as: x}}\n"
                                  "  z: {shape: [N], dtype: float32, init: {code: \"jnp.ones((N,), dtype)\"}}\n"
                                  "  w: {shape: [N], dtype: float32}\n"
                                  "  n: {shape: [N], dtype: int32, init: {kind: index, bound: \"N + w\"}}\n"
                                  "  v: {shape: [N], dtype: float32}\n"))


def test_extra_input_sets_keep_the_structure_of_the_inputs():
    spec = build_spec(SPEC)
    x = jnp.arange(64, dtype=jnp.float32)
    inputs = [x, x, jnp.ones(64, jnp.float32), jnp.full(64, 2.0, jnp.float32), jnp.zeros(64, jnp.int32), x]
    prep = types.SimpleNamespace(spec=spec, inputs=inputs)
    sets = bench._input_sets(types.SimpleNamespace(seed=1), prep, l2_bytes=4096)
    assert len(sets) > 2 and sets[0] is inputs
    for copy in sets[1:]:
        got = dict(zip("xyzwnv", map(np.asarray, copy)))
        assert not np.array_equal(got["v"], inputs[5])  # drawn again
        assert np.array_equal(got["y"], got["x"])  # the copy follows its source in every set
        assert np.array_equal(got["z"], np.ones(64)) and np.array_equal(got["w"], np.full(64, 2.0))  # kept
        assert np.array_equal(got["n"], np.zeros(64))  # integers are always kept
