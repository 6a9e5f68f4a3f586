"""Deadlocks in TPU interpret mode: a semaphore wait that nothing can satisfy.

In TPU interpret mode a core that waits on a semaphore (a DMA's `.wait()`,
`pltpu.semaphore_wait`) polls until the semaphore's count on that core reaches the value
waited for; meanwhile it runs the DMAs queued on that semaphore (`on_wait` DMAs land only
then). A wait with no DMA started on its semaphore, a wait on the wrong semaphore or for more
than was started polls forever, and verify would see only the task's timeout.

`watching` wraps the interpreter's semaphore methods for one run. A waiting core is *stuck*
when its semaphore's count is below the value and no DMA is queued on it. A stuck core can be
released only by another core: the run is deadlocked when every other core is stuck too, or
has run all its grid points, and nothing has been signalled or queued since (checked on two
polls in a row, so a core in its last grid point gets one poll to signal). The stuck wait then
raises `Deadlock`, which names the semaphore (its scratch name in the spec), the value waited
for, the count, the grid point and the core.

It uses the interpreter's `Semaphore` class (jax._src.pallas.mosaic.interpret.shared_memory),
which is not public API: where that class or the attributes used here are missing, the waits
run unwatched, and a deadlock ends in the task's timeout as before. This module runs in the
verify worker; it imports jax only inside its functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading

import numpy as np

FIRST_SEMAPHORE_ID = 2000  # the interpreter numbers the semaphores it allocates from here, per core
_NEEDED = ("cv", "count_by_core", "tasks", "shared_memory")


class Deadlock(RuntimeError):
    """A semaphore wait in TPU interpret mode that nothing can satisfy."""


@dataclasses.dataclass
class _Wait:
    semaphore: object
    value: int
    dma: bool  # a DMA's wait (its value counts bytes), else pltpu.semaphore_wait
    point: tuple | None  # the grid point the core was at
    where: str | None  # the wait's line in the generated module
    stuck_at: int | None = None  # the epoch at which the core last found its wait stuck


class Watch:
    """The cores' waits during one run in TPU interpret mode."""

    def __init__(self, names: list, expected: list | None, visits: list):
        self.names = names  # per semaphore id offset: the scratch name, e.g. `in_sem[1]`
        self.expected = expected  # grid points per core, None when unknown
        self.visits = visits  # (grid point, core) as multicore records them
        self.lock = threading.Lock()
        self.epoch = 0  # bumped by every signal and every DMA queued
        self.waits: dict = {}  # core -> _Wait
        self.found: str | None = None

    def bump(self) -> None:
        with self.lock:
            self.epoch += 1

    def _point(self, core: int) -> tuple | None:
        for point, c in reversed(self.visits):
            if c == core:
                return point
        return None

    def _finished(self, core: int, cores: int) -> bool:
        """Whether a core that is not waiting has started all its grid points."""
        if self.expected is None or core >= len(self.expected) or len(self.expected) != cores:
            return False
        return sum(1 for _, c in self.visits if c == core) >= self.expected[core]

    def check(self, core: int, cores: int, last: tuple | None) -> tuple:
        """Called by a stuck waiter at each poll, with what it saw at its previous poll; returns
        what it sees now, and raises Deadlock when it has seen a deadlock twice in a row."""
        with self.lock:
            self.waits[core].stuck_at = self.epoch
            others = [c for c in range(cores) if c != core]
            blocked = all(
                (c in self.waits and self.waits[c].stuck_at == self.epoch)
                or (c not in self.waits and self._finished(c, cores))
                for c in others
            )
            now = (self.epoch, len(self.visits)) if blocked else None
            if now is None or now != last:
                return now
            self.found = self._message(cores)
            raise Deadlock(self.found)

    def _message(self, cores: int) -> str:
        """The deadlock, led by the lowest-numbered waiting core (whichever core found it)."""
        lead = min(self.waits)  # the core that found it waits too
        first = self.waits[lead]
        unit = " bytes" if first.dma else ""
        why = ("no DMA started on it is pending (a wait without its start, or on another semaphore than the "
               "DMA's?)" if first.dma else "nothing left to run can signal it")
        lines = [f"deadlock: {self._waiter(lead, first)} for {first.value}{unit}; it holds "
                 f"{int(first.semaphore.count_by_core[lead])} and {why}"]
        for c in range(cores):
            if c != lead:
                lines.append(f"{self._waiter(c, self.waits[c])} too" if c in self.waits
                             else f"core {c} has no grid point left to run")
        return "; ".join(lines)

    def _waiter(self, core: int, w: _Wait) -> str:
        at = f", grid point {w.point}," if w.point else ""
        where = f" at {w.where}" if w.where else ""
        return f"core {core}{at} waits{where} on {self._semaphore(w)}"

    def _semaphore(self, w: _Wait) -> str:
        kind = "DMA semaphore" if w.dma else "semaphore"
        offset = getattr(w.semaphore, "id", None)
        if isinstance(offset, int) and self.names and offset >= FIRST_SEMAPHORE_ID:
            return f"{kind} {self.names[(offset - FIRST_SEMAPHORE_ID) % len(self.names)]}"
        return f"{kind} {offset}"


