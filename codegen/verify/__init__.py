"""`kspec verify`: run every generated kernel against its reference.

The parent process plans tasks (spec x backend x case x dtype) and hands them to
worker processes (`codegen.worker`), one task at a time: a task that crashes its
worker, hangs past the timeout or exhausts memory fails alone, and a fresh worker
takes the remaining tasks. Only the workers import jax and the generated modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import os
import pickle
import select
import signal
import struct
import time
from multiprocessing import connection as mp_connection

from kspec.codegen.checks import instances
from kspec.codegen import project as pipeline
from kspec.codegen.emit import writer
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.backends import BACKENDS

STATUSES = ("pass", "fail", "error", "skip")
# mosaic_tpu off a TPU runs in TPU interpret mode under this many schedules per task
# (seed x DMA mode x cores; codegen/multicore.py): the four combinations of DMA mode and cores.
DEFAULT_SCHEDULES = 4


@dataclasses.dataclass(frozen=True)
class Task:
    spec_path: str
    kernel: str
    backend: str
    case: str
    case_index: int
    dtypes: tuple  # ((operand, dtype), ...), inputs first
    dtype_label: str  # the inputs' dtypes, for reports
    seed: int
    mode: str  # "run" | "lower" | "grad" | "lower-grad" | "bench" | "sharded" | "tune"
    out_root: str
    suite: str = "cases"  # which list case_index points into: "cases" or "bench"
    params: tuple = ()  # ((param, value), ...) overriding the case's params (tune)
    samples: int = 0  # bench: timed samples
    ceilings: tuple = ()  # bench: measured (bandwidth GB/s, bf16 TFLOP/s) to use as the roofline
    configs: tuple = ()  # tune: the configs to compile, verify and time, each ((param, value), ...)
    devices: int = 0  # sharded: the mesh is built from this many devices
    schedules: int = DEFAULT_SCHEDULES  # run, mosaic_tpu in TPU interpret mode: schedules to run
    sustained: bool = False  # tune: time each config in alternation with the reference, under load

    @property
    def label(self) -> str:
        grad = " (grad)" if self.mode in ("grad", "lower-grad") else ""
        return f"{self.kernel}[{self.backend}] {self.case} {self.dtype_label}{grad}"


def result(task: Task, status: str, message: str = "", **metrics) -> dict:
    out = {
        "kernel": task.kernel,
        "backend": task.backend,
        "case": task.case,
        "dtype": task.dtype_label,
        "mode": task.mode,
        "seed": task.seed,
        "status": status,
        "max_abs_err": None,
        "max_rel_err": None,
        "rel_err": None,
        "frac_within_tol": None,
        "tolerance": None,
        "seconds": None,
        "message": message,
    }
    out.update(metrics)
    return out


def matrix(compiled: list, *, backends: list, cases: list, suite: str = "cases"):
    """Every (compiled spec, backend, case index, case, dtype assignment, input-dtype label) the
    filters keep: the one loop behind verify, sharded verify and bench plans. `suite`
    "bench" takes a spec's bench cases (its verify cases when it has none)."""
    for c in compiled:
        spec = c.spec
        chosen = spec.bench if suite == "bench" and spec.bench else spec.cases
        for name in spec.backends:
            if backends and name not in backends:
                continue
            for i, case in enumerate(chosen):
                if cases and case.name not in cases:
                    continue
                for assign in instances.dtype_assignments(spec, case):
                    label = ",".join(dict.fromkeys(assign[o.name] for o in spec.inputs))
                    yield c, name, i, case, assign, label


def plan(
    compiled: list, *, backends: list, cases: list, seed: int, lower: bool, platform: str | None, repeat: int = 1,
    schedules: int = DEFAULT_SCHEDULES,
) -> tuple:
    """(tasks, skipped results) for every valid spec; `repeat` runs it all with seeds seed, seed+1, ...;
    `schedules`: how many schedules each mosaic_tpu task runs under in TPU interpret mode.
    A spec with `vjp:` also gets a grad task (its gradients against the reference's) for each
    combination with a floating-point input."""
    tasks, skipped = [], []
    for k in range(repeat):
        for c, name, i, case, assign, label in matrix(compiled, backends=backends, cases=cases):
            modes = ["lower" if lower else "run"]
            if c.spec.vjp is not None and any(dt.is_float(assign[o.name]) for o in c.spec.inputs):
                modes.append("lower-grad" if lower else "grad")
            why = _skip_reason(name, platform, lower) or _dtype_reason(c.spec.variants[name], assign)
            for mode in modes:
                task = Task(
                    str(c.path), c.spec.name, name, case.name, i, tuple(assign.items()), label, seed + k,
                    mode, str(pipeline.out_root_for(c.path)), schedules=schedules,
                )
                if not why:
                    tasks.append(task)
                elif k == 0:
                    skipped.append(result(task, "skip", why))
    return tasks, skipped


