"""The verify worker: imports jax and the generated modules, runs one task at a time.

Started by codegen.verify in a fresh (spawned) process, so a kernel that crashes
or hangs takes down only this process. Inputs are fresh random data derived from
the run's seed, the task and the operand, so `--seed` reproduces a run exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import logging
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from kspec.codegen.backends import BACKENDS
from kspec.codegen.checks import instances
from kspec.codegen.run import bounds, deadlock, gpu_interpret, multicore
from kspec.codegen import project as pipeline
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.run.compare import compare_within, verdict_result
from kspec.codegen.run import kinds
from kspec.codegen.run.inputs import make_inputs, upcast
from kspec.codegen.run.tasks import (
    DONE, BenchTask, CeilingsTask, GradTask, LowerTask, Result, RunTask, ShardedTask, Status, Task, TuneTask, result,
)

_compiled: dict = {}


def serve() -> None:
    """The worker process's entry point: `python -c ... serve()` with the file descriptors of its
    three pipes as arguments (tasks in, results out, the lifeline; see run.pool.Session)."""
    tasks, results, lifeline = map(int, sys.argv[1:4])
    _guard(lifeline)
    main(_Pipes(Connection(tasks, writable=False), Connection(results, readable=False)))


class _Pipes:
    def __init__(self, tasks, results):
        self.tasks, self.results = tasks, results

    def recv(self):
        return self.tasks.recv()

    def send(self, obj) -> None:
        self.results.send(obj)


def main(conn) -> None:
    """One task at a time from `conn`, each answered with one result (tune: several, then done)."""
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    import jax

    conn.send(
        {
            "jax_version": jax.__version__,
            "platform": jax.default_backend(),
            "device": jax.devices()[0].device_kind,
            "device_count": jax.device_count(),
        }
    )
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        if isinstance(task, TuneTask):
            for message in tune_task(task):
                conn.send(message)
            conn.send(DONE)
        else:
            conn.send(run_task(task))


def _guard(lifeline: int) -> None:
    """Fork a guard that waits on the lifeline (whose only writer is the parent) and, once the
    parent is gone, kills this process group: the worker and whatever its tasks started. It forks
    before jax is imported, while this process has one thread."""
    if os.fork() == 0:
        try:
            # hold nothing but the lifeline: not the result pipe (the parent must see the worker's
            # end of it close when the worker dies), not the parent's terminal or pipes
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, lifeline)
            os.closerange(lifeline + 1, 1 << 16)
            while os.read(lifeline, 1):  # nothing is ever written: this returns at end of file
                pass
        except BaseException:
            pass
        finally:
            os.killpg(os.getpgrp(), signal.SIGKILL)
            os._exit(0)
    os.close(lifeline)


def _spec(path: str):
    if path not in _compiled:
        _compiled[path] = pipeline.compile_spec(Path(path))
    return _compiled[path]


def _module(task: Task, name: str):
    root = Path(task.out_root)
    if str(root.parent) not in sys.path:
        sys.path.insert(0, str(root.parent))
    return importlib.import_module(f"{root.name}.{task.kernel}.{name}")


def _first_lines(e: BaseException, n: int = 6) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[:n])[:1500]


def spec_line(task: Task, e: BaseException) -> str | None:
    """Where in the spec the code that raised `e` is: `path:line:col: in <which code>: <line>`, for the
    innermost frame of the kernel's generated modules whose line is a line of the spec's body, a
    backend's body, the reference or a competitor (the generated modules hold that code as written),
    or None."""
    import traceback

    for x in gpu_interpret.causes(e):  # and the exceptions it was raised from (jax's user frames)
        for frame in reversed(traceback.extract_tb(x.__traceback__)):
            found = _spec_loc(task, frame.filename, frame.line or "")
            if found:
                return found
    return None


def _spec_loc(task: Task, filename: str, text: str) -> str | None:
    """`path:line:col: in <which code>: <text>` when `filename` is a module of the kernel's generated package
    and `text`, a line of it, is a line of the spec's code; else None."""
    compiled = _compiled.get(task.spec_path)
    if compiled is None or compiled.spec is None:
        return None
    spec = compiled.spec
    codes = [("reference", spec.reference)] + [("body", v.body) for v in spec.variants.values()]
    codes += [(f"competitor {c.name}", c.body) for c in spec.competitors]
    package = (Path(task.out_root) / task.kernel).resolve()
    try:
        inside = Path(filename).resolve().is_relative_to(package)
    except (OSError, ValueError):
        return None
    text = text.strip()
    if not inside or not text:
        return None
    first = [(which, code) for which, code in codes if code is not None]
    if Path(filename).name == "reference.py":
        first.sort(key=lambda wc: wc[0] != "reference")
    else:
        first.sort(key=lambda wc: wc[0] == "reference")
    for which, code in first:
        for n, line in enumerate(code.source.splitlines(), 1):
            if line.strip() == text:
                loc = code.loc_of(n, len(line) - len(line.lstrip()))
                return f"{loc}: in {which}: {text}"
    return None