def semaphore_names(inst) -> list:
    """Per semaphore the interpreter allocates, in its order (the scratch operands' order, each array
    of semaphores in row-major order): its name as the spec writes it, `sem` or `in_sem[1]`."""
    names = []
    for s in inst.variant.scratch:
        if s.kind not in ("dma_semaphore", "semaphore"):
            continue
        shape = tuple(inst.scratch_shapes[s.name])
        if not shape:
            names.append(s.name)
            continue
        for k in range(math.prod(shape)):
            names.append(f"{s.name}[{', '.join(str(int(i)) for i in np.unravel_index(k, shape))}]")
    return names


def points_per_core(grid: tuple, parallel: list, cores: int) -> list:
    """How many grid points each core runs: the interpreter splits the points of the `parallel`
    axes into `cores` runs of equal length (the last shorter), each with all points of the others."""
    total = math.prod(grid)
    steps = math.prod(grid[p] for p in parallel)
    each = -(-steps // cores) * (total // steps)
    return [max(0, min(each, total - c * each)) for c in range(cores)]


def _where(logging_info) -> str | None:
    """`generated/k/mosaic_tpu.py:20:4`, relative to the working directory: the innermost frame
    outside jax of the wait's source information, when the interpreter passes it."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(logging_info.source_info.traceback)
        path = os.path.relpath(frame.file_name)
    except Exception:  # noqa: BLE001 - another jax, or no source information: the message goes without
        return None
    return f"{path}:{frame.start_line}:{frame.start_column}"


@contextlib.contextmanager
def watching(names: list, expected: list | None, visits: list):
    """Wrap the interpreter's semaphore methods while the block runs; yields the Watch."""
    watch = Watch(names, expected, visits)
    try:
        from jax._src.pallas.mosaic.interpret import shared_memory
        semaphore = shared_memory.Semaphore
        originals = {name: getattr(semaphore, name) for name in ("wait", "signal", "enqueue_task")}
    except (ImportError, AttributeError):  # another jax: waits run unwatched
        yield watch
        return

    def signal(self, *args, **kwargs):
        try:
            return originals["signal"](self, *args, **kwargs)
        finally:
            watch.bump()

    def enqueue_task(self, *args, **kwargs):
        try:
            return originals["enqueue_task"](self, *args, **kwargs)
        finally:
            watch.bump()

    def wait(self, value, global_core_id, *args, **kwargs):
        # the interpreter's polling loop (Semaphore.wait), with the check for a deadlock at each poll
        if args or not all(hasattr(self, a) for a in _NEEDED):
            return originals["wait"](self, value, global_core_id, *args, **kwargs)
        core, value = int(global_core_id), int(value)
        cores = int(getattr(self.shared_memory, "num_cores", len(self.count_by_core)))
        with watch.lock:
            watch.waits[core] = _Wait(self, value, bool(kwargs.get("has_tasks")), watch._point(core),
                                      _where(kwargs.get("logging_info")))
        try:
            last = None
            while True:
                self.shared_memory.check_failed()
                with self.cv:
                    if self.count_by_core[core] >= value:
                        break
                    task = self.tasks[core].pop() if self.tasks[core] else None
                    if task is None:
                        last = watch.check(core, cores, last)
                        self.cv.wait(timeout=0.1)
                if task is not None:
                    last = None
                    task()
        finally:
            with watch.lock:
                watch.waits.pop(core, None)
        # the count is there: the interpreter's own wait takes it and does its happens-before bookkeeping
        return originals["wait"](self, value, global_core_id, **kwargs)

    for name, fn in (("wait", wait), ("signal", signal), ("enqueue_task", enqueue_task)):
        setattr(semaphore, name, fn)
    try:
        yield watch
    finally:
        for name, fn in originals.items():
            setattr(semaphore, name, fn)
