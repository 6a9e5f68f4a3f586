"""The worker pool of verify, bench and tune: one worker process at a time, each task answered
within its timeout; a worker that crashes, hangs or is fed garbage is killed with everything it
started, and the next task gets a fresh one. Only the workers import jax.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from multiprocessing import connection as mp_connection

from kspec.codegen.backends import BACKENDS
from kspec.codegen.run.tasks import DONE, Result, Status, Task, result

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
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL, stdout=_stderr_fd(), process_group=0,
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

    def run(self, task: Task) -> Result:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        start = time.monotonic()
        try:
            self._conn.send(task)
            answer = _receive(self._conn, self.timeout)
            if answer is not _TIMED_OUT:
                return _checked(answer)
            self._kill()
            return result(task, Status.ERROR, f"timed out after {self.timeout:g} s", seconds=round(time.monotonic() - start, 3))
        except (EOFError, OSError):
            self._proc.join(5)
            why = _exit_reason(self._proc.exitcode)
            self._kill()
            return result(task, Status.ERROR, f"worker died: {why}", seconds=round(time.monotonic() - start, 3))
        except _GARBLED:
            self._kill()
            return result(task, Status.ERROR, GARBLED, seconds=round(time.monotonic() - start, 3))

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
                    yield result(task, Status.ERROR, f"timed out after {self.timeout:g} s")
                    return
                if message == DONE:
                    return
                yield _checked(message)
        except (EOFError, OSError):
            self._proc.join(5)
            why = _exit_reason(self._proc.exitcode)
            self._kill()
            yield result(task, Status.ERROR, f"worker died: {why}")
        except _GARBLED:
            self._kill()
            yield result(task, Status.ERROR, GARBLED)

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


def _stderr_fd() -> int:
    """Where the worker's standard output goes: this process's standard error (its file
    descriptor 2 when sys.stderr is not a file, as under a test's capture)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


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


def _checked(answer) -> Result:
    """A worker's answer, which must be a Result: anything else came from a task writing to the channel."""
    if not isinstance(answer, Result):
        raise TypeError(f"a {type(answer).__name__} where a result was due")
    return answer
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


# XLA on the CPU computes a bfloat16 operation in float32 and may drop the round trip float32 ->
# bfloat16 -> float32 that follows it (excess precision). A TPU rounds every bfloat16 result, a
# dot's included, before the next operation reads it, and so does a GPU kernel (a Triton dot that
# returns bfloat16 rounds its float32 accumulator); with this flag XLA keeps every rounding the
# program asks for, so a kernel in TPU interpret mode, or in Pallas interpret mode on the CPU, rounds
# as the device it stands for does.
TPU_NUMERICS = "--xla_allow_excess_precision=false"


def worker_env(devices: int | None = None, tpu_numerics: bool = False) -> dict:
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}
    flags = [f"--xla_force_host_platform_device_count={devices}"] if devices else []
    flags += [TPU_NUMERICS] if tpu_numerics else []
    if flags:
        env["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    return env


def only_the_cpu() -> bool:
    """Whether jax can run on nothing but the CPU here, found without importing jax: JAX_PLATFORMS says
    cpu, or neither a PJRT plugin (a module of the jax_plugins namespace, or an entry point of that
    group: jax's CUDA and ROCm plugins) nor libtpu is installed."""
    import importlib.metadata
    import importlib.util
    import pkgutil

    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms == "cpu"
    if importlib.util.find_spec("libtpu") is not None or importlib.metadata.entry_points(group="jax_plugins"):
        return False
    namespace = importlib.util.find_spec("jax_plugins")
    return namespace is None or not any(pkgutil.iter_modules(namespace.submodule_search_locations or []))


class Workers:
    """The workers of a verify, bench or tune run: one for every task, except that the kernels that
    run simulated go to a worker whose XLA keeps every rounding (TPU_NUMERICS): off a TPU the
    mosaic_tpu tasks (TPU interpret mode), and on the CPU the interpret tasks (Pallas interpret mode).
    The other backends keep XLA's default numerics. A worker of either kind starts when the first
    task for it comes; the first one starts at once, for `info`, and it keeps every rounding where
    jax can run only on the CPU, since every backend runs simulated or interpreted there."""

    def __init__(self, devices: int | None, timeout: float):
        self.devices, self.timeout = devices, timeout
        exact = only_the_cpu()
        self._sessions = {exact: Session(worker_env(devices, tpu_numerics=exact), timeout)}
        self.info = self._sessions[exact].info

    def _for(self, task: Task) -> Session:
        exact = BACKENDS[task.backend].rounds_as_a_device_on(self.info["platform"])
        if exact not in self._sessions:
            self._sessions[exact] = Session(worker_env(self.devices, tpu_numerics=exact), self.timeout)
        return self._sessions[exact]

    def run(self, task: Task) -> Result:
        try:
            session = self._for(task)
        except RuntimeError as e:  # a worker of the other kind failed to start
            return result(task, "error", str(e))
        return session.run(task)

    def stream(self, task: Task):
        try:
            session = self._for(task)
        except RuntimeError as e:
            yield result(task, "error", str(e))
            return
        yield from session.stream(task)

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
