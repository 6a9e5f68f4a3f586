"""Verify's multi-core simulator: a mosaic_tpu kernel run under several schedules.

Off a TPU, verify runs a mosaic_tpu kernel in TPU interpret mode, which simulates a
megacore chip: the `parallel` grid axes are split over the cores and visited in an order
drawn from a seed, a DMA lands when it starts (`eager`) or only when it is waited on
(`on_wait`), and a happens-before detector reports accesses that no wait or barrier
orders (a race). A schedule is one choice of (seed, DMA mode, cores); verify runs every
task under several.

A correct kernel gives bitwise the same outputs under every schedule: each output block
is computed by the same grid points from the same data, and the `arbitrary` axes run in
the same order everywhere, so even float rounding is the same. Only the order and the
cores of the parallel steps and the DMA timing change, and a result that depends on them
is a bug: two parallel steps writing one block, a read of a DMA's destination before its
wait, state carried between parallel steps in scratch. So outputs that differ between
schedules fail the task, and the message names the grid axes involved, from the grid
points the interpreter records (`grid_point_recorder`) and the output's index map
evaluated at them (with the scalar-prefetch values the kernel got).

This module runs in the verify worker; it imports jax only inside its functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import itertools
import math
import os
import re

import numpy as np

from kspec.codegen.run import deadlock
from kspec.codegen.spec.model import BLOCKED, BOUNDED, ELEMENT, SQUEEZED, MemorySpace, ScratchKind

# Schedule k takes COMBOS[k % 4] and its own seed: one pass over the four covers both DMA
# modes and both core counts, and the first two already cover each once.
COMBOS = (("on_wait", 2), ("eager", 1), ("eager", 2), ("on_wait", 1))


@dataclasses.dataclass(frozen=True)
class Schedule:
    number: int  # 1-based, as messages name it
    seed: int  # InterpretParams.random_seed: the order of the parallel grid axes
    dma: str  # InterpretParams.dma_execution_mode
    cores: int  # InterpretParams.num_cores_or_threads

    @property
    def label(self) -> str:
        return f"seed {self.seed}, {self.dma} DMAs, {self.cores} core{'s' if self.cores > 1 else ''}"

    def to_json(self) -> dict:
        return {"seed": self.seed, "dma_execution_mode": self.dma, "cores": self.cores}


def schedules(seed: int, n: int) -> list:
    """The first n schedules of a task with input seed `seed`; the first uses the seed itself."""
    out = []
    for k in range(n):
        derived = int.from_bytes(hashlib.sha256(f"{seed}/schedule/{k}".encode()).digest()[:4], "little")
        dma, cores = COMBOS[k % len(COMBOS)]
        out.append(Schedule(k + 1, (seed if k == 0 else derived) % 2**31, dma, cores))
    return out


def note(plan: list, schedule: Schedule | None = None) -> str:
    """The suffix of a failing task's message: which schedule(s) it ran under."""
    if schedule is not None and len(plan) > 1:
        return f" [TPU interpret mode, schedule {schedule.number} of {len(plan)}: {schedule.label}]"
    if len(plan) == 1:
        return f" [TPU interpret mode, {plan[0].label}]"
    return f" [TPU interpret mode, the same under all {len(plan)} schedules]"


@dataclasses.dataclass
class Run:
    schedule: Schedule
    outs: tuple  # the kernel's outputs, as returned
    arrays: list  # the same, as numpy arrays
    visits: list  # (grid point, core): each core's visits in its order, core 0's first
    race: str | None  # what the race detector printed, if it found a race


_visits: list = []


def _record(token, point, core):
    # One function for every run, so equal schedules give equal InterpretParams (jit caches them).
    _visits.append((tuple(int(v) for v in np.asarray(point)), int(np.asarray(core))))
    return token


def run(call, inputs: list, schedule: Schedule, inst) -> Run:
    """Run `call(*inputs, interpret=...)` of the task instance `inst` under one schedule; a
    deadlocked semaphore wait raises deadlock.Deadlock (codegen/run/deadlock.py)."""
    import jax
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
    _visits.clear()
    params = pltpu.InterpretParams(
        detect_races=True,
        out_of_bounds_reads="raise",
        uninitialized_memory="nan",
        num_cores_or_threads=schedule.cores,
        dma_execution_mode=schedule.dma,
        random_seed=schedule.seed,
        grid_point_recorder=_record,
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), _watching(inst, schedule) as watch:
        try:
            outs = jax.block_until_ready(call(*inputs, interpret=params))
        except Exception:  # noqa: BLE001 - a deadlock surfaces as the interpreter's error: say what it was
            if watch.found:
                raise deadlock.Deadlock(watch.found) from None
            raise
    state = getattr(ipc, "races", None)
    raced = state is not None and getattr(state, "races_found", False)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    visits = sorted(_visits, key=lambda v: v[1])  # the cores' threads interleave; each core's order is fixed
    return Run(schedule, outs, [np.asarray(o) for o in outs], visits, printed.getvalue() if raced else None)


