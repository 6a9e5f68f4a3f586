"""The task protocol between the `kspec` process and its workers: what a task asks for, and the
result row it answers with (the JSON fields docs/verify.md documents). Both sides import this
module; neither imports the other.

A task is one frozen record per kind of work, each carrying only its own fields on top of the
fields every task has (`Task`); the worker dispatches on its type. Its `mode` is the name result
rows report (MODES). A task is answered with a `Result` (a tune task: one per config, then DONE),
whose `to_json()` is the row the reports write.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

# mosaic_tpu off a TPU runs in TPU interpret mode under this many schedules per task
# (seed x DMA mode x cores; codegen/run/multicore.py): the four combinations of DMA mode and cores.
DEFAULT_SCHEDULES = 4


MODES = ("run", "lower", "grad", "lower-grad", "bench", "sharded", "lower-sharded", "tune", "ceilings")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """What every task has: which kernel, backend, case and dtypes, and the seed of its inputs.
    Not built itself: each kind of work is a subclass."""

    spec_path: str
    kernel: str
    backend: str
    case: str
    case_index: int
    dtypes: tuple  # ((operand, dtype), ...), inputs first
    dtype_label: str  # the inputs' dtypes, for reports
    seed: int
    out_root: str
    suite: str = "cases"  # which list case_index points into: "cases", "bench" or "sweep"
    case_dims: tuple = ()  # a derived case: ((dim, size), ...) replacing the dims of case_index's case

    def __post_init__(self):
        if type(self) is Task:
            raise TypeError("Task is the fields every task has; build one of its kinds (RunTask, BenchTask, ...)")

    @property
    def mode(self) -> str:
        """The name result rows report for this kind of task (one of MODES)."""
        raise NotImplementedError

    @property
    def backward(self) -> bool:
        """Whether the task runs the backward pass (jax.vjp) too."""
        return False

    @property
    def label(self) -> str:
        grad = " (grad)" if self.backward else ""
        return f"{self.kernel}[{self.backend}] {self.case} {self.dtype_label}{grad}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Named(Task):
    """A kind of task whose mode is fixed (its `kind`)."""

    kind: ClassVar[str]

    @property
    def mode(self) -> str:
        return self.kind


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunTask(_Named):
    """Run the kernel against the reference (`kspec verify`)."""

    kind: ClassVar[str] = "run"
    schedules: int = DEFAULT_SCHEDULES  # mosaic_tpu in TPU interpret mode: schedules to run
    inputs: tuple = ("normal",)  # the input kinds to run the kernel on, in order (codegen/run/kinds.py)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradTask(_Named):
    """Run the kernel's jax.custom_vjp against jax.vjp of the reference (`kspec verify`, a spec with `vjp:`)."""

    kind: ClassVar[str] = "grad"

    @property
    def backward(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class LowerTask(Task):
    """Lower the kernel for its backend's platform (`kspec verify --lower`); with `grad`, its
    forward and backward pass together."""

    grad: bool = False

    @property
    def mode(self) -> str:
        return "lower-grad" if self.grad else "lower"

    @property
    def backward(self) -> bool:
        return self.grad


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardedTask(Task):
    """The spec's sharded function on a mesh of `devices` devices against the reference (`kspec
    verify --devices N`); with `lower`, lowered on that mesh instead (`--lower --devices N`)."""

    devices: int
    lower: bool = False

    @property
    def mode(self) -> str:
        return "lower-sharded" if self.lower else "sharded"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchTask(_Named):
    """Time the kernel against the reference and the spec's competitors (`kspec bench`)."""

    kind: ClassVar[str] = "bench"
    samples: int  # timed samples
    ceilings: tuple = ()  # measured (bandwidth GB/s, bf16 TFLOP/s) to use as the roofline
    grad: bool = False  # time the forward and backward pass (jax.vjp) instead of the forward
    grad_kernels: bool = False  # with grad: the backward kernels even where auto differentiates the reference

    @property
    def backward(self) -> bool:
        return self.grad


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneTask(_Named):
    """Compile, verify and time each of `configs` (`kspec tune`): answered with one row per config."""

    kind: ClassVar[str] = "tune"
    configs: tuple  # each ((param, value), ...)
    samples: int  # timed samples per config
    sustained: bool = False  # time each config in alternation with the reference, under load


@dataclasses.dataclass(frozen=True, kw_only=True)
class CeilingsTask(_Named):
    """Measure copy bandwidth and bf16 matmul throughput (`kspec bench --measure-ceilings`): no
    kernel, so the fields every task has are blank."""

    kind: ClassVar[str] = "ceilings"
    spec_path: str = ""
    kernel: str = "ceilings"
    backend: str = ""
    case: str = ""
    case_index: int = 0
    dtypes: tuple = ()
    dtype_label: str = ""
    seed: int = 0
    out_root: str = ""


class Status(str, enum.Enum):
    """A result's status; its value is the string the JSON row holds."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STATUSES = tuple(s.value for s in Status)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    """The answer to a task: the fields every result row has (docs/verify.md), in the row's order,
    then `extra`, the fields of its kind of task (a run's `inputs`, a bench row's figures, a tune
    row's `params`, ...) in the order they were added. Built once and replaced (`updated`), never
    changed; `to_json()` is the row."""

    kernel: str
    backend: str
    case: str
    dtype: str
    mode: str
    seed: int
    status: Status
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_err: float | None = None
    frac_within_tol: float | None = None
    tolerance: dict | None = None  # {"atol", "rtol", "rel_err"}: dtypes.tolerance's table
    seconds: float | None = None
    message: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "status", Status(self.status))

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def updated(self, **fields) -> Result:
        """This result with `fields` replaced: the row's own fields by name, any other into `extra`
        (a field it holds keeps its place, a new one goes last)."""
        own = {k: v for k, v in fields.items() if k in _FIELDS}
        more = {k: v for k, v in fields.items() if k not in _FIELDS}
        return dataclasses.replace(self, **own, extra={**self.extra, **more} if more else self.extra)

    def to_json(self) -> dict:
        """The result row, as the JSON reports write it."""
        row = {name: getattr(self, name) for name in _FIELDS}
        row["status"] = self.status.value
        return {**row, **self.extra}


_FIELDS = tuple(f.name for f in dataclasses.fields(Result) if f.name != "extra")


DONE = {"done": True}  # what a worker sends after the last result of a task that answers with several (tune)


def result(task: Task, status: Status | str, message: str = "", **fields) -> Result:
    """The result of `task`: its fields, `status` and `message`, and `fields` (as Result.updated)."""
    out = Result(kernel=task.kernel, backend=task.backend, case=task.case, dtype=task.dtype_label, mode=task.mode,
                 seed=task.seed, status=status, message=message)
    return out.updated(**fields) if fields else out
