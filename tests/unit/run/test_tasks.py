"""run/tasks.py: the records the kspec process and its workers exchange. A task is one record per
kind of work, built by name; a result is built and replaced, never changed, and its JSON row keeps
the fields docs/verify.md documents, in their order, with the status as a plain string."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kspec.codegen.run import tasks
from kspec.codegen.run.tasks import RunTask, Status, Task

TASK = RunTask(spec_path="specs/tiny.yaml", kernel="tiny", backend="interpret", case="c", case_index=0,
               dtypes=(("x", "float32"),), dtype_label="float32", seed=5, out_root="generated")
ROW_FIELDS = ["kernel", "backend", "case", "dtype", "mode", "seed", "status", "max_abs_err", "max_rel_err", "rel_err",
              "frac_within_tol", "tolerance", "seconds", "message"]


def test_a_task_is_built_by_name_as_one_of_its_kinds_each_with_its_own_fields():
    common = {f.name: getattr(TASK, f.name) for f in dataclasses.fields(Task)}
    with pytest.raises(TypeError):
        RunTask("specs/tiny.yaml", "tiny", "interpret", "c", 0, (), "float32", 5, "generated")
    with pytest.raises(TypeError, match="Task is the fields every task has; build one of its kinds"):
        Task(**common)
    with pytest.raises(TypeError, match="unexpected keyword argument 'samples'"):  # a bench field
        RunTask(**common, samples=3)
    kinds_ = [TASK, tasks.LowerTask(**common), tasks.GradTask(**common), tasks.LowerTask(**common, grad=True),
              tasks.BenchTask(**common, samples=3), tasks.ShardedTask(**common, devices=2),
              tasks.ShardedTask(**common, devices=2, lower=True), tasks.TuneTask(**common, configs=(), samples=3),
              tasks.CeilingsTask()]
    assert tuple(t.mode for t in kinds_) == tasks.MODES
    assert [t.label for t in kinds_[:4]] == ["tiny[interpret] c float32", "tiny[interpret] c float32",
                                             "tiny[interpret] c float32 (grad)", "tiny[interpret] c float32 (grad)"]
    assert tasks.BenchTask(**common, samples=3, grad=True).label.endswith(" (grad)")


def test_a_results_row_holds_the_documented_fields_in_order_then_its_kinds_own():
    row = tasks.result(TASK, Status.SKIP, "why").to_json()
    assert list(row) == ROW_FIELDS and row["status"] == "skip" and type(row["status"]) is str
    assert (row["mode"], row["dtype"], row["message"]) == ("run", "float32", "why")
    assert json.loads(json.dumps(row)) == row


def test_a_result_is_replaced_not_changed_and_a_field_it_holds_keeps_its_place():
    first = tasks.result(TASK, "pass", seconds=1.5, schedules=[1])
    second = first.updated(status=Status.FAIL, message="m", inputs=["normal"], schedules=[2])
    assert first.status is Status.PASS and first.passed and first.extra == {"schedules": [1]}
    assert second.status is Status.FAIL and not second.passed
    assert list(second.to_json()) == ROW_FIELDS + ["schedules", "inputs"]
    assert second.to_json()["schedules"] == [2] and second.seconds == 1.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = Status.FAIL  # type: ignore[misc]
    with pytest.raises(ValueError, match="'passed' is not a valid Status"):
        first.updated(status="passed")


def test_a_status_is_its_json_string():
    assert tasks.STATUSES == ("pass", "fail", "error", "skip")
    assert [f"{s:5}|" for s in Status] == ["pass |", "fail |", "error|", "skip |"]
    assert Status("error") is Status.ERROR and Status.ERROR == "error" and str(Status.SKIP) == "skip"
