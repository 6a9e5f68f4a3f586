"""Bench one kernel x backend x bench case inside the worker: correct first, then timed
side by side with the XLA reference. Returns a result row (see docs/bench.md)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.run import timing
from kspec.codegen.backends.devices import Peak, peak_for
from kspec.codegen.run.tasks import Result, Status, result


COMPILE_THREADS = 4  # configs a tune task compiles at once (guided's batch size after its first)

def _nbytes(arrays) -> int:
    return sum(int(math.prod(a.shape)) * a.dtype.itemsize for a in arrays if a is not None)  # None: absent


def work(prep, outs) -> tuple:
    """(flops, transcendentals, bytes) for one call, from the spec's cost_estimate."""
    env = prep.inst.env
    cost = prep.spec.cost
    flops = cost.flops.eval(env) if cost and cost.flops is not None else None
    trans = cost.transcendentals.eval(env) if cost and cost.transcendentals is not None else None
    if cost and cost.bytes_accessed is not None:
        nbytes = cost.bytes_accessed.eval(env)
    else:
        nbytes = _nbytes(prep.inputs) + _nbytes(outs)
    return flops, trans, nbytes


def tuned_params(task, prep) -> dict:
    """The params a user's call gets: the case's own, else the embedded tuning table's, else defaults."""
    import sys

    tuning = getattr(sys.modules[prep.fn.__module__], "_tuning", None)
    tunable = [p.name for p in prep.variant.params if p.resolved]
    if tuning is None or not tunable:
        return prep.params
    dims = tuple(prep.inst.env[d] for d in prep.spec.dims)
    given = {k: v for k, v in prep.case.params.items() if k in tunable}
    untuned = {p.name: prep.params[p.name] for p in prep.variant.params if not p.resolved}
    return dict(prep.params, **tuning.resolve(task.backend, prep.inputs, dims, given, untuned))


def _input_sets(task, prep, l2_bytes: int) -> list:
    """The task's inputs and enough more sets of fresh random data of the same shapes that together
    they exceed the L2 (timing.copies_needed): floating inputs drawn again, except those whose data
    has structure (init code, or read by another input's initialiser), which are kept, and copies
    (`same_as`), which copy their source in the same set."""
    import jax

    copies = timing.copies_needed(_nbytes(prep.inputs), l2_bytes)
    structured = {name for names in prep.spec.init_reads.values() for name in names}
    structured |= {op.name for op in prep.spec.inputs if op.init is not None and op.init.structured}
    sets = [prep.inputs]
    for c in range(1, copies):
        fresh = {op.name: jax.random.normal(jax.random.key(task.seed + c * 7919 + i), x.shape).astype(x.dtype)
                 if x is not None and op.name not in structured and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
                 else x for i, (op, x) in enumerate(zip(prep.spec.inputs, prep.inputs))}
        for op in prep.spec.init_order:
            if op.init is not None and op.init.same_as is not None:
                fresh[op.name] = fresh[op.init.same_as]
        sets.append([fresh[op.name] for op in prep.spec.inputs])
    return sets


def _compile(fn, args) -> tuple:
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def _sample(timed: dict, samples: int) -> tuple:
    """(times, calls per executable): the rounds of one comparison, `timed` {name: (function, its compiled
    executable, the input sets it rotates over)}, each function k calls to an executable, k from the warm
    probe (`_per_executable`) or, where the rounds read short what it read long, again
    (timing.sample_rounds)."""
    k = _per_executable([(compiled, sets) for _, compiled, sets in timed.values()])
    return timing.sample_rounds(
        lambda k: {name: _rotation(fn, compiled, sets, k) for name, (fn, compiled, sets) in timed.items()}, k,
        lambda: min(len(sets) for _, _, sets in timed.values()), samples=samples)


def _per_executable(timed: list) -> int:
    """The calls per executable of one comparison, [(compiled, the input sets it rotates over)]: one
    warm call of each is timed (the median of timing.WARM_CALLS), and where the fastest is short (timing.calls_per_executable) the
    host's dispatch of each executable, not the device, would set the pace. The same k for every
    function of the comparison, so that their ratios compare like with like."""
    fastest = min(timing.warm_call_s(compiled, sets[0]) for compiled, sets in timed)
    return timing.calls_per_executable(fastest, min(len(sets) for _, sets in timed))