def run_task(task: Task) -> Result:
    start = time.monotonic()
    try:
        return _run(task, start)
    except Exception as e:  # noqa: BLE001 - a crashing kernel fails its own case only
        _reset_tpu_interpret()
        try:
            where = spec_line(task, e)
        except Exception:  # noqa: BLE001 - the location is a help, never a second failure
            where = None
        lacking = _gpu_interpreted(task) and gpu_interpret.unsupported(e)
        if lacking:  # jax's simulator lacks what the body uses
            gpu_interpret.reset()
            return result(task, Status.SKIP, lacking, seconds=round(time.monotonic() - start, 3))
        outside = _gpu_interpreted(task) and gpu_interpret.out_of_bounds(e)
        if outside:  # Mosaic GPU interpret mode raised on an access outside a buffer: the kernel's fault
            gpu_interpret.reset()
            kind = "load or copy" if outside.startswith("reads") else "store or copy"
            # jax's simulator raises inside a callback: the kernel's own frames do not reach this exception
            where = where or f"in the {task.backend} body of {task.kernel}"
            message = f"out-of-bounds {kind}: {where}: {outside}\n{gpu_interpret.NOTE}"
            return result(task, Status.FAIL, message, seconds=round(time.monotonic() - start, 3))
        message = _first_lines(e) if where is None else f"{where}\n{_first_lines(e)}"
        if os.environ.get("KSPEC_TRACEBACK"):  # kspec verify --traceback
            import traceback

            message += "\n" + "".join(traceback.format_exception(e)).rstrip()
        return result(task, Status.ERROR, message, seconds=round(time.monotonic() - start, 3))


def tune_task(task: TuneTask):
    """Yield one result per config of a tune task (errors included)."""
    try:
        prep = _prepare(task)
    except Exception as e:  # noqa: BLE001
        yield result(task, Status.ERROR, _first_lines(e))
        return
    from kspec.codegen.run.bench import tune

    yield from tune(task, prep, check_outputs, _first_lines)


def _gpu_interpreted(task: Task) -> bool:
    """Whether this task's Mosaic GPU body runs here in Mosaic GPU interpret mode (off a GPU)."""
    import jax

    info = BACKENDS[task.backend]
    return info.off_device_mode == "mosaic_gpu" and info.interpreted_off_device(jax.default_backend())


def _interpret_forward(task: Task) -> None:
    """Make the generated Mosaic GPU function that `_vjp.differentiable` takes as the forward pass run in Mosaic GPU
    interpret mode, in this worker. Only it: the backward kernels are of other backends (Pallas interpret mode here),
    and the mode, once on, would take every pallas_call traced under it."""
    module = _module(task, task.backend)
    fn = getattr(module, task.kernel)
    if not getattr(fn, "kspec_gpu_interpreted", False):
        wrapped = gpu_interpret.interpreted(fn)
        wrapped.kspec_gpu_interpreted = True
        setattr(module, task.kernel, wrapped)


def _reset_tpu_interpret() -> None:
    with contextlib.suppress(Exception):
        from jax.experimental.pallas import tpu as pltpu

        pltpu.reset_tpu_interpret_mode_state()


@dataclasses.dataclass
class Prepared:
    """A task's spec, case and variant resolved, module imported, inputs made."""

    spec: object
    case: object
    variant: object
    inst: object
    dtypes: dict
    params: dict  # the kernel's params for this case
    ref_params: dict  # the subset the reference takes
    fn: object
    ref_fn: object
    inputs: list
    refs: tuple | None = None  # the reference's outputs, once computed (tune checks many configs)

    def with_params(self, params: dict) -> Prepared:
        """The task under other kernel params (a tuned config). The reference takes the same
        values of the params it shares with the kernel, so its outputs are recomputed when one of
        them changes (layer_norm_bwd: one partial-sum row per block of bm rows)."""
        ref_params = {k: params.get(k, v) for k, v in self.ref_params.items()}
        refs = self.refs if ref_params == self.ref_params else None
        return dataclasses.replace(self, params=params, ref_params=ref_params, refs=refs)