def plan_sharded(
    compiled: list, *, devices: int, device_count: int, backends: list, cases: list, seed: int, platform: str | None
) -> tuple:
    """(tasks, results) for `kspec verify --devices N`: each spec with `sharding:` runs its
    sharded function on a mesh of N devices, per backend x case x dtype, against the reference.
    A mesh axis sized by the device count gets its size only now, so the split dims and the
    per-shard rules (E804, E806) are checked here too; a failure is an error result."""
    from kspec.codegen.checks import sharding

    tasks, done = [], []
    sharded = [c for c in compiled if c.spec.sharding is not None]
    for c, name, i, case, assign, label in matrix(sharded, backends=backends, cases=cases):
        spec, sh = c.spec, c.spec.sharding
        found = sharding.case_checks(spec, case, sh.sizes(devices))
        task = Task(str(c.path), spec.name, name, case.name, i, tuple(assign.items()), label, seed,
                    "sharded", str(pipeline.out_root_for(c.path)), devices=devices)
        why = (
            _sharded_skip_reason(name, sh, devices, device_count, platform)
            or _dtype_reason(spec.variants[name], assign)
        )
        if why:
            done.append(result(task, "skip", why))
        elif found:
            done.append(result(task, "error", "\n".join(d.format() for d in found)))
        else:
            tasks.append(task)
    return tasks, done


def _sharded_skip_reason(backend: str, sh, devices: int, device_count: int, platform: str | None) -> str | None:
    if backend == "interpret" and sh.check_vma:
        return "interpret=True pallas_calls fail inside shard_map(check_vma=True) in jax 0.10.2; mosaic_tpu covers it"
    if device_count < devices:
        return f"needs {devices} devices; jax sees {device_count} {platform} device(s)"
    return sh.unfit(devices) or _skip_reason(backend, platform, lower=False)


def _skip_reason(backend: str, platform: str | None, lower: bool) -> str | None:
    info = BACKENDS[backend]
    if lower:
        return None if info.lowering_platform else "nothing to lower: runs in interpret mode"
    if backend in ("interpret", "mosaic_tpu"):  # mosaic_tpu runs in TPU interpret mode off-TPU
        return None
    if platform not in info.platforms:
        return f"needs a {'/'.join(info.platforms)} device; this machine's jax platform is {platform}"
    return None


def _dtype_reason(variant, assign: dict) -> str | None:
    if variant.supports(assign):
        return None
    allowed = "; ".join(f"{k}: {', '.join(v)}" for k, v in variant.dtypes.items())
    return f"{variant.backend} takes only {allowed}"


def stale(compiled: list) -> list:
    """(path, reason) for generated files that do not match their spec.

    _tuning.py is left out: runs pass every param explicitly, and `kspec tune`
    itself outdates it until the next `kspec generate`."""
    out = []
    for c in compiled:
        kernel_dir, planned = pipeline.plan(c, pipeline.out_root_for(c.path))
        out += [(p, why) for p, why in writer.compare(planned, kernel_dir) if p.name != "_tuning.py"]
    return out


class Session:
    """Worker processes with a pipe each, run one task at a time; a worker that
    crashes or times out is killed and the next task gets a fresh one."""

    def __init__(self, env: dict, timeout: float, startup_timeout: float = 300.0):
        self.env, self.timeout, self.startup_timeout = env, timeout, startup_timeout
        self._proc = None
        self.info = self._start()

    def _start(self) -> dict:
        """A fresh worker: a process of its own, in a process group of its own (killed as a whole),
        holding only three pipes: tasks in, results out, and a lifeline whose other end only this
        process holds. When this process ends, however it ends (SIGTERM, SIGKILL, a crash), the
        lifeline closes and the worker's guard kills the group: the worker and anything a task
        started. Its standard output is this process's standard error."""
        tasks_r, tasks_w = os.pipe()
        results_r, results_w = os.pipe()
        life_r, life_w = os.pipe()
        env = dict(os.environ, **{k: v for k, v in self.env.items() if v})
        fds = (tasks_r, results_w, life_r)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from kspec.codegen.run import worker; worker.serve()", *map(str, fds)],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), process_group=0,
            )
        finally:
            for fd in fds:
                os.close(fd)
        self._proc = _Worker(proc)
        self._conn = _Channel(mp_connection.Connection(tasks_w, readable=False), results_r)
        self._lifeline = _Fd(life_w)
        try:
            info = _receive(self._conn, self.startup_timeout)
        except (EOFError, OSError) + _GARBLED:
            self._kill()
            raise RuntimeError(f"the verify worker failed to start: {_exit_reason(self._proc.exitcode)}") from None
        if info is _TIMED_OUT:
            self._kill()
            raise RuntimeError("the verify worker did not start (importing jax timed out)")
        return info

    def run(self, task: Task) -> dict:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        start = time.monotonic()
        try:
            self._conn.send(task)
            answer = _receive(self._conn, self.timeout)
            if answer is not _TIMED_OUT:
                return answer
            self._kill()
            return result(task, "error", f"timed out after {self.timeout:g} s", seconds=round(time.monotonic() - start, 3))
        except (EOFError, OSError):
            self._proc.join(5)
            why = _exit_reason(self._proc.exitcode)
            self._kill()
            return result(task, "error", f"worker died: {why}", seconds=round(time.monotonic() - start, 3))
        except _GARBLED:
            self._kill()
            return result(task, "error", GARBLED, seconds=round(time.monotonic() - start, 3))

    def stream(self, task: Task):
        """Send a task that answers with several messages; yield them until its "done"."""
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send(task)
            while True:
                message = _receive(self._conn, self.timeout)
                if message is _TIMED_OUT:
                    self._kill()
                    yield result(task, "error", f"timed out after {self.timeout:g} s")
                    return
                if message.get("done"):
                    return
                yield message
        except (EOFError, OSError):
            self._proc.join(5)
            why = _exit_reason(self._proc.exitcode)
            self._kill()
            yield result(task, "error", f"worker died: {why}")
        except _GARBLED:
            self._kill()
            yield result(task, "error", GARBLED)

    def _kill(self) -> None:
        """Kill the worker's process group (the worker, its guard, anything a task started); every
        wait is bounded."""
        if self._proc is None:
            return
        if self._proc.pid is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)
        self._lifeline.close()
        self._conn.close()

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(10)
            except OSError:
                pass
        self._kill()