def _rotation(fn, compiled, sets: list, k: int):
    """A no-argument call that runs the next input set of the rotation: `compiled` itself when k is 1,
    else fn compiled again k calls to one executable, each on the next of k consecutive input sets
    (timing.batched), as a model's jit runs it."""
    if k == 1:
        return timing.rotating(compiled, sets)
    groups = timing.batched_sets(sets, k)
    return timing.rotating(_compile(timing.batched(fn, k), groups[0])[0], groups)


def passed_over(task, prep, grad: bool = False) -> str | None:
    """Why backend="auto" would not run this backend at this shape (the package's _dispatch.py
    says, before tracing), or None. A sweep times what auto runs: here, the reference. `grad`:
    why auto would differentiate the reference instead of running the backward kernels."""
    import importlib

    package = importlib.import_module(prep.fn.__module__.rsplit(".", 1)[0])
    given = {k: v for k, v in prep.case.params.items()}
    if grad:
        vjp = getattr(package, "_vjp", None)
        if vjp is None or not hasattr(vjp, "reference_gradient"):
            return None
        return package._dispatch.slower(task.backend, *prep.inputs, **given, grad=True)
    why = package._dispatch.why_not(task.backend, *prep.inputs, **given)
    if why is None and hasattr(package._dispatch, "slower"):  # dispatch.reference_when_faster
        why = package._dispatch.slower(task.backend, *prep.inputs, **given)
    return why


