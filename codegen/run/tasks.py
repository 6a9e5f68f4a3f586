"""The task protocol between the `kspec` process and its workers: what a task asks for, and the
result row it answers with (the JSON fields docs/verify.md documents). Both sides import this
module; neither imports the other.
"""

from __future__ import annotations

import dataclasses

STATUSES = ("pass", "fail", "error", "skip")
# mosaic_tpu off a TPU runs in TPU interpret mode under this many schedules per task
# (seed x DMA mode x cores; codegen/run/multicore.py): the four combinations of DMA mode and cores.
DEFAULT_SCHEDULES = 4


MODES = ("run", "lower", "grad", "lower-grad", "bench", "sharded", "lower-sharded", "tune", "ceilings")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One unit of work for a worker. Built by name only: the fields after `mode` belong to
    some modes (`suite`, `samples`, `ceilings`, `grad`: bench; `configs`, `sustained`: tune;
    `devices`: the sharded modes; `schedules`, `inputs`: run), and the others leave them at
    their defaults."""

    spec_path: str
    kernel: str
    backend: str
    case: str
    case_index: int
    dtypes: tuple  # ((operand, dtype), ...), inputs first
    dtype_label: str  # the inputs' dtypes, for reports
    seed: int
    mode: str  # one of MODES
    out_root: str
    suite: str = "cases"  # which list case_index points into: "cases" or "bench"
    params: tuple = ()  # ((param, value), ...) overriding the case's params (tune)
    samples: int = 0  # bench: timed samples
    ceilings: tuple = ()  # bench: measured (bandwidth GB/s, bf16 TFLOP/s) to use as the roofline
    configs: tuple = ()  # tune: the configs to compile, verify and time, each ((param, value), ...)
    devices: int = 0  # sharded, lower-sharded: the mesh is built from this many devices
    schedules: int = DEFAULT_SCHEDULES  # run, mosaic_tpu in TPU interpret mode: schedules to run
    sustained: bool = False  # tune: time each config in alternation with the reference, under load
    inputs: tuple = ("normal",)  # run: the input kinds to run the kernel on, in order (codegen/run/kinds.py)
    grad: bool = False  # bench: time the forward and backward pass (jax.vjp) instead of the forward
    case_dims: tuple = ()  # a derived case: ((dim, size), ...) replacing the dims of case_index's case


    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown task mode {self.mode!r}; known: {', '.join(MODES)}")

    @property
    def label(self) -> str:
        grad = " (grad)" if self.mode in ("grad", "lower-grad") or self.grad else ""
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
