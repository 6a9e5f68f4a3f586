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

A call shorter than the host's cost of dispatching one executable (tens of microseconds on a GPU)
would time the host: the device idles between calls however full the queue is kept. Where the
fastest function of a comparison is that short (`SHORT_S`, `calls_per_executable`), each of its
functions is compiled again as k calls to one executable on k consecutive input sets (`batched`,
`batched_sets`), as a model's jit runs a kernel, and a sample's time is divided by k as well.
"""

from __future__ import annotations

import math
import statistics
import time

ROTATE_BYTES = 256 << 20  # more than any L2 we bench on (H200: 60 MiB)
MAX_COPIES = 8
# A warm call shorter than this is timed k to an executable: well above the host's cost of
# dispatching one (tens of microseconds on a GPU), so that a call timed alone, back to back, keeps
# the device busy and measures it, not the host.
SHORT_S = 2e-4
MAX_CALLS_PER_EXECUTABLE = 8


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


def calls_per_executable(fastest_s: float, copies: int) -> int:
    """k, the calls that each executable of a comparison makes, from the warm time of its fastest
    function's call and the input sets it rotates over: min(MAX_CALLS_PER_EXECUTABLE, copies) when
    that call is shorter than SHORT_S, each call on its own input set (the same set twice in one
    executable could be computed once), and 1 when it is not short or fewer than 2 sets are there."""
    k = min(MAX_CALLS_PER_EXECUTABLE, copies)
    return k if fastest_s < SHORT_S and k >= 2 else 1


def read_short(times: dict) -> bool:
    """Whether the rounds of a comparison timed one call to an executable read its fastest function's
    call shorter than SHORT_S. The warm probe that chose one call (`warm_call_s`) times each call to its
    end, the host's round trip with it: the dispatch, the wait on the device, and getting Python's lock
    back, which another thread (a tune task's, compiling the next configs) may hold for up to the 5 ms
    switch interval. So it can read long a call that the rounds, back-to-back calls, read short; then the
    comparison is sampled again k calls to an executable, as a short call is."""
    return min(statistics.median(v) for v in times.values()) < SHORT_S


def sample_rounds(calls_at, k: int, copies, **sample_kw) -> tuple:
    """(times, k): `sample` of the calls `calls_at(k)` makes (each function k calls to an executable), k
    chosen by the warm probe; where that is 1 and the rounds read short (`read_short`), sampled again at
    `calls_per_executable`'s k for the fastest sample and the input sets there are (`copies()`, asked for
    only then: at large shapes more sets may not fit)."""
    times = sample(calls_at(k), calls_per_executable=k, **sample_kw)
    if k == 1 and read_short(times):
        again = calls_per_executable(min(min(v) for v in times.values()), copies())
        if again > 1:
            return sample(calls_at(again), calls_per_executable=again, **sample_kw), again
    return times, k


def batched(fn, k: int):
    """A function of k argument lists one after another (each as long as fn takes) that calls fn on
    each and returns the k results as a tuple: every call's outputs are returned, so none is dead code."""

    def calls(*args):
        if len(args) % k:
            raise TypeError(f"{len(args)} arguments do not split into {k} input sets")
        n = len(args) // k
        return tuple(fn(*args[i * n:(i + 1) * n]) for i in range(k))

    return calls


def batched_sets(arg_sets: list, k: int) -> list:
    """The argument lists of `batched(fn, k)`, to rotate over: k consecutive input sets of the rotation
    each, as many lists as it takes to come back to the first set (one when k is the number of sets)."""
    copies = len(arg_sets)
    return [[a for i in range(k) for a in arg_sets[(g * k + i) % copies]]
            for g in range(copies // math.gcd(copies, k))]


def _block(x) -> None:
    import jax

    jax.block_until_ready(x)


WARM_CALLS = 5  # warm calls timed to tell a short call: their median, which one slow call does not move


def warm_call_s(fn, args) -> float:
    """Seconds of one call of fn on args, blocking: the median of WARM_CALLS calls, after a first
    call (which may allocate or load)."""
    _block(fn(*args))
    times = []
    for _ in range(WARM_CALLS):
        start = time.perf_counter()
        _block(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def sample(calls: dict, *, samples: int, target_s: float = 0.02, warm_s: float = 0.5,
           calls_per_executable: int = 1) -> dict:
    """{name: [seconds per call, one per sample]}, names sampled in alternation after a warm-up.
    `calls_per_executable`: each of `calls` runs the function that many times (`batched`)."""
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
            times[name].append((time.perf_counter() - start) / (n * calls_per_executable))
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