def bench(task, prep, check_outputs, vjp_module=None) -> Result:
    """One bench task's row. With `task.grad`, the functions timed are the forward and backward
    pass (jax.vjp, then the pullback of fixed random cotangents): the spec's custom_vjp from
    `vjp_module` (the package's _vjp.py) against XLA's autodiff of the reference, and of each
    competitor. The cost_estimate counts the forward only, so a grad row has no roofline."""
    import jax

    start = time.monotonic()
    forward_on_reference = None  # a grad sweep where auto runs the reference's forward pass: why
    grad_on_reference = None  # a grad sweep where auto differentiates the reference: why
    if task.suite == "sweep":
        why = passed_over(task, prep)
        if why is not None and task.grad and hasattr(vjp_module, "REFERENCE_PARAMS"):
            forward_on_reference = why  # the backward kernels still run (the package's _vjp.py)
        elif why is not None:
            return result(task, Status.SKIP, f"auto runs the reference here: {why}", fallback=True)
        if task.grad and not task.grad_kernels:  # unless measured slower too (either forward pass)
            grad_on_reference = passed_over(task, prep, grad=True)
    prep = prep.with_params(tuned_params(task, prep))
    kernel = functools.partial(prep.fn, **prep.params)
    reference = functools.partial(prep.ref_fn, **prep.ref_params)
    if task.grad:
        verdict, kernel, reference, found = _grad_calls(task, prep, vjp_module, start, forward_on_reference is not None,
                                                        grad_on_reference is not None)
        outs, extra = (), list(found.cotangents)
    else:
        outs = jax.block_until_ready(kernel(*prep.inputs))
        verdict = check_outputs(task, prep, outs, round(time.monotonic() - start, 3))
        extra = []
    if not verdict.passed:
        return verdict.updated(message="not timed, wrong result: " + verdict.message)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    device = jax.devices()[0]
    peak = peak_for(device.device_kind)
    if task.ceilings:
        bandwidth, tflops = task.ceilings
        table = {d: tflops for d in ("bfloat16", "float16")}
        peak = Peak("measured", table, bandwidth, peak.l2_bytes if peak else 0)
    arg_sets = [list(args) + extra for args in _input_sets(task, prep, peak.l2_bytes if peak else 0)]
    copies = len(arg_sets)
    compiled_k, compile_k = _compile(kernel, arg_sets[0])
    compiled_r, compile_r = _compile(reference, arg_sets[0])
    flops, trans, nbytes = (None, None, None) if task.grad else work(prep, outs)
    compute = dt.least_precise(prep.dtypes[o.name] for o in prep.spec.inputs)
    bound = None if task.grad else _bound(peak, compute, flops, nbytes)
    # name -> (the function, compiled, the input sets it rotates over): the functions of this comparison
    timed = {"kernel": (kernel, compiled_k, arg_sets), "reference": (reference, compiled_r, arg_sets)}
    competitors = {}  # name -> its entry in the row, in the spec's order
    rivals = _grad_competitors(task, prep, device.platform, found) if task.grad else \
        _competitors(task, prep, device.platform, check_outputs)
    for name, entry in rivals:
        competitors[name] = None  # its place
        if isinstance(entry, tuple):  # checked and compiled: timed in the same rounds
            timed[f"competitor:{name}"] = (*entry, arg_sets)
        else:
            competitors[name] = entry
    found = rivals = None  # the reference's gradients, checked against: free before the rounds
    if bound != "compute" and not task.grad:  # memory-bound, or no peaks to tell: a copy of as many bytes
        timed["copy"] = _copy_timed(nbytes, copies)
    times, per_executable = _sample(timed, task.samples)
    k, r = timing.stats(times["kernel"]), timing.stats(times["reference"])
    seconds = k["median_ms"] / 1e3
    copy_ms = timing.stats(times["copy"])["median_ms"] if "copy" in times else None
    # Ratios round by round: the two sides of each ran under the same clocks (timing.ratio).
    speedup, speedup_lo, speedup_hi = timing.ratio(times["reference"], times["kernel"])
    for key in times:
        if key.startswith("competitor:"):
            st = timing.stats(times[key])
            over, lo, hi = timing.ratio(times[key], times["kernel"])
            competitors[key.split(":", 1)[1]] = {
                "status": "pass", "ms": st["median_ms"], "ms_p10": st["p10_ms"], "ms_p90": st["p90_ms"],
                "speedup": over, "speedup_ci95": [lo, hi]}
    copy_share = ref_copy_share = None
    if copy_ms:
        copy_share = 100 * timing.ratio(times["copy"], times["kernel"])[0]
        ref_copy_share = 100 * timing.ratio(times["copy"], times["reference"])[0]
    figures = {
        "ms": k["median_ms"],
        "ms_p10": k["p10_ms"],
        "ms_p90": k["p90_ms"],
        "ref_ms": r["median_ms"],
        "ref_ms_p10": r["p10_ms"],
        "ref_ms_p90": r["p90_ms"],
        "speedup": speedup,
        "speedup_ci95": [speedup_lo, speedup_hi],
        "speedup_of_medians": r["median_ms"] / k["median_ms"],
        "compile_s": compile_k,
        "ref_compile_s": compile_r,
        "samples": k["samples"],
        "input_copies": copies,
        "calls_per_executable": per_executable,
        "flops": flops,
        "transcendentals": trans,
        "bytes": nbytes,
        "input_bytes": _nbytes(prep.inputs),  # a gradient row has no cost estimate: its plots' size
        "tflops": flops / seconds / 1e12 if flops else None,
        "ref_tflops": flops / (r["median_ms"] / 1e3) / 1e12 if flops else None,
        "gbs": nbytes / seconds / 1e9 if nbytes else None,
        "ref_gbs": nbytes / (r["median_ms"] / 1e3) / 1e9 if nbytes else None,
        "grad": task.grad,
        "device": device.device_kind,
        "roofline_pct": None,
        "ref_roofline_pct": None,
        "bound": bound,
        "copy_ms": copy_ms,
        "copy_gbs": _copy_gbs(_copy_elements(nbytes), copy_ms / 1e3) if copy_ms else None,
        "copy_pct": copy_share,
        "ref_copy_pct": ref_copy_share,
        "params": prep.params,
        "competitors": competitors,
        "samples_ms": {name: [t * 1e3 for t in ts] for name, ts in times.items()},
    }
    if peak and not task.grad:
        floor = max(_floors(peak, compute, flops, nbytes))
        figures["roofline_pct"] = 100 * floor / seconds
        figures["ref_roofline_pct"] = 100 * floor / (r["median_ms"] / 1e3)
    too_slow = []
    least = min_speedup(prep.case.min_speedup, device.device_kind)
    if least is not None:  # the case's floor: failed only when the whole interval is below it
        figures["min_speedup"] = least
        too_slow += _below("speedup", (speedup, speedup_lo, speedup_hi), f"min_speedup {least:g}", least)
    for name, declared in prep.case.min_speedup_over.items():  # floors over competitors, the same way
        least, entry = min_speedup(declared, device.device_kind), competitors.get(name)
        if least is None or entry is None or entry["status"] == "skip":
            continue
        entry["min_speedup"] = least
        if entry["status"] != "pass":
            too_slow.append(f"no speedup over `{name}` to hold to its floor {least:g}: {entry['message']}")
        else:
            too_slow += _below(f"speedup over `{name}`", (entry["speedup"], *entry["speedup_ci95"]),
                               f"min_speedup_over {name} {least:g}", least)
    if too_slow:
        verdict = verdict.updated(status=Status.FAIL, message="; ".join(too_slow))
    elif grad_on_reference is not None:
        verdict = verdict.updated(message=f"{GRAD_ON_REFERENCE}: {grad_on_reference}", fallback=True)
    elif forward_on_reference is not None:
        verdict = verdict.updated(message=f"forward pass on the reference, as auto runs it here: {forward_on_reference}")
    return verdict.updated(seconds=round(time.monotonic() - start, 3), **figures)


