"""The shape bucket and the dtype label that key tuned configs have one definition: the module every
generated package shares (templates/runtime.py, written as generated/_runtime.py). kspec's tuning
tables are keyed by the same functions the packages look them up with."""

from __future__ import annotations

import importlib

import jax.numpy as jnp

from kspec.codegen.spec import tuning


def test_kspec_keys_tuned_configs_with_the_generated_packages_own_functions():
    shared = importlib.import_module("generated._runtime")
    for dims in [(1, 2, 3), (768, 5120), (1000, 4096, 12288), (65536, 1)]:
        assert tuning.bucket(dims) == shared.bucket(dims)
    assert tuning.bucket((768, 5120, 1)) == (1024, 8192, 1)
    assert tuning.bucket.__code__.co_code == shared.bucket.__code__.co_code
    assert tuning.dtype_label(["bfloat16", "float32", "bfloat16"]) == "bfloat16,float32"
    arrays = [jnp.zeros((2,), jnp.bfloat16), jnp.zeros((3,), jnp.float32), jnp.zeros((1,), jnp.bfloat16)]
    assert shared.dtype_label(arrays) == "bfloat16,float32"