def _prepare(task: Task) -> Prepared:
    compiled = _spec(task.spec_path)
    spec = compiled.spec
    if spec is None:
        raise RuntimeError("the spec no longer checks; run `kspec check`")
    case = {"bench": spec.bench, "sweep": spec.sweep}.get(task.suite, spec.cases)[task.case_index]
    if task.case_dims:  # a case verify derived from the declared one (codegen/checks/derive.py)
        case = dataclasses.replace(case, name=task.case, dims=dict(task.case_dims))
    variant = spec.variants[task.backend]
    dtypes = dict(task.dtypes)
    inst, diags = instances.instantiate(spec, variant, case, dtypes)
    if inst is None:
        raise RuntimeError(diags[0].format() if diags else "case does not instantiate")
    params = {k: v for k, v in inst.env.items() if k in {p.name for p in variant.params}}
    module = _module(task, task.backend)
    ref_module = _module(task, "reference")
    base_params = {p.name for p in next(iter(spec.variants.values())).params}
    inputs = make_inputs(task, spec, inst, dtypes, case.absent, getattr(ref_module, "INITS", {}))
    return Prepared(
        spec, case, variant, inst, dtypes, params,
        {k: v for k, v in params.items() if k in base_params},
        getattr(module, spec.name), getattr(ref_module, f"{spec.name}_reference"), inputs,
    )


def _run(task: Task, start: float) -> Result:
    import jax

    if isinstance(task, CeilingsTask):
        from kspec.codegen.run.bench import measure_ceilings

        return result(task, Status.PASS, **measure_ceilings())
    prep = _prepare(task)
    if _gpu_interpreted(task) and isinstance(task, (RunTask, GradTask)):
        why = gpu_interpret.unrun(prep.spec)
        if why:
            return result(task, Status.SKIP, why)
    if isinstance(task, BenchTask):
        from kspec.codegen.run.bench import bench

        return bench(task, prep, check_outputs, _module(task, "_vjp") if task.grad else None)
    if isinstance(task, ShardedTask):
        return _lower_sharded(task, prep, start) if task.lower else _run_sharded(task, prep, start)
    if isinstance(task, LowerTask) and task.grad:
        from kspec.codegen.run import grad as gradrun

        return gradrun.lower(task, prep, _module(task, "_vjp"), start)
    if isinstance(task, LowerTask):
        return _lower(task, prep.fn, prep.inputs, prep.params, start)
    if isinstance(task, GradTask):
        return _run_grad(task, prep, start)
    if not isinstance(task, RunTask):
        raise TypeError(f"a worker runs no task of kind {type(task).__name__}")
    call = functools.partial(prep.fn, **prep.params)
    if _gpu_interpreted(task):  # a Mosaic GPU body off a GPU
        gpu_interpret.reset()
        call = gpu_interpret.interpreted(call)
    elif BACKENDS[task.backend].interpreted_off_device(jax.default_backend()):  # a Triton body off a GPU
        call = functools.partial(prep.fn, **prep.params, interpret=True)
    if BACKENDS[task.backend].simulated_on(jax.default_backend()):
        try:
            out = _run_schedules(task, prep, call, start)
            if out.passed:  # the other kinds under the first schedule
                plan = multicore.schedules(task.seed, task.schedules)
                out = _other_kinds(task, prep, out, start,
                                   lambda *inputs: multicore.run(call, list(inputs), plan[0], prep.inst).outs,
                                   multicore.note(plan, plan[0])).updated(schedules=out.extra["schedules"])
            return out.updated(inputs=list(task.inputs))
        finally:  # each schedule compiled a program of its own, which no later task runs: free them
            prep.fn.clear_cache()
    out = _run_once(task, prep, call, start)
    if out.passed:
        out = _other_kinds(task, prep, out, start, call)
    return out.updated(inputs=list(task.inputs))