def _watching(inst, schedule: Schedule):
    """deadlock.watching for a run of `inst` under `schedule`: the names of its semaphores and its grid
    points per core. For a mesh kernel neither is known: its semaphores go by number, and a deadlock
    is found only when every core waits."""
    if inst.spec.kind == "mesh":  # its pipelines allocate semaphores of their own too
        return deadlock.watching([], None, _visits)
    expected = deadlock.points_per_core(inst.grid, _parallel(inst), schedule.cores)
    return deadlock.watching(deadlock.semaphore_names(inst), expected, _visits)


def compared(inst, runs: list) -> list:
    """The runs whose outputs are deterministic. The simulated cores are threads: with a race
    and work for two cores, the result depends on how the threads happened to interleave."""
    busy = _steps(inst) > 1
    return [r for r in runs if not (r.race and r.schedule.cores > 1 and busy)]


def diagnose(inst, prefetch: dict, runs: list) -> str | None:
    """Why the outputs depend on the schedule (outputs that differ, races), or None."""
    lines = []
    kept = compared(inst, runs)
    groups = _groups(kept)
    if len(groups) > 1:
        a, b = _closest_pair(inst, groups)
        lines += _difference(inst, prefetch, a, b)
        shown = ", ".join("{" + ", ".join(str(r.schedule.number) for r in g) + "}" for g in groups)
        dropped = [r.schedule.number for r in runs if r not in kept]
        lines.append(
            f"same outputs: schedules {shown}"
            + (f"; {_numbers(dropped)} ran two cores into a race, so {'its' if len(dropped) == 1 else 'their'} "
               "outputs are not compared" if dropped else "")
        )
    raced = [r for r in runs if r.race]
    if raced:
        first = raced[0]
        also = f" (and under {_numbers([r.schedule.number for r in raced[1:]])})" if raced[1:] else ""
        lines.append(
            f"data race under schedule {first.schedule.number} ({first.schedule.label}){also}: "
            + (_block_race(inst, prefetch, first) or _printed_race(first.race))
        )
    return "\n  ".join(lines) or None


def _numbers(numbers: list) -> str:
    return ("schedule " if len(numbers) == 1 else "schedules ") + ", ".join(map(str, numbers))


def _groups(runs: list) -> list:
    """The runs grouped by bitwise-equal outputs, groups in order of their first run."""
    groups: list = []
    for r in runs:
        for g in groups:
            if _first_difference(g[0], r) is None:
                g.append(r)
                break
        else:
            groups.append([r])
    return groups


