"""Timing helpers for bench and tune (run inside the worker process, with jax).

Each sample runs a function several times back to back and blocks once at the end,
so the device queue stays full and host dispatch overlaps device work; the sample's
time divided by the repetitions is one per-call figure. Competing functions are
sampled in alternation (kernel, reference, reference, kernel, ...), so drift in
clocks or temperature hits both alike. Inputs rotate across enough copies that
their total exceeds the last-level cache.

Sample i of every function falls in round i, next to the others' sample i, so a ratio
is taken per round (`paired`): both sides of it ran under the same clocks. Under a power
cap the clocks swing from one 20 ms sample to the next by more than the margin a
kernel is judged on, and the median of the per-round ratios (with a confidence
interval, `median_ci`; both at once: `ratio`) sees through that where the ratio of
two medians does not.
"""

from __future__ import annotations

import math
import statistics
import time

ROTATE_BYTES = 256 << 20  # more than any L2 we bench on (H200: 60 MiB)
MAX_COPIES = 8


def copies_needed(nbytes: int, l2_bytes: int) -> int:
    """How many input sets to rotate so they do not all sit in cache."""
    if nbytes <= 0:
        return 1
    target = max(ROTATE_BYTES, 2 * l2_bytes)
    return max(1, min(MAX_COPIES, -(-target // nbytes)))


def rotating(fn, arg_sets: list):
    """A no-argument callable that calls fn on the next input set each time."""
    state = {"i": 0}

    def call():
        args = arg_sets[state["i"] % len(arg_sets)]
        state["i"] += 1
        return fn(*args)

    return call


def _block(x) -> None:
    import jax

    jax.block_until_ready(x)


def calibrate(call, target_s: float) -> int:
    """Repetitions per sample so that one sample lasts about target_s."""
    start = time.perf_counter()
    _block(call())
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(1000, int(target_s / once)))


def warm_up(calls: dict, seconds: float = 0.5) -> None:
    """Run the calls for a while first: clocks ramp up from idle, caches and allocators settle."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for call in calls.values():
            _block(call())


def sample(calls: dict, *, samples: int, target_s: float = 0.02, warm_s: float = 0.5) -> dict:
    """{name: [seconds per call, one per sample]}, names sampled in alternation after a warm-up."""
    warm_up(calls, warm_s)
    reps = {name: calibrate(call, target_s) for name, call in calls.items()}
    times = {name: [] for name in calls}
    names = list(calls)
    for s in range(samples):
        order = names if s % 2 == 0 else names[::-1]
        for name in order:
            call, n = calls[name], reps[name]
            start = time.perf_counter()
            for _ in range(n):
                out = None  # the last call's outputs freed before the next is queued: at 2**31 elements two sets may not fit
                out = call()
            _block(out)
            times[name].append((time.perf_counter() - start) / n)
    return times


def stats(values: list) -> dict:
    """Median and spread (10th-90th percentile) in milliseconds."""
    ms = sorted(v * 1e3 for v in values)
    if len(ms) >= 10:
        q = statistics.quantiles(ms, n=10)
        lo, hi = q[0], q[-1]
    else:
        lo, hi = ms[0], ms[-1]
    return {"median_ms": statistics.median(ms), "p10_ms": lo, "p90_ms": hi, "samples": len(ms)}


def paired(numerators: list, denominators: list) -> list:
    """The ratio of two functions' samples round by round (`sample` puts sample i of each in round i)."""
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


def median_ci(values: list, level: float = 0.95) -> tuple:
    """(median, low, high): the median and a distribution-free confidence interval for it.

    The interval runs from the k-th smallest to the k-th largest value, k the largest rank
    with P(Binomial(n, 1/2) < k) <= (1 - level) / 2: it holds the true median with at least
    `level` probability whatever the distribution (at 95%, from n = 6 on). With fewer values
    no such rank exists and the interval is the whole range."""
    xs = sorted(values)
    n = len(xs)
    tail, k, below = (1 - level) / 2, 0, 0.0  # below = P(B < k)
    while k < (n + 1) // 2 and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    k = max(k, 1)
    return statistics.median(xs), xs[k - 1], xs[n - k]


def ratio(numerators: list, denominators: list) -> tuple:
    """(median, low, high) of the per-round ratios, with their 95% interval: a speedup is
    ratio(reference's samples, kernel's samples)."""
    return median_ci(paired(numerators, denominators))
