"""verify's multi-core simulator (codegen/multicore.py): off a TPU, each mosaic_tpu task runs in
TPU interpret mode under several schedules (seed x DMA mode x cores). Planted kernels whose result
depends on the schedule fail, and the message names the schedules, the element, the block and the
grid axes involved."""

from __future__ import annotations

from conftest import declared
from test_verify import PLANTED, kspec, project, results

from kspec.codegen.run import multicore

# The shipped kernels pass under the default sweep in test_surface.test_shipped_surface_specs_verify_and_lower
# (gather_rows, accumulate, dma_copy, shift_diff) and in test_verify's slow test (every spec).
BUGS = ("scatter_rows", "scatter_revisit", "dma_read_before_wait", "carry_parallel")

SCHEDULES = [
    {"seed": 7, "dma_execution_mode": "on_wait", "cores": 2},
    {"seed": 272825159, "dma_execution_mode": "eager", "cores": 1},
    {"seed": 600058804, "dma_execution_mode": "eager", "cores": 2},
    {"seed": 1242225162, "dma_execution_mode": "on_wait", "cores": 1},
]

SCATTER_ROWS = """\
the outputs depend on the schedule: output o at (24, 0) is -1.32068 under schedule 2 (seed 272825159, eager DMAs, \
1 core) and -0.827395 under schedule 4 (seed 1242225162, on_wait DMAs, 1 core)
  block (3, 0) of o is written by grid points (4,), (3,), (0,), which differ along parallel grid i; schedule 2 \
writes it in the order (4,), (3,), (0,), schedule 4 in the order (0,), (3,), (4,)
  same outputs: schedules {2}, {4}; schedules 1, 3 ran two cores into a race, so their outputs are not compared
  data race under schedule 1 (seed 7, on_wait DMAs, 2 cores) (and under schedule 3): grid points (0,) (core 0) and \
(3,) (core 1) both write block (3, 0) of output o; they differ along grid i
  against the reference, schedule 2: output o: 1024 of 4096 elements outside tolerance; worst at (24, 59): \
got 2.54791, expected -2.91163"""

SCATTER_REVISIT = (
    "the outputs depend on the schedule: grid points (0,) and (1,) both write block (0, 0) of output o, and the same "
    "core writes block (3, 0) in between (found by replaying seed 7's order on 1 core); they differ along grid i "
    "(TPU interpret mode stops at such a revisit; on a TPU the later write-back replaces the earlier) "
    "[TPU interpret mode, schedule 1 of 4: seed 7, on_wait DMAs, 2 cores]"
)

DMA_READ_BEFORE_WAIT = """\
the outputs depend on the schedule: output o at (0, 0) is nan under schedule 1 (seed 7, on_wait DMAs, 2 cores) \
and 4.39115 under schedule 2 (seed 272825159, eager DMAs, 1 core)
  o is written by the kernel's own DMAs (memory_space any), so its writers are not known; the kernel has no \
parallel grid axis; the two schedules differ only in DMA mode (on_wait vs eager)
  same outputs: schedules {1, 4}, {2, 3}
  data race under schedule 1 (seed 7, on_wait DMAs, 2 cores) (and under schedules 2, 3, 4): a write at \
START (_dma_read_before_wait_kernel) and a read at READ (_dma_read_before_wait_kernel.<locals>.step) of one \
vmem buffer are not ordered by a wait
  against the reference, schedule 1: output o: 2048 element(s) are NaN/Inf where the reference is finite"""

CARRY_PARALLEL = """\
the outputs depend on the schedule: output o at (8, 0) is -1.60075 under schedule 1 (seed 7, on_wait DMAs, 2 cores) \
and nan under schedule 3 (seed 600058804, eager DMAs, 2 cores)
  block (1, 0) of o is written only by grid point (1,), so what differs is what it read; the parallel grid axes \
involved: i; the two schedules differ only in the order of parallel grid i (seeds 7 vs 600058804)
  same outputs: schedules {1}, {2}, {3}, {4}
  against the reference, schedule 1: output o: 5120 element(s) are NaN/Inf where the reference is finite"""


def test_schedules_cycle_through_dma_modes_and_core_counts_with_a_seed_each():
    plan = multicore.schedules(7, 6)
    assert [s.to_json() for s in plan[:4]] == SCHEDULES
    assert [(s.number, s.dma, s.cores) for s in plan[4:]] == [(5, "on_wait", 2), (6, "eager", 1)]
    assert len({s.seed for s in plan}) == 6
    assert multicore.schedules(7, 6) == plan
    assert plan[1].label == "seed 272825159, eager DMAs, 1 core"
    assert plan[2].label == "seed 600058804, eager DMAs, 2 cores"


def test_schedule_dependent_kernels_fail_naming_schedules_element_block_and_axes(tmp_path):
    proj = project(tmp_path, *(PLANTED / f"{k}.yaml" for k in BUGS))
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "--seed", "7", "--json", report, cwd=proj)
    assert rc == 1, out + err
    everything = results(report)
    rows = {r["kernel"]: r for r in declared(everything)}
    assert set(rows) == set(BUGS)
    assert all(r["schedules"] == SCHEDULES and r["status"] == "fail" for r in rows.values())
    assert rows["scatter_rows"]["message"] == SCATTER_ROWS
    assert rows["scatter_revisit"]["message"] == SCATTER_REVISIT
    # The race names the DMA's start (its write) and the early read by their place in the generated module.
    module = proj / "generated" / "dma_read_before_wait" / "mosaic_tpu.py"
    expected = DMA_READ_BEFORE_WAIT.replace("START", _place(module, "copy_in(0, 0).start()"))
    assert rows["dma_read_before_wait"]["message"] == expected.replace("READ", _place(module, "buf_ref[slot] * 2.0"))
    assert rows["carry_parallel"]["message"] == CARRY_PARALLEL
    passed = sum(r["status"] == "pass" for r in everything)  # derived shapes run one schedule, and may pass
    assert f"{passed} passed, {len(everything) - passed} failed, 0 errors, 0 skipped" in out


def _place(path, text: str) -> str:
    """`generated/<kernel>/<file>:line:col` of the first occurrence of text, as the race report shows it."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return f"generated/{path.parent.name}/{path.name}:{n}:{line.index(text)}"
    raise AssertionError(f"{text!r} not in {path}")