# A grad sweep's row where auto differentiates the reference: XLA's autodiff timed against itself,
# counted by the sweep's summary as auto on the reference (1.0x), as a forward sweep's are.
GRAD_ON_REFERENCE = "the reference's autodiff, as auto runs it here"


def _below(what: str, measured: tuple, floor_name: str, least: float) -> list:
    """[the message] when the whole 95% interval of `measured` (speedup, lo, hi) is below the floor, else []."""
    speedup, lo, hi = measured
    if hi >= least:
        return []
    return [f"too slow: {what} {speedup:.3f}x ({lo:.3f}-{hi:.3f}) is below the case's {floor_name}"]


def _fwd_bwd(fn, wrt: list, n_inputs: int):
    """`fn`'s forward and backward pass as one function of its inputs followed by the cotangents
    of its outputs: jax.vjp over the inputs at `wrt`, pulled back; returns the outputs and the
    gradients. The outputs are returned as a training step uses them (the next layer reads them):
    without them XLA would fuse the forward pass into the backward one and never write them."""
    import jax

    from kspec.codegen.run.grad import _like, _on

    def both(*args):
        inputs, cotangents = list(args[:n_inputs]), list(args[n_inputs:])
        outs, pullback = jax.vjp(_on(fn, inputs, wrt), *[inputs[i] for i in wrt])
        return outs, pullback(_like(outs, cotangents))

    return both


def _grad_calls(task, prep, vjp_module, start: float, forward_on_reference: bool = False,
                grad_on_reference: bool = False) -> tuple:
    """(verdict, kernel, reference, gradients) for a grad bench task: the gradients checked as
    `kspec verify`'s grad rows check them (codegen/run/grad.py), then the kernel's custom_vjp and
    the reference's autodiff as functions of (inputs..., cotangents...). The cotangents are the
    check's seeded random numbers, the same for every input set. `forward_on_reference`: the
    reference runs the forward pass, as backend="auto" does at this shape; `grad_on_reference`:
    jax differentiates the reference (the package's _vjp.reference_gradient), as auto does."""
    from kspec.codegen.run import grad as gradrun

    # A sweep times what backend="auto" runs: each backward kernel is chosen by its own dispatch,
    # which runs its reference at shapes where tuning measured the kernel slower.
    if forward_on_reference:
        params = tuple(sorted((k, v) for k, v in prep.params.items() if k in vjp_module.REFERENCE_PARAMS))
        fn = (vjp_module.reference_gradient(None, params) if grad_on_reference
              else vjp_module.differentiable(None, params, auto=True))
    elif grad_on_reference:
        fn = vjp_module.reference_gradient(task.backend, tuple(sorted(prep.params.items())))
    else:
        fn = vjp_module.differentiable(task.backend, tuple(sorted(prep.params.items())), auto=task.suite == "sweep")
    found = gradrun.gradients(task, prep, fn, start)
    reference = functools.partial(prep.ref_fn, **prep.ref_params)
    n = len(prep.inputs)
    verdict = gradrun.judge(task, prep, found)
    # Once judged, the outputs are not needed: the timing keeps the cotangents, and the reference's
    # gradients to check the competitors by. At 2**31 elements each such array is 8 GiB.
    found = dataclasses.replace(found, outs=None, grads=(), ref_outs=None)
    return verdict, _fwd_bwd(fn, found.wrt, n), _fwd_bwd(reference, found.wrt, n), found


