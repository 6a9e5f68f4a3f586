"""run/timing.py and run/bench.py: the figures of a bench row (the median and its interval, the
ratios taken round by round, the roofline bound) and which competitors it skips. tests/test_bench.py
times kernels through `kspec bench`."""

from __future__ import annotations

import statistics

import pytest

from kspec.codegen.run import bench as benchrun
from kspec.codegen.run import timing
from kspec.codegen.backends.devices import peak_for


def test_median_interval_takes_the_binomial_ranks():
    # The 95% interval for a median of n values runs between the order statistics that the
    # binomial tables give: ranks 4 and 12 of 15, 40 and 61 of 100; below 6 values, the range.
    values = [float(v) for v in range(1, 16)]
    assert timing.median_ci(values[::-1]) == (8.0, 4.0, 12.0)
    assert timing.median_ci([float(v) for v in range(100, 0, -1)]) == (50.5, 40.0, 61.0)
    assert timing.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)
    assert timing.median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (3.5, 1.0, 6.0)
    assert timing.median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], level=0.5) == (3.5, 2.0, 5.0)


def test_paired_ratios_cancel_a_clock_swing_that_the_medians_keep():
    # The reference is 1.10x slower than the kernel in every round but one, while the clock
    # halves the speed of both in the last two rounds. Round by round the ratio is 1.10 but for
    # the one slow kernel sample; the kernel's median falls on that sample, so the ratio of the
    # two medians says 0.58x.
    clock = [1.0, 1.0, 1.0, 2.0, 2.0]
    reference = [1.1 * c for c in clock]
    kernel = [1.0, 1.0, 1.9, 2.0, 2.0]
    ratios = timing.paired(reference, kernel)
    assert ratios == pytest.approx([1.1, 1.1, 1.1 / 1.9, 1.1, 1.1])
    assert timing.median_ci(ratios)[0] == pytest.approx(1.1)
    assert statistics.median(reference) / statistics.median(kernel) == pytest.approx(1.1 / 1.9)
    with pytest.raises(ValueError):
        timing.paired([1.0, 2.0], [1.0])


def test_roofline_bound_decides_whether_a_copy_is_timed_alongside():
    h200 = peak_for("NVIDIA H200")
    mm = 2 * 8192**3, 3 * 8192 * 8192 * 2  # bf16 matmul: flops, bytes
    norm = 8 * 8192 * 8192, 2 * 8192 * 8192 * 4  # f32 layer norm
    assert benchrun._bound(h200, "bfloat16", *mm) == "compute"
    assert benchrun._bound(h200, "float32", *norm) == "memory"
    assert benchrun._bound(h200, "float32", None, 1 << 20) == "memory"
    assert benchrun._bound(None, "float32", *norm) is None


def test_a_competitor_is_skipped_off_its_platforms_or_without_a_module_it_requires():
    import types

    import jax

    module = types.SimpleNamespace(COMPETITOR_REQUIRES={
        "gone": ("jax.experimental.no_such_module",), "no_parent": ("jax.no_such_package.ops",), "here": ("jax.numpy",)})
    assert benchrun._not_here(module, "here", ("cpu",), "gpu") == "runs on cpu, not on gpu"
    assert benchrun._not_here(module, "here", ("cpu", "gpu"), "cpu") is None
    assert benchrun._not_here(module, "plain", ("cpu",), "cpu") is None
    for name, missing in (("gone", "jax.experimental.no_such_module"), ("no_parent", "jax.no_such_package.ops")):
        assert benchrun._not_here(module, name, ("cpu",), "cpu") == f"needs {missing}, which jax {jax.__version__} does not have"
    # A module without requirements (specs without `requires:`) skips nothing for want of one.
    assert benchrun._not_here(types.SimpleNamespace(), "any", ("cpu",), "cpu") is None


def test_short_calls_are_timed_several_to_an_executable_up_to_the_input_copies():
    # The decision is one warm call's time (the fastest function's) and the input sets rotated over.
    short, long = timing.SHORT_S / 2, timing.SHORT_S * 2
    assert timing.calls_per_executable(short, 8) == 8
    assert timing.calls_per_executable(short, 5) == 5  # one input set per call
    assert timing.calls_per_executable(short, 20) == timing.MAX_CALLS_PER_EXECUTABLE == 8
    assert timing.calls_per_executable(short, 1) == 1  # one set: the same call twice could be computed once
    assert timing.calls_per_executable(long, 8) == 1
    assert timing.calls_per_executable(timing.SHORT_S, 8) == 1


def test_a_batched_function_returns_each_input_sets_outputs():
    # k calls in one jitted function, on k consecutive input sets of the rotation: the i-th result is
    # the function's on the i-th set, for a function of one output and one of several.
    import jax
    import jax.numpy as jnp
    import numpy as np

    sets = [[jnp.arange(12.0).reshape(3, 4) + s, jnp.full((3, 4), 2.0 + s)] for s in range(6)]
    for fn in (lambda x, y: x * y + 1.0, lambda x, y: (x + y, jnp.sum(x * y, axis=0))):
        for k in (2, 4, 6):
            groups = timing.batched_sets(sets, k)
            # Consecutive sets, from where the last group stopped, until the rotation comes back to the first.
            assert len(groups) == 6 // np.gcd(6, k)
            order = [s for g in range(len(groups)) for s in range(g * k, (g + 1) * k)]
            batched = jax.jit(timing.batched(fn, k))
            got = [out for group in groups for out in batched(*group)]
            assert len(got) == len(order)
            for out, s in zip(got, order):
                want = fn(*sets[s % 6])
                jax.tree.map(np.testing.assert_array_equal, out, want)
    with pytest.raises(TypeError, match="do not split into 4 input sets"):
        timing.batched(lambda x: x, 4)(*sets[0], *sets[1][:1])
