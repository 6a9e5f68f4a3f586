"""tune/case.py on a tiny spec with a family whose shapes share buckets: trials are recorded per
case, the summary speaks of the case and of its bucket, grad measurements are per case, and a
sweep's jobs take every bucket once before any twice. Workers are stand-ins: nothing is timed."""

from __future__ import annotations

from kspec.codegen.run.tasks import Result
from kspec.codegen.tune.case import CaseJob, first_shapes_first, tune_case, tune_grad, _bucket_line
from kspec.codegen.tune.store import Store
from conftest import VALID_SPEC, build_spec, mutate

# Buckets of N: 600, 640, 768 and 1024 round up to 1024; 5120 and 8192 to 8192. bs=24 divides neither 640 nor 1024.
SPEC = mutate(VALID_SPEC, ("  bs: 8\n", "  bs: {default: 8, choices: [8, 16, 24, 32]}\n")) + """\
constraints:
  - {expr: "N % bs == 0", message: "N must be a multiple of bs"}
families:
  widths:
    dims:
      N: [600, 640, 768, 1024, 4096, 5120, 8192]
"""


def jobs(spec) -> dict:
    """{case name: CaseJob} of the spec's sweep, float32, interpret mode."""
    variant = spec.variants["interpret"]
    return {c.name: CaseJob(spec, variant, i, c, {"x": "float32", "o": "float32"}, "sweep", "generated", "cpu", "0")
            for i, c in enumerate(spec.sweep)}


def test_a_sweep_takes_every_bucket_at_one_shape_before_any_at_a_second():
    spec = build_spec(SPEC)
    order = list(jobs(spec).values())
    assert [j.case.name for j in first_shapes_first(order)] == [
        "widths_N600", "widths_N4096", "widths_N5120", "widths_N640", "widths_N8192", "widths_N768", "widths_N1024"]
    # Items that hold a job: the order of the jobs, the items as they were.
    items = [(j, n) for n, j in enumerate(order)]
    assert [n for _, n in first_shapes_first(items, lambda item: item[0])] == [0, 4, 5, 1, 6, 2, 3]
    # Another dtype or backend is another table: its first shape is a first shape.
    other = [CaseJob(spec, j.variant, j.index, j.case, {"x": "bfloat16", "o": "bfloat16"}, "sweep", "generated",
                     "cpu", "0") for j in order[:2]]
    assert [(j.case.name, j.label) for j in first_shapes_first(order[:2] + other)] == [
        ("widths_N600", "float32"), ("widths_N600", "bfloat16"), ("widths_N640", "float32"), ("widths_N640", "bfloat16")]


def row(task, mode: str, **figures) -> Result:
    """A passing result row for `task`, with its figures."""
    return Result(kernel=task.kernel, backend=task.backend, case=task.case, dtype=task.dtype_label, mode=mode,
                  seed=0, status="pass", extra=figures)


MS = {("widths_N640", 8): 1.0, ("widths_N640", 16): 1.1, ("widths_N640", 32): 2.0,
      ("widths_N1024", 8): 1.5, ("widths_N1024", 16): 1.2, ("widths_N1024", 32): 1.0}
batches: list = []  # (case, configs) of each tune task `run` answered


def run(task, started, planned):
    """A worker's answer to a tune task: every config passes, in the time MS gives it."""
    batches.append((task.case, sorted(dict(c)["bs"] for c in task.configs)))
    for cfg in task.configs:
        bs = dict(cfg)["bs"]
        yield row(task, "tune", params={"bs": bs}, ms=MS[(task.case, bs)])


def test_another_case_of_a_recorded_bucket_is_tuned_and_reported_with_its_bucket(tmp_path):
    """N 640 and N 1024 share bucket 1024: the second is tuned whole (each config a new trial), its
    pruned config is recorded again for it, and the summary gives its own fastest config, then the
    one embedded for the bucket: bs=16, at most 1.2x the fastest time at either case (bs=8 is 1.5x
    at N 1024, bs=32 2x at N 640)."""
    spec, said = build_spec(SPEC), []
    todo = jobs(spec)
    store = Store(tmp_path, spec.name, "cpu")
    batches.clear()
    assert tune_case(todo["widths_N640"], store, store.done(), run, said.append) is False
    assert said[-1].startswith("  best {'bs': 8}: 1.000 ms, 1.00x the default's 1.000 ms -> ")  # no bucket line
    assert tune_case(todo["widths_N1024"], store, store.done(), run, said.append) is False
    assert batches == [("widths_N640", [8, 16, 32]), ("widths_N1024", [8, 16, 32])]
    assert [(e["case"], e["params"]["bs"]) for e in store.entries if e["status"] == "pruned"] == [
        ("widths_N640", 24), ("widths_N1024", 24)]
    assert said[-2].startswith("  best {'bs': 32}: 1.000 ms, 1.50x the default's 1.500 ms -> ")
    assert said[-1] == "  bucket [1024] over 2 cases: {'bs': 16}, within 1.20x of the fastest config at each"
    again = Store(tmp_path, spec.name, "cpu")  # a rerun finds both cases recorded
    assert tune_case(todo["widths_N1024"], again, again.done(), run, said.append) is False and len(batches) == 2