def _not_here(module, name: str, platforms: tuple, platform: str) -> str | None:
    """Why competitor `name` of the generated reference `module` is skipped on this platform
    (None: it runs): a platform it does not run on, or a module of its `requires` that this jax
    does not have."""
    import importlib.util

    import jax

    if platform not in platforms:
        return f"runs on {', '.join(platforms)}, not on {platform}"
    for required in getattr(module, "COMPETITOR_REQUIRES", {}).get(name, ()):
        try:
            found = importlib.util.find_spec(required) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            return f"needs {required}, which jax {jax.__version__} does not have"
    return None


def _grad_competitors(task, prep, platform: str, found):
    """_competitors for a grad bench task: each competitor's forward and backward pass by jax's
    autodiff under the check's cotangents, its gradients held to the reference's in `found`."""
    import sys

    import jax

    from kspec.codegen.run.compare import compare_within

    module = sys.modules[prep.ref_fn.__module__]
    args = list(prep.inputs) + list(found.cotangents)
    tol = dt.tolerance(list(prep.dtypes.values()), prep.spec.tolerance, prep.case.tolerance)
    for name, (fn, platforms) in getattr(module, "COMPETITORS", {}).items():
        if (why := _not_here(module, name, platforms, platform)) is not None:
            yield name, {"status": "skip", "message": why}
            continue
        call = _fwd_bwd(functools.partial(fn, **prep.ref_params), found.wrt, len(prep.inputs))
        try:
            got = jax.block_until_ready(call(*args))[1]
            named = [(f"grad of {prep.spec.inputs[i].name}", g, w) for i, g, w in zip(found.wrt, got, found.ref_grads)]
            check = compare_within(named, dt.for_gradients(tol))
            compiled = _compile(call, args)[0] if check.get("passed") else None
        except Exception as e:  # noqa: BLE001 - a competitor that cannot run here is reported, not fatal
            lines = str(e).strip().splitlines()
            yield name, {"status": "error", "message": f"{type(e).__name__}: {lines[0][:200] if lines else ''}"}
            continue
        if compiled is None:
            yield name, {"status": "fail", "message": "not timed, wrong gradient: " + check["message"]}
        else:
            yield name, (call, compiled)


def _competitors(task, prep, platform: str, check_outputs):
    """(name, (its function, compiled)) for each of the spec's competitors that runs on this platform
    and computes what the reference does (the function is kept to compile it again, k calls to an
    executable, where calls are short: `_sample`); (name, its row entry) for the others, with why."""
    import sys

    import jax

    module = sys.modules[prep.ref_fn.__module__]
    for name, (fn, platforms) in getattr(module, "COMPETITORS", {}).items():
        if (why := _not_here(module, name, platforms, platform)) is not None:
            yield name, {"status": "skip", "message": why}
            continue
        call = functools.partial(fn, **prep.ref_params)
        try:
            outs = jax.block_until_ready(call(*prep.inputs))
            check = check_outputs(task, prep, outs, 0.0)
            compiled = _compile(call, prep.inputs)[0] if check.passed else None
        except Exception as e:  # noqa: BLE001 - a competitor that cannot run here is reported, not fatal
            lines = str(e).strip().splitlines()
            yield name, {"status": "error", "message": f"{type(e).__name__}: {lines[0][:200] if lines else ''}"}
            continue
        if compiled is None:
            yield name, {"status": "fail", "message": "not timed, wrong result: " + check.message}
        else:
            yield name, (call, compiled)