# What a result channel gives when something in the task wrote to its descriptor.
_GARBLED = (pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError, MemoryError)
GARBLED = "the worker's result channel was written to by the task itself (a stray write to an inherited descriptor)"


class _Worker:
    """A worker process, as the session uses it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exitcode(self):
        return self.proc.returncode

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)


class _Channel:
    """Tasks go out on one pipe, results come back on another (read by _receive)."""

    def __init__(self, tasks, results_fd: int):
        self.tasks, self.results_fd = tasks, results_fd

    def send(self, obj) -> None:
        self.tasks.send(obj)

    def fileno(self) -> int:
        return self.results_fd

    def close(self) -> None:
        self.tasks.close()
        with contextlib.suppress(OSError):
            os.close(self.results_fd)


class _Fd:
    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


_TIMED_OUT = object()
MAX_MESSAGE = 256 << 20  # a result is a row of metrics and samples, far below this


def _receive(conn, timeout: float):
    """One message from the worker within `timeout` seconds (the whole message, not only its start),
    or _TIMED_OUT. The framing is multiprocessing's (a 4-byte big-endian length, or -1 and 8 bytes),
    read here with a deadline and a size bound, so bytes a task wrote into the pipe cannot make this
    wait for ever or allocate without limit: they fail to unpickle (a _GARBLED exception)."""
    deadline = time.monotonic() + timeout
    fd = conn.fileno()

    def read(n: int) -> bytes | object:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return _TIMED_OUT
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    head = read(4)
    if head is _TIMED_OUT:
        return head
    (size,) = struct.unpack("!i", head)
    if size == -1:
        head = read(8)
        if head is _TIMED_OUT:
            return head
        (size,) = struct.unpack("!Q", head)
    if not 0 <= size <= MAX_MESSAGE:
        raise pickle.UnpicklingError(f"a message of {size} bytes")
    data = read(size)
    return data if data is _TIMED_OUT else pickle.loads(data)


def _exit_reason(code) -> str:
    if code is None:
        return "lost contact"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
        return name + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exit code {code}"


def worker_env(devices: int | None = None) -> dict:
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}
    if devices:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    return env


def summary(results: list) -> dict:
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r["status"]] += 1
    return counts


def to_json(results: list, *, seed: int, jax_version: str, device: str) -> dict:
    from kspec import __version__

    return {
        "kspec_version": __version__,
        "jax_version": jax_version,
        "device": device,
        "seed": seed,
        "summary": summary(results),
        "results": results,
    }


def to_junit(results: list) -> str:
    import xml.etree.ElementTree as ET

    counts = summary(results)
    suite = ET.Element(
        "testsuite",
        name="kspec verify",
        tests=str(len(results)),
        failures=str(counts["fail"]),
        errors=str(counts["error"]),
        skipped=str(counts["skip"]),
        time=f"{sum(r['seconds'] or 0 for r in results):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"{r['kernel']}.{r['backend']}",
            name=f"{r['case']}[{r['dtype']}]{'' if r['mode'] in ('run', 'sharded') else '(' + r['mode'] + ')'}",
            time=f"{r['seconds'] or 0:.3f}",
        )
        if r["status"] in ("fail", "error", "skip"):
            tag = {"fail": "failure", "error": "error", "skip": "skipped"}[r["status"]]
            ET.SubElement(case, tag, message=r["message"][:500]).text = r["message"]
    return ET.tostring(suite, encoding="unicode")