def _run_once(task: RunTask, prep: Prepared, call, start: float, loose: bool = False) -> Result:
    """The kernel on the prepared inputs, checked: it must leave its inputs alone and match the
    reference (`loose`: as check_outputs says)."""
    import jax

    before = [None if x is None else np.asarray(x).copy() for x in prep.inputs]
    reference_outputs(prep)  # from the inputs as they are before the kernel runs
    checking = _checks_bounds(task)
    bounds.take()
    with contextlib.redirect_stdout(io.StringIO()):  # what the kernel prints is not verify's output
        outs = jax.block_until_ready(call(*prep.inputs))
    seconds = round(time.monotonic() - start, 3)
    clobbered = _clobbered(prep, before)
    if clobbered:
        return result(task, Status.FAIL, clobbered, seconds=seconds)
    outside = bounds.take() if checking else []
    if outside:
        return result(task, Status.FAIL, _out_of_bounds(task, outside), seconds=seconds)
    return check_outputs(task, prep, outs, seconds, loose)


def _checks_bounds(task: Task) -> bool:
    """Whether this task's kernel runs in Pallas interpret mode here, with its loads' and stores' bounds checked
    (codegen/run/bounds.py): the interpret backend, and a Triton body off a GPU."""
    import jax

    info = BACKENDS[task.backend]
    interpreted = task.backend == "interpret" or info.interpreted_off_device(jax.default_backend())
    return interpreted and bounds.install()


def _out_of_bounds(task: Task, found: list) -> str:
    import linecache

    lines = []
    for access in found:
        line = linecache.getline(access.file, access.line)
        where = _spec_loc(task, access.file, line) or f"{access.file}:{access.line}"
        lines.append(f"out-of-bounds {access.kind}: {where}: {access.describe()}")
    kinds = {access.kind for access in found}
    if "store" in kinds:
        lines.append("(interpret mode drops the elements stored outside; compiled, they land in the next block's rows "
                     "or past the array)")
    if "load" in kinds:
        lines.append("(interpret mode reads NaN outside; compiled, a load reads whatever lies there, or faults)")
    return "\n".join(lines)


def _other_kinds(task: RunTask, prep: Prepared, passed: Result, start: float, call, note: str = "") -> Result:
    """After the normal inputs pass: the kernel on each other input kind of the task (kinds.py),
    against the reference on the same data. The first that fails is the task's result, its message
    naming the kind; if all pass, the normal inputs' result stands (its metrics, the time of all)."""
    for kind in task.inputs[1:]:
        taking = [prep.dtypes[op.name] for op in prep.spec.inputs
                  if kind in kinds.takes(op, prep.dtypes[op.name], prep.spec)]
        inputs = make_inputs(task, prep.spec, prep.inst, prep.dtypes, prep.case.absent,
                             getattr(_module(task, "reference"), "INITS", {}), kind)
        other = dataclasses.replace(prep, inputs=inputs, refs=None)
        try:
            out = _run_once(task, other, call, start, loose=True)
        except Exception as e:  # noqa: BLE001 - name the inputs it raised on
            _reset_tpu_interpret()
            return result(task, Status.ERROR, f"with {kinds.described(kind, taking)}: "
                          f"{_first_lines(e)}{note}", seconds=round(time.monotonic() - start, 3))
        if not out.passed:
            return out.updated(message=f"with {kinds.described(kind, taking)}: {out.message}{note}")
    return passed.updated(seconds=round(time.monotonic() - start, 3))


def _run_schedules(task: RunTask, prep: Prepared, call, start: float) -> Result:
    """Off a TPU: the kernel in TPU interpret mode under each of the task's schedules
    (codegen.multicore). Any race, or outputs that differ between schedules, fail the task;
    otherwise the outputs, the same under all of them, are checked against the reference."""
    plan = multicore.schedules(task.seed, task.schedules)
    extra = {"schedules": [s.to_json() for s in plan]}
    prefetch = {op.name: np.asarray(x).tolist() for op, x in zip(prep.spec.inputs, prep.inputs) if op.prefetch}
    before = [None if x is None else np.asarray(x).copy() for x in prep.inputs]
    reference_outputs(prep)
    runs = []
    for schedule in plan:
        try:
            runs.append(multicore.run(call, prep.inputs, schedule, prep.inst))
        except Exception as e:  # noqa: BLE001 - say which schedule it was
            found = str(e) if isinstance(e, deadlock.Deadlock) else multicore.revisit(
                prep.inst, prefetch, e, call, prep.inputs, schedule)
            _reset_tpu_interpret()
            status, message = (Status.FAIL, found) if found else (Status.ERROR, _first_lines(e))
            message += multicore.note(plan, schedule)
            return result(task, status, message, seconds=round(time.monotonic() - start, 3), **extra)
        clobbered = _clobbered(prep, before)
        if clobbered:
            message = clobbered + multicore.note(plan, schedule)
            return result(task, Status.FAIL, message, seconds=round(time.monotonic() - start, 3), **extra)
    seconds = round(time.monotonic() - start, 3)
    found = multicore.diagnose(prep.inst, prefetch, runs)
    first = (multicore.compared(prep.inst, runs) or runs)[0]
    out = check_outputs(task, prep, first.outs, seconds).updated(**extra)
    if found:
        against = f"\n  against the reference, schedule {first.schedule.number}: {out.message}" if out.message else ""
        return out.updated(status=Status.FAIL, message=found + against)
    if not out.passed:
        return out.updated(message=out.message + multicore.note(plan))
    return out