def _bits(a: np.ndarray) -> np.ndarray:
    """Per element, the bytes of its value: equal bits, equal result (NaN with the same NaN)."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8).reshape(*a.shape, a.dtype.itemsize)


def _first_difference(a: Run, b: Run):
    """(output index, element) of the first element whose bits differ, or None. The shapes and
    dtypes are equal: every schedule runs the same pallas_call."""
    for k, (x, y) in enumerate(zip(a.arrays, b.arrays)):
        differs = np.any(_bits(x) != _bits(y), axis=-1)
        if differs.any():
            return k, tuple(int(i) for i in np.argwhere(differs)[0])
    return None


def _parallel(inst) -> list:
    """Grid axes the interpreter splits over cores and shuffles: those marked `parallel`."""
    semantics = inst.variant.compiler_params.get("dimension_semantics") or []
    return [a for a, s in enumerate(semantics) if s == "parallel" and a < len(inst.grid)]


def _axis(inst, a: int) -> str:
    return inst.variant.grid[a].name or f"axis {a}"


def _steps(inst) -> int:
    """Grid points along the parallel axes: what the cores share out."""
    return math.prod(inst.grid[p] for p in _parallel(inst))


def _varied(inst, a: Schedule, b: Schedule) -> list:
    """What differs between two schedules that can change a kernel's result. The DMA mode
    matters only to a kernel that starts DMAs, which it waits for on DMA semaphores."""
    parallel = _parallel(inst)
    steps = _steps(inst)
    dmas = any(s.kind == ScratchKind.DMA_SEMAPHORE for s in inst.variant.scratch)
    out = []
    if a.dma != b.dma and dmas:
        out.append(f"DMA mode ({a.dma} vs {b.dma})")
    if a.cores != b.cores and steps > 1:
        out.append(f"cores ({a.cores} vs {b.cores})")
    if a.seed != b.seed and steps > 1:
        out.append(f"the order of parallel grid {', '.join(_axis(inst, p) for p in parallel)} (seeds {a.seed} vs {b.seed})")
    return out


def _closest_pair(inst, groups: list) -> tuple:
    """Two runs with different outputs whose schedules differ in as few ways as possible."""
    pairs = [(a, b) for g, h in itertools.combinations(groups, 2) for a in g for b in h]
    return min(pairs, key=lambda p: (len(_varied(inst, p[0].schedule, p[1].schedule)), p[0].schedule.number, p[1].schedule.number))


def _value(x) -> str:
    x = np.asarray(x)
    return f"{float(x):.6g}" if x.dtype.kind in "fV" else str(x)  # V: bfloat16 and float8 (ml_dtypes)


def _difference(inst, prefetch: dict, a: Run, b: Run) -> list:
    k, element = _first_difference(a, b)
    op = inst.spec.returned[k]  # the outputs the call returned: a residual output is not among them
    sa, sb = a.schedule, b.schedule
    va, vb = (_value(r.arrays[k][element]) for r in (a, b))
    head = (
        f"the outputs depend on the schedule: output {op.name} at {element} is {va} under schedule {sa.number} "
        f"({sa.label}) and {vb} under schedule {sb.number} ({sb.label})"
    )
    return [head, _writers(inst, prefetch, op.name, element, a, b)]


def _writers(inst, prefetch: dict, name: str, element: tuple, a: Run, b: Run) -> str:
    """Which grid points wrote the differing element, and the axes their order differs along."""
    block = inst.variant.blocks.get(name)
    combined = inst.spec.wrapper.outputs if inst.spec.wrapper is not None else ()  # the epilogue's inputs
    seqs = [] if combined else [_visits_writing(inst, prefetch, name, block, element, r) for r in (a, b)]
    if combined:
        kernel = ", ".join(o.name for o in combined)
        why = f"{name} is the epilogue's, computed from the kernel's outputs ({kernel}), so its writers are not known"
    elif block is not None and block.index_map is None and block.memory_space in (MemorySpace.ANY, MemorySpace.HBM):
        why = f"{name} is written by the kernel's own DMAs (memory_space {block.memory_space}), so its writers are not known"
    elif None in seqs or not seqs[0]:
        why = f"the block of {name} holding {element} could not be found from its index map"
    else:
        index = _block_index(inst, prefetch, block, seqs[0][0][0])
        points = list(dict.fromkeys(p for p, _ in seqs[0]))
        axes = [p for p in _parallel(inst) if len({q[p] for q in points}) > 1]
        where = f"block {index} of {name}"
        if axes and seqs[0] != seqs[1]:
            return (
                f"{where} is written by grid points {', '.join(map(str, points))}, which differ along parallel grid "
                f"{', '.join(_axis(inst, p) for p in axes)}; schedule {a.schedule.number} writes it in the order "
                f"{_order(seqs[0], a)}, schedule {b.schedule.number} in the order {_order(seqs[1], b)}"
            )
        if len(points) == 1:
            why = f"{where} is written only by grid point {points[0]}, so what differs is what it read"
        else:
            why = (f"{where} is written by grid points {', '.join(map(str, points))} in the same order under both "
                   "schedules, so what differs is what they read")
    parallel = [_axis(inst, p) for p in _parallel(inst) if inst.grid[p] > 1]
    axes = f"the parallel grid axes involved: {', '.join(parallel)}" if parallel else "the kernel has no parallel grid axis"
    varied = _varied(inst, a.schedule, b.schedule)
    differ = (f"differ only in {varied[0]}" if len(varied) == 1 else f"differ in {' and '.join(varied)}" if varied
              else "differ in nothing that should matter")
    return f"{why}; {axes}; the two schedules {differ}"


def _visits_writing(inst, prefetch: dict, name: str, block, element: tuple, r: Run) -> list | None:
    """The visits (point, core) of run r whose block of output `name` holds `element`, in order;
    None when the index map cannot be evaluated."""
    out = []
    for point, core in r.visits:
        index = _block_index(inst, prefetch, block, point)
        if index is None:
            return None
        if _covers(inst, name, block, index, element):
            out.append((point, core))
    return out


def _order(seq: list, r: Run) -> str:
    if r.schedule.cores == 1:
        return ", ".join(str(p) for p, _ in seq)
    return ", ".join(f"{p} (core {c})" for p, c in seq)


def _block_index(inst, prefetch: dict, block, point: tuple):
    """The block index the output's index map gives at a grid point, with the prefetched
    values bound to the map's ref arguments; () for an output written whole at every point."""
    if block is None or block.index_map is None:
        return ()
    args = block.index_map.args
    env = dict(inst.env, **prefetch)
    env.update(zip(args, point))
    env.update(zip(args[len(point):], prefetch.values()))
    try:
        return block.index_map.eval(env)
    except Exception:  # noqa: BLE001 - an unevaluable map: the analysis cannot tell
        return None


