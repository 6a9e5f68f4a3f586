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