def _clobbered(prep: Prepared, before: list) -> str | None:
    """A message if the kernel changed one of its inputs (e.g. an out-of-bounds store)."""
    import jax.numpy as jnp

    for op, x, old in zip(prep.spec.inputs, prep.inputs, before):
        if x is None:  # an absent optional input
            continue
        # A fresh copy on the device: np.asarray(x) of a GPU array returns its cached host
        # copy, which would never show a store that landed in x's device buffer.
        now = np.asarray(jnp.copy(x))
        changed = int(np.sum((now != old) & ~((now != now) & (old != old))))  # NaN == NaN here
        if changed:
            return (
                f"input {op.name} changed during the kernel ({changed} of {now.size} elements): "
                "the kernel wrote outside its outputs (an out-of-bounds store of a ragged block?)"
            )
    return None


def _run_sharded(task: ShardedTask, prep: Prepared, start: float) -> Result:
    """`kspec verify --devices N`: the spec's sharded function on a mesh of the first N
    devices, compared with the reference on the whole inputs. Off TPU, mosaic_tpu runs in
    TPU interpret mode (without the race detector: its grid-point recorder is per device)."""
    import jax

    module = _module(task, "sharded")
    kwargs = dict(prep.params, mesh=module.make_mesh(jax.devices()[: task.devices]), backend=task.backend)
    if BACKENDS[task.backend].simulated_on(jax.default_backend()):
        from jax.experimental.pallas import tpu as pltpu

        _reset_tpu_interpret()
        kwargs["interpret"] = pltpu.InterpretParams(out_of_bounds_reads="raise", uninitialized_memory="nan")
    outs = jax.block_until_ready(getattr(module, f"{task.kernel}_sharded")(*prep.inputs, **kwargs))
    return check_outputs(task, prep, outs, round(time.monotonic() - start, 3))


def _lower_sharded(task: ShardedTask, prep: Prepared, start: float) -> Result:
    """`kspec verify --lower --devices N`: the spec's sharded function lowered for the backend's
    platform on a mesh of the first N devices, the inputs laid out as its IN_SPECS say. Off a TPU,
    mosaic_tpu's shard_map runs on an abstract mesh of the same axes whose devices are the named
    TPU chip (codegen.run.lowering): Mosaic TPU reads the chip from the mesh it lowers in."""
    import jax
    from jax.sharding import NamedSharding

    from kspec.codegen.run import lowering

    module = _module(task, "sharded")
    mesh = module.make_mesh(jax.devices()[: task.devices])
    inner = mesh
    if lowering.named_chip(task.backend) is not None:
        inner = lowering.chip_mesh(mesh.axis_sizes, mesh.axis_names, mesh.axis_types)
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
              for x, s in zip(prep.inputs, module.IN_SPECS)]
    # the jitted shard_map the package's {kernel}_sharded runs, here without its TPU interpret mode
    fn = module._sharded(inner, task.backend, tuple(sorted(prep.params.items())))
    with contextlib.redirect_stderr(io.StringIO()):
        text = fn.trace(*shapes).lower(lowering_platforms=(lowering.platform(task.backend),)).as_text()
    return result(
        task,
        "pass",
        f"lowered for {lowering.shown(task.backend)} on a mesh of {task.devices} devices "
        f"({len(text)} characters of StableHLO)",
        seconds=round(time.monotonic() - start, 3),
    )