def test_the_bucket_line_of_sustained_trials_gives_the_worst_speedup():
    spec = build_spec(SPEC)
    base = jobs(spec)["widths_N640"].base()
    base.update(load="sustained", reference_sha="r")

    def trial(case, bs, speedup):
        return dict(base, case=case, params={"bs": bs}, status="pass", ms=1.0, speedup=speedup)

    bucket = [trial("widths_N640", 8, 1.2), trial("widths_N1024", 8, 0.88),
              trial("widths_N640", 16, 1.1), trial("widths_N1024", 16, 1.02), trial("widths_N640", 32, 1.5)]
    assert _bucket_line(base, bucket, spec.kernel_sha) == (
        "  bucket [1024] over 2 cases: {'bs': 16}, 1.020x the reference at worst (widths_N1024)")
    # No config at both cases: the best of those at one.
    assert _bucket_line(base, [bucket[0], bucket[3]], spec.kernel_sha) == (
        "  bucket [1024] over 2 cases: {'bs': 8} (timed at 1), 1.200x the reference at worst (widths_N640)")


def test_a_grad_measurement_is_recorded_per_case(tmp_path):
    """A grad entry at N 640 does not stand for N 1024, of the same bucket: that one is measured;
    N 640 again is not."""
    spec, said, tasks = build_spec(SPEC), [], []
    todo = jobs(spec)
    store = Store(tmp_path, spec.name, "cpu")

    def bench(task):
        tasks.append(task.case)
        return row(task, "bench", params={"bs": 8}, ms=1.0, ref_ms=0.9, speedup=0.9, speedup_ci95=[0.8, 1.0])

    assert tune_grad(todo["widths_N640"], store, "9" * 64, bench, said.append) is False
    assert tune_grad(todo["widths_N1024"], store, "9" * 64, bench, said.append) is False
    assert tune_grad(todo["widths_N640"], store, "9" * 64, bench, said.append) is False
    assert tasks == ["widths_N640", "widths_N1024"]
    assert said[-1] == "tiny[interpret] widths_N640 float32: recorded already (0.900x the reference's autodiff)"
    assert [(e["case"], e["bucket"]) for e in store.entries] == [("widths_N640", [1024]), ("widths_N1024", [1024])]


def test_a_grad_measurement_faster_but_too_noisy_is_measured_again(tmp_path):
    """1.16x with an interval reaching down to 0.71x does not count as faster: a rerun measures that
    case again (and again, while it stays so noisy); a slower one, or a faster one the interval bears
    out, is recorded once."""
    spec, said, tasks = build_spec(SPEC), [], []
    todo = jobs(spec)
    store = Store(tmp_path, spec.name, "cpu")
    figures = iter([(1.16, [0.71, 5.29]), (1.12, [1.05, 1.20]), (0.80, [0.70, 0.85])])

    def bench(task):
        tasks.append(task.case)
        speedup, ci = next(figures)
        return row(task, "bench", params={"bs": 8}, ms=1.0, ref_ms=speedup, speedup=speedup, speedup_ci95=ci)

    assert tune_grad(todo["widths_N640"], store, "9" * 64, bench, said.append) is False
    assert said[-1] == ("tiny[interpret] widths_N640 float32: forward and backward 1.160x the reference's autodiff "
                        "(0.710-5.290); auto will differentiate the reference here")
    assert tune_grad(todo["widths_N640"], store, "9" * 64, bench, said.append) is False
    assert said[-2] == "tiny[interpret] widths_N640 float32: measured again: 1.160x the reference's autodiff, but 0.710-5.290"
    assert tune_grad(todo["widths_N640"], store, "9" * 64, bench, said.append) is False
    assert said[-1] == "tiny[interpret] widths_N640 float32: recorded already (1.120x the reference's autodiff)"
    assert tune_grad(todo["widths_N1024"], store, "9" * 64, bench, said.append) is False
    assert tune_grad(todo["widths_N1024"], store, "9" * 64, bench, said.append) is False
    assert tasks == ["widths_N640", "widths_N640", "widths_N1024"]