def min_speedup(declared, device_kind: str):
    """A case's `min_speedup` on this device: the number itself, or the value of the first key of a
    mapping that the device kind starts with; None where none applies."""
    if not isinstance(declared, dict):
        return declared
    return next((v for k, v in declared.items() if device_kind.startswith(k)), None)


def _floors(peak, compute, flops, nbytes) -> tuple:
    """(memory, compute) seconds one call needs at the device's peaks."""
    peak_flops = peak.flops_for(compute)
    return nbytes / (peak.bandwidth_gbs * 1e9), (flops / peak_flops if flops and peak_flops else 0.0)


def _bound(peak, compute, flops, nbytes):
    """"memory" or "compute" by the roofline; None without peaks for the device."""
    if not peak:
        return None
    t_mem, t_flop = _floors(peak, compute, flops, nbytes)
    return "compute" if t_flop > t_mem else "memory"


def _scale():
    """The copy that both ceilings time: XLA scaling a float32 array, each element read once and
    written once (8 bytes moved per element)."""
    import jax

    return jax.jit(lambda v: v * 2.0)


def _copy_gbs(elements: int, seconds: float) -> float:
    return 8 * elements / seconds / 1e9


def _copy_elements(nbytes: int) -> int:
    """float32 elements of a copy that reads and writes `nbytes` in all."""
    return max(1, nbytes // 8)


def _copy_timed(nbytes: int, copies: int) -> tuple:
    """The copy of the kernel's bytes, rotated over as many arrays as the kernel's input sets: the
    copy ceiling in the kernel's own rounds. (function, compiled, the arrays' sets), as `_sample` takes."""
    import jax.numpy as jnp

    n = _copy_elements(nbytes)
    arrays = [[jnp.full((n,), 1.0 + c, jnp.float32)] for c in range(copies)]
    scale = _scale()
    return scale, scale.lower(arrays[0][0]).compile(), arrays


def measure_ceilings() -> dict:
    """Copy bandwidth and bf16 matmul throughput measured here and now."""
    import jax
    import jax.numpy as jnp

    on_cpu = jax.default_backend() == "cpu"
    n = (16 << 20) if on_cpu else (256 << 20)  # f32 elements: 64 MiB on CPU, 1 GiB on accelerators
    x = jnp.ones((n,), jnp.float32)
    m = 1024 if on_cpu else 8192
    a = jnp.ones((m, m), jnp.bfloat16)
    scale = _scale()
    dot = jax.jit(lambda p, q: jnp.dot(p, q, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    times = timing.sample({"copy": lambda: scale(x), "matmul": lambda: dot(a, a)}, samples=15, warm_s=2.0)
    copy_s = timing.stats(times["copy"])["median_ms"] / 1e3
    mm_s = timing.stats(times["matmul"])["median_ms"] / 1e3
    return {"bandwidth_gbs": _copy_gbs(n, copy_s), "tflops_bf16": 2 * m**3 / mm_s / 1e12}


# tune --sustained: seconds of the reference alone before the first config, and of the config
# and the reference in turn before each config's samples (its check leaves the device idle a while).
SUSTAIN_S, RESUME_S = 3.0, 1.0


def tune(task, prep, check_outputs, describe):
    """Compile every config of a tune task in parallel threads, then verify and time each.

    Alone, each config is timed by itself right after its check: the device's clocks are
    whatever its load leaves them at, full clock on an idle GPU. Sustained (`kspec tune
    --sustained`), each config is sampled in alternation with the reference, as `kspec bench`
    does, after the reference has held the device under load for SUSTAIN_S seconds, and
    carries its speedup over the reference round by round: a ranking under the clocks a
    power cap holds, which the full-clock figures can miss. Either way a short call is timed k to
    an executable on k input sets, as `kspec bench` times it (`_per_executable`; sustained, the
    config and the reference alike), so that configs rank by the device's time, not the host's."""
    import concurrent.futures

    import jax

    configs = [dict(c) for c in task.configs]
    refs = {}  # the reference's outputs per value of the params it takes
    against = {}  # sustained: the reference (function, compiled, its warm call's seconds) per value of its params
    rotations = {}  # sustained: the reference's call per (value of its params, calls per executable)
    loaded = False  # sustained: the device has been held under load
    peak = peak_for(jax.devices()[0].device_kind)
    arg_sets = []  # the input sets rotated over, made once needed (timed alone: only for short calls)

    def input_sets() -> list:
        if not arg_sets:
            arg_sets.extend(_input_sets(task, prep, peak.l2_bytes if peak else 0))
        return arg_sets

    def reference_for(p) -> tuple:
        key = tuple(sorted(p.ref_params.items()))
        if key not in against:
            fn = functools.partial(p.ref_fn, **p.ref_params)
            compiled_ref = _compile(fn, p.inputs)[0]
            against[key] = (fn, compiled_ref, timing.warm_call_s(compiled_ref, p.inputs))
        return key, against[key]

    def build(cfg):
        fn = functools.partial(prep.fn, **dict(prep.params, **cfg))
        return (fn, *_compile(fn, prep.inputs))

    with concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS) as pool:
        futures = [pool.submit(build, cfg) for cfg in configs]
        for cfg, future in zip(configs, futures):
            row = result(task, Status.ERROR, params=cfg)
            try:
                fn, compiled, compile_s = future.result()
                outs = jax.block_until_ready(compiled(*prep.inputs))
                mine = prep.with_params(dict(prep.params, **cfg))
                key = tuple(sorted(mine.ref_params.items()))
                mine.refs = mine.refs or refs.get(key)
                verdict = check_outputs(task, mine, outs, 0.0)
                refs[key] = mine.refs
                row = verdict.updated(params=cfg, compile_s=compile_s)
                if verdict.passed and not task.sustained:
                    # Short calls are timed k to an executable, as bench times them (_per_executable);
                    # the other input sets are made only then: at large shapes they may not fit.
                    once = timing.warm_call_s(compiled, prep.inputs)
                    k = timing.calls_per_executable(once, len(input_sets())) if once < timing.SHORT_S else 1
                    times, k = timing.sample_rounds(
                        lambda k: {"kernel": functools.partial(compiled, *prep.inputs) if k == 1
                                   else _rotation(fn, compiled, input_sets(), k)},
                        k, lambda: len(input_sets()), samples=task.samples, warm_s=0.1)
                    row = row.updated(ms=timing.stats(times["kernel"])["median_ms"], calls_per_executable=k)
                elif verdict.passed:
                    # The config and the reference are one comparison: k calls to an executable for
                    # both where the faster is short (the reference compiled again once per k).
                    ref_key, (ref_fn, compiled_ref, ref_s) = reference_for(mine)
                    fastest = min(timing.warm_call_s(compiled, prep.inputs), ref_s)
                    k = timing.calls_per_executable(fastest, len(input_sets()))

                    def reference_at(k):
                        if (ref_key, k) not in rotations:
                            rotations[ref_key, k] = _rotation(ref_fn, compiled_ref, input_sets(), k)
                        return rotations[ref_key, k]

                    def calls_at(k):
                        return {"kernel": _rotation(fn, compiled, input_sets(), k), "reference": reference_at(k)}

                    if not loaded:
                        timing.warm_up({"reference": reference_at(k)}, SUSTAIN_S)
                        loaded = True
                    times, k = timing.sample_rounds(calls_at, k, lambda: len(input_sets()), samples=task.samples,
                                                    warm_s=RESUME_S)
                    speedup, lo, hi = timing.ratio(times["reference"], times["kernel"])
                    row = row.updated(ms=timing.stats(times["kernel"])["median_ms"],
                                      ref_ms=timing.stats(times["reference"])["median_ms"],
                                      speedup=speedup, speedup_ci95=[lo, hi], calls_per_executable=k)
            except Exception as e:  # noqa: BLE001 - a config that fails to compile or run is rejected
                row = row.updated(message=describe(e))
            yield row