def reference_outputs(prep: Prepared) -> tuple:
    """The reference's outputs at higher precision, computed once per prepared task."""
    import jax

    if prep.refs is None:
        ref_fn = functools.partial(prep.ref_fn, **prep.ref_params)
        with jax.default_matmul_precision("highest"):
            refs = ref_fn(*[upcast(x) for x in prep.inputs])
        prep.refs = jax.block_until_ready(tuple(refs) if isinstance(refs, (tuple, list)) else (refs,))
    return prep.refs


def _run_grad(task: GradTask, prep: Prepared, start: float) -> Result:
    """Grad mode: the kernel's jax.custom_vjp (generated/<kernel>/_vjp.py) against jax.vjp of
    the reference. Off TPU, mosaic_tpu runs in TPU interpret mode, the backward kernels too
    (without the race detector: it records one kernel's grid); off a GPU, triton in Pallas interpret
    mode."""
    import jax

    from kspec.codegen.run import grad as gradrun

    module = _module(task, "_vjp")
    interpret = None
    if BACKENDS[task.backend].simulated_on(jax.default_backend()):
        from jax.experimental.pallas import tpu as pltpu

        _reset_tpu_interpret()
        interpret = pltpu.InterpretParams(out_of_bounds_reads="raise", uninitialized_memory="nan")
    elif _gpu_interpreted(task):  # the forward kernel in Mosaic GPU interpret mode; the backward's own backends
        gpu_interpret.reset()
        _interpret_forward(task)
    elif BACKENDS[task.backend].interpreted_off_device(jax.default_backend()):
        interpret = True
    return gradrun.grad(task, prep, module, interpret, start)


def check_outputs(task: Task, prep: Prepared, outs, seconds: float, loose: bool = False) -> Result:
    """Compare a kernel's outputs with the reference run at higher precision. `loose` (input kinds
    other than normal): no NaN/Inf where the reference is finite, and a rel_err of at most
    kinds.NORMWISE x rtol, instead of the tolerance per element."""
    import jax
    import jax.numpy as jnp

    spec = prep.spec
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    ref_fn = functools.partial(prep.ref_fn, **prep.ref_params)
    refs = reference_outputs(prep)
    returned = spec.returned  # a residual output is not returned: verify judges it through the grad rows
    if not len(refs) == len(outs) == len(returned):
        return result(
            task, "fail",
            f"kernel returned {len(outs)} output(s), reference {len(refs)}, spec declares {len(returned)}"
            + (" (residual outputs left out)" if len(returned) < len(spec.outputs) else ""),
            seconds=seconds,
        )
    # The reference at the inputs' own dtypes says what dtype each output must have.
    natural = jax.eval_shape(ref_fn, *prep.inputs)
    natural = natural if isinstance(natural, (tuple, list)) else (natural,)
    tol = dt.tolerance(list(prep.dtypes.values()), spec.tolerance, prep.case.tolerance)
    for op, out, want in zip(returned, outs, natural):
        declared = jnp.dtype(prep.dtypes[op.name])
        if out.dtype != want.dtype:
            message = f"output {op.name} has dtype {out.dtype} but the reference returns {want.dtype}"
            return result(task, Status.FAIL, message, seconds=seconds, tolerance=tol)
        if out.dtype != declared:
            message = f"output {op.name} has dtype {out.dtype}, the spec declares {declared}"
            return result(task, Status.FAIL, message, seconds=seconds, tolerance=tol)
    named = [(f"output {op.name}", out, ref) for op, out, ref in zip(returned, outs, refs)]
    normwise = kinds.NORMWISE * tol["rtol"] if loose else None
    return verdict_result(task, compare_within(named, tol, normwise), seconds, tol)


def _lower(task: LowerTask, fn, inputs, params, start: float) -> Result:
    """`kspec verify --lower`: the kernel lowered for its backend's platform (and, off a TPU, a
    named TPU chip: codegen.run.lowering)."""
    import jax

    from kspec.codegen.run import lowering

    shapes = [None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]  # None: an absent optional input
    with contextlib.redirect_stderr(io.StringIO()), lowering.target(task.backend):
        lowered = jax.jit(functools.partial(fn, **params)).trace(*shapes).lower(
            lowering_platforms=(lowering.platform(task.backend),))
        text = lowered.as_text()
    return result(
        task,
        "pass",
        f"lowered for {lowering.shown(task.backend)} ({len(text)} characters of StableHLO)",
        seconds=round(time.monotonic() - start, 3),
    )