def _covers(inst, name: str, block, index: tuple, element: tuple) -> bool:
    if index == ():
        return True
    sizes = inst.block_shapes[name]
    for d, (i, e) in enumerate(zip(index, element)):
        kind = block.kind(d)
        if kind == SQUEEZED:
            inside = i == e
        elif kind == BLOCKED:
            inside = i * sizes[d] <= e < (i + 1) * sizes[d]
        elif kind == ELEMENT:
            inside = i <= e < i + sizes[d]
        elif kind == BOUNDED:
            inside = i.start <= e < i.start + i.size
        else:
            return False
        if not inside:
            return False
    return True


def _block_race(inst, prefetch: dict, r: Run) -> str | None:
    """Two grid points on different cores that write one output block."""
    for op in inst.spec.outputs:
        block = inst.variant.blocks.get(op.name)
        if block is None or block.index_map is None:
            continue
        owner: dict = {}
        for point, core in r.visits:
            index = _block_index(inst, prefetch, block, point)
            if index is None:
                break
            if index in owner and owner[index][1] != core:
                p0, c0 = owner[index]
                axes = [_axis(inst, a) for a in range(len(point)) if point[a] != p0[a]]
                return (
                    f"grid points {p0} (core {c0}) and {point} (core {core}) both write block {index} of "
                    f"output {op.name}; they differ along grid {', '.join(axes)}"
                )
            owner.setdefault(index, (point, core))
    return None


_REVISIT = re.compile(r"Revisited block .*? of output (\d+)")


def revisit(inst, prefetch: dict, error: BaseException, call, inputs: list, schedule: Schedule) -> str | None:
    """For a run that raised because a core came back to an output block after writing others
    (TPU interpret mode refuses that): which grid points did, from the visits it recorded.
    With several cores, how far the other core got when one raised varies from run to run, so
    the same order is replayed on one core, where the first revisit is always the same."""
    found = _REVISIT.search(str(error))
    if not found or int(found.group(1)) >= len(inst.spec.outputs):
        return None
    replayed = ""
    if schedule.cores > 1:
        with contextlib.suppress(Exception):
            run(call, inputs, dataclasses.replace(schedule, cores=1), inst)
        replayed = f" (found by replaying seed {schedule.seed}'s order on 1 core)"
    op = inst.spec.outputs[int(found.group(1))]
    block = inst.variant.blocks.get(op.name)
    last: dict = {}  # core -> the block index of its latest visit
    seen: dict = {}  # (core, block index) -> the latest point that wrote it
    for point, core in sorted(_visits, key=lambda v: v[1]):
        index = _block_index(inst, prefetch, block, point)
        if index is None:
            return None
        if core in last and last[core] != index and (core, index) in seen:
            p0 = seen[(core, index)]
            axes = [_axis(inst, a) for a in range(len(point)) if point[a] != p0[a]]
            return (
                f"the outputs depend on the schedule: grid points {p0} and {point} both write block {index} of output "
                f"{op.name}, and the same core writes block {last[core]} in between{replayed}; they differ along grid "
                f"{', '.join(axes)} (TPU interpret mode stops at such a revisit; on a TPU the later write-back "
                "replaces the earlier)"
            )
        seen[(core, index)] = point
        last[core] = index
    return None


_ACCESS = re.compile(r"^\s*(read|write) of \('(\w+)'.*\] from \d+, \d+,? (.+)$")


def _printed_race(printed: str) -> str:
    """The interpreter's report, condensed: the two accesses no wait or barrier orders."""
    lines = printed.strip().splitlines()
    found = [m for m in map(_ACCESS.match, lines[1:]) if m][:2]
    if len(found) < 2 or not lines[0].startswith("RACE DETECTED"):
        return "TPU interpret mode reports: " + " ".join(ln.strip() for ln in lines[:3])
    (k0, space, f0), (k1, _, f1) = (m.groups() for m in found)
    return f"a {k0} at {_frame(f0)} and a {k1} at {_frame(f1)} of one {space} buffer are not ordered by a wait"


def _frame(frame: str) -> str:
    """`/abs/generated/k/mosaic_tpu.py:30:4 (fn)` relative to the working directory; `pallas_call`
    (the pipeline's own block copies) as words."""
    if frame == "pallas_call":
        return "a block copy of the pipeline"
    path, _, rest = frame.partition(":")
    with contextlib.suppress(ValueError):
        path = os.path.relpath(path)
    return f"{path}:{rest}"
