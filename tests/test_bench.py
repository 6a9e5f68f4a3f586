"""`kspec bench`: a timed row's figures hang together, and memory-bound rows carry a copy of
as many bytes timed in the same rounds (the ceiling they are judged against). The statistics
behind the figures: tests/unit/run/test_timing.py; the table's rows: tests/unit/bench/test_report.py."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import jax
import pytest
from test_verify import ROOT, ROW_FIELDS, kspec, project


def test_bench_row_times_kernel_reference_and_copy_in_one_run(tmp_path):
    spec = (ROOT / "specs" / "add.yaml").read_text()
    head, _, tail = spec.partition("bench:\n")
    tail = tail.split("backends:", 1)[1]
    small = tmp_path / "src" / "add.yaml"
    small.parent.mkdir()
    small.write_text(head + "bench:\n  - {name: small, M: 64, N: 256, dtype: float32}\nbackends:" + tail)
    (tmp_path / "p").mkdir()
    root = project(tmp_path / "p", small)
    report, md = tmp_path / "b.json", tmp_path / "b.md"
    rc, out, err = kspec("bench", "--backend", "interpret", "--samples", "3", "--seed", "3",
                         "--json", report, "--markdown", md, cwd=root)
    assert rc == 0, out + err
    (row,) = json.loads(report.read_text())["results"]
    assert row["status"] == "pass" and row["case"] == "small" and row["samples"] == 3
    # Every result row's fields, then the figures docs/bench.md documents, in the order the reports write them
    assert tuple(row) == (*ROW_FIELDS, "ms", "ms_p10", "ms_p90", "ref_ms", "ref_ms_p10", "ref_ms_p90", "speedup",
                          "speedup_ci95", "speedup_of_medians", "compile_s", "ref_compile_s", "samples",
                          "input_copies", "calls_per_executable", "flops", "transcendentals", "bytes", "input_bytes", "tflops", "ref_tflops", "gbs", "ref_gbs",
                          "grad", "device", "roofline_pct", "ref_roofline_pct", "bound", "copy_ms", "copy_gbs",
                          "copy_pct", "ref_copy_pct", "params", "competitors", "samples_ms")
    assert row["bytes"] == 3 * 64 * 256 * 4
    # Every sample is in the report; the figures are medians of them, the ratios taken round by round.
    raw = row["samples_ms"]
    assert sorted(raw) == ["copy", "kernel", "reference"] and all(len(v) == 3 for v in raw.values())
    assert row["ms"] == pytest.approx(statistics.median(raw["kernel"]))
    assert row["ref_ms"] == pytest.approx(statistics.median(raw["reference"]))
    ratios = sorted(r / k for r, k in zip(raw["reference"], raw["kernel"]))
    assert row["speedup"] == pytest.approx(ratios[1])
    assert row["speedup_ci95"] == pytest.approx([ratios[0], ratios[2]])  # 3 rounds: the whole range
    assert row["speedup_of_medians"] == pytest.approx(row["ref_ms"] / row["ms"])
    # No peaks for a CPU, so the copy is measured: its time over the kernel's and over the reference's.
    assert row["bound"] is None and row["copy_ms"] > 0
    assert row["copy_pct"] == pytest.approx(100 * statistics.median(c / k for c, k in zip(raw["copy"], raw["kernel"])))
    assert row["ref_copy_pct"] == pytest.approx(
        100 * statistics.median(c / r for c, r in zip(raw["copy"], raw["reference"])))
    assert row["copy_gbs"] == pytest.approx(row["bytes"] / (row["copy_ms"] / 1e3) / 1e9)
    header = next(line for line in md.read_text().splitlines() if line.startswith("| kernel"))
    assert "| XLA % roofline | % of copy | compile s |" in header
    line = next(line for line in md.read_text().splitlines() if line.startswith("| add | interpret | small"))
    assert f"| {row['copy_pct']:.0f} |" in line
    ci = row["speedup_ci95"]
    assert f"| {row['speedup']:.3f}x ({ci[0]:.3f}-{ci[1]:.3f}) |" in line


def add_project(tmp_path: Path, bench: str, competitors: str = "") -> Path:
    """A project holding specs/add.yaml with these bench cases (and competitors), generated."""
    spec = (ROOT / "specs" / "add.yaml").read_text()
    head, _, tail = spec.partition("bench:\n")
    head = head.replace("reference: |\n  return x + y\n", "reference: |\n  return x + y\n" + competitors)
    src = tmp_path / "src" / "add.yaml"
    src.parent.mkdir()
    src.write_text(head + "bench:\n" + bench + "backends:" + tail.split("backends:", 1)[1])
    (tmp_path / "p").mkdir()
    return project(tmp_path / "p", src)


def test_min_speedup_fails_a_case_whose_whole_interval_is_below_it(tmp_path):
    # Interpret mode on a CPU runs far slower than XLA: a floor of 1000x cannot be met, one of 1e-6 is.
    # A mapping holds a floor per device kind (its start): the first key that matches decides.
    root = add_project(tmp_path, (
        "  - {name: floor_high, M: 64, N: 256, dtype: float32, min_speedup: 1000}\n"
        "  - {name: floor_low, M: 64, N: 256, dtype: float32, min_speedup: 1.0e-6}\n"
        "  - {name: elsewhere, M: 64, N: 256, dtype: float32, min_speedup: {NVIDIA H200: 1000}}\n"
        "  - {name: here, M: 64, N: 256, dtype: float32, min_speedup: {NVIDIA H200: 1.0e-6, cp: 1000}}\n"))
    report = tmp_path / "b.json"
    rc, out, err = kspec("bench", "--backend", "interpret", "--samples", "3", "--seed", "3", "--json", report, cwd=root)
    assert rc == 1, out + err
    rows = {r["case"]: r for r in json.loads(report.read_text())["results"]}
    high, low = rows["floor_high"], rows["floor_low"]
    assert high["status"] == "fail" and high["min_speedup"] == 1000 and high["ms"] > 0
    lo, hi = high["speedup_ci95"]
    assert high["message"] == (f"too slow: speedup {high['speedup']:.3f}x ({lo:.3f}-{hi:.3f}) is below the "
                               "case's min_speedup 1000")
    assert f"add[interpret] floor_high float32: {high['message']}" in out
    assert f"| {high['speedup']:.3f}x ({lo:.3f}-{hi:.3f}) < min 1000 |" in out
    assert low["status"] == "pass" and low["min_speedup"] == 1e-6
    assert "| floor_low | float32 |" in out and ">= min 1e-06 |" in out
    assert rows["elsewhere"]["status"] == "pass" and "min_speedup" not in rows["elsewhere"]
    assert rows["here"]["status"] == "fail" and rows["here"]["min_speedup"] == 1000
    assert "2 passed, 2 failed, 0 errors, 0 skipped" in out


def test_competitors_are_checked_timed_beside_the_kernel_and_held_to_their_floors(tmp_path):
    # An add spec with four competitors: XLA's own add (timed), one for GPUs only (skipped on the CPU), one that
    # computes something else (not timed: wrong), and one that raises. Interpret mode is far slower than XLA:
    # a floor of 1000x over `xla` fails, one of 1e-6 holds, and a floor over the wrong one fails.
    root = add_project(tmp_path, (
        "  - {name: holds, M: 64, N: 256, dtype: float32, min_speedup_over: {xla: 1.0e-6}}\n"
        "  - {name: slow, M: 64, N: 256, dtype: float32, min_speedup_over: {xla: {cp: 1000}}}\n"
        "  - {name: against_wrong, M: 64, N: 256, dtype: float32, min_speedup_over: {wrong: 1.0e-6}}\n"), (
        "competitors:\n"
        "  xla: {doc: XLA's add., body: 'return jnp.add(x, y)'}\n"
        "  gpu_only: {platforms: [gpu], body: return x + y}\n"
        "  wrong: {body: return x - y}\n"
        "  broken: {body: return x @ y}\n"
        "  missing: {requires: [jax.experimental.no_such_module], body: return x + y}\n"))
    reference = (root / "generated" / "add" / "reference.py").read_text()
    assert "def add_xla(x, y, *, bm=8, bn=128):" in reference and "    return jnp.add(x, y)\n" in reference
    assert "\"gpu_only\": (add_gpu_only, ('gpu',))," in reference
    assert "COMPETITOR_REQUIRES = {\n    \"missing\": ('jax.experimental.no_such_module',),\n}\n" in reference
    report = tmp_path / "b.json"
    rc, out, err = kspec("bench", "--backend", "interpret", "--samples", "3", "--seed", "3", "--json", report, cwd=root)
    assert rc == 1, out + err
    rows = {r["case"]: r for r in json.loads(report.read_text())["results"]}
    holds, slow, against_wrong = rows["holds"], rows["slow"], rows["against_wrong"]
    xla = holds["competitors"]["xla"]
    assert holds["status"] == "pass" and xla["status"] == "pass" and xla["min_speedup"] == 1e-6
    lo, hi = xla["speedup_ci95"]
    assert lo <= xla["speedup"] <= hi and xla["ms"] > 0 and len(holds["samples_ms"]["competitor:xla"]) == 3
    assert holds["competitors"]["gpu_only"] == {"status": "skip", "message": "runs on gpu, not on cpu"}
    assert holds["competitors"]["missing"] == {
        "status": "skip", "message": f"needs jax.experimental.no_such_module, which jax {jax.__version__} does not have"}
    assert holds["competitors"]["wrong"]["status"] == "fail"
    assert holds["competitors"]["wrong"]["message"].startswith("not timed, wrong result: ")
    assert holds["competitors"]["broken"]["status"] == "error"
    assert holds["competitors"]["broken"]["message"].startswith("TypeError: ")
    assert f"| xla {xla['speedup']:.3f}x ({lo:.3f}-{hi:.3f}) >= min 1e-06; wrong: fail; broken: error |" in out
    s = slow["competitors"]["xla"]
    lo, hi = s["speedup_ci95"]
    assert slow["status"] == "fail" and slow["message"] == (
        f"too slow: speedup over `xla` {s['speedup']:.3f}x ({lo:.3f}-{hi:.3f}) is below the case's "
        "min_speedup_over xla 1000")
    assert f"| xla {s['speedup']:.3f}x ({lo:.3f}-{hi:.3f}) < min 1000; wrong: fail; broken: error |" in out
    assert against_wrong["status"] == "fail"
    assert against_wrong["message"].startswith(
        "no speedup over `wrong` to hold to its floor 1e-06: not timed, wrong result: ")
    assert "1 passed, 2 failed, 0 errors, 0 skipped" in out


def test_min_speedup_over_must_name_a_competitor(tmp_path):
    spec = (ROOT / "specs" / "add.yaml").read_text()
    bad = tmp_path / "specs" / "add.yaml"
    bad.parent.mkdir()
    bad.write_text(spec.replace("reference: |\n  return x + y\n",
                                "reference: |\n  return x + y\ncompetitors:\n  xla: {body: return x + y}\n")
                   .replace("  - {name: b64MiB, M: 4096, N: 4096, dtype: float32}",
                            "  - {name: b64MiB, M: 4096, N: 4096, dtype: float32, min_speedup_over: {xl: 1.1}}"))
    rc, out, err = kspec("check", bad)
    assert rc == 2
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "min_speedup_over" in t)
    col = bad.read_text().splitlines()[line - 1].index("xl:") + 1
    assert (f"{bad}:{line}:{col}: error[E509]: case `b64MiB`: min_speedup_over names `xl`, which is not a "
            "competitor (competitors: xla)") in out + err
    assert "did you mean `xla`?" in out + err
    # A competitor's body is parsed, never run, by check, and held to the generated modules' import rule.
    bad.write_text(spec.replace("reference: |\n  return x + y\n",
                                "reference: |\n  return x + y\ncompetitors:\n  t:\n    body: |\n"
                                "      import torch\n      return torch.add(x, y)\n"))
    rc, out, err = kspec("check", bad)
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "import torch" in t)
    assert rc == 2 and f"{bad}:{line}:7: error[E601]: competitor `t`: import of `torch`" in out + err
    # `requires` names modules of jax or numpy only: bench looks them up, and the body imports nothing else.
    bad.write_text(spec.replace("reference: |\n  return x + y\n",
                                "reference: |\n  return x + y\ncompetitors:\n  t: {requires: [torch], body: return x + y}\n"))
    rc, out, err = kspec("check", bad)
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "requires" in t)
    assert rc == 2 and (f"{bad}:{line}:18: error[E200]: competitors.t.requires.0 must be a module of jax, jaxlib or "
                        "numpy, e.g. jax.experimental.pallas.ops.gpu.attention_mgpu") in out + err
    # Its function is `<kernel>_<name>`, beside `<kernel>_reference`.
    bad.write_text(spec.replace("reference: |\n  return x + y\n",
                                "reference: |\n  return x + y\ncompetitors:\n  reference: {body: return x + y}\n"))
    rc, out, err = kspec("check", bad)
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if t.startswith("  reference:"))
    assert rc == 2 and (f"{bad}:{line}:3: error[E400]: competitor `reference` would be generated as "
                        "`add_reference`, the reference's own name") in out + err


def test_min_speedup_is_a_positive_number(tmp_path):
    spec = (ROOT / "specs" / "add.yaml").read_text()
    head, _, tail = spec.partition("bench:\n")
    bad = tmp_path / "specs" / "add.yaml"
    bad.parent.mkdir()
    bad.write_text(head + "bench:\n  - {name: b, M: 64, N: 256, min_speedup: 0}\nbackends:" + tail.split("backends:", 1)[1])
    rc, out, err = kspec("check", "specs/add.yaml", cwd=tmp_path)
    assert rc == 2
    row = bad.read_text().splitlines().index("  - {name: b, M: 64, N: 256, min_speedup: 0}") + 1
    assert (f"specs/add.yaml:{row}:43: error[E203]: bench.0.min_speedup must be a number above 0, or a "
            "mapping from device kind to such a number") in out + err


def test_grad_bench_times_the_backward_pass_against_xla_autodiff(tmp_path):
    # softmax (its vjp runs softmax_dx) at one small bench case, with two competitors: jax.nn.softmax,
    # whose autodiff gradient is right (timed), and a stop_gradient one whose gradient is zero (not
    # timed). add has no vjp: skipped, with the reason.
    src = tmp_path / "src"
    src.mkdir()
    spec = (ROOT / "specs" / "softmax.yaml").read_text()
    head, _, tail = spec.partition("bench:\n")
    head = head.replace("competitors:\n", (
        "competitors:\n"
        "  xla:\n    body: return jax.nn.softmax(x, axis=-1)\n"
        "  frozen:\n    body: return lax.stop_gradient(jax.nn.softmax(x, axis=-1))\n"))
    (src / "softmax.yaml").write_text(head + "bench:\n  - {name: small, M: 16, N: 128, dtype: float32}\n"
                                      + tail[tail.index("# backend="):])
    shutil.copy(ROOT / "specs" / "softmax_dx.yaml", src / "softmax_dx.yaml")
    add = (ROOT / "specs" / "add.yaml").read_text()
    head, _, tail = add.partition("bench:\n")
    (src / "add.yaml").write_text(head + "bench:\n  - {name: small, M: 64, N: 256, dtype: float32}\nbackends:"
                                  + tail.split("backends:", 1)[1])
    (tmp_path / "p").mkdir()
    root = project(tmp_path / "p", src / "softmax.yaml", src / "softmax_dx.yaml", src / "add.yaml")
    report, md = tmp_path / "b.json", tmp_path / "b.md"
    rc, out, err = kspec("bench", "specs/softmax.yaml", "specs/add.yaml", "--grad", "--backend", "interpret",
                         "--samples", "3", "--seed", "3", "--json", report, "--markdown", md, cwd=root)
    assert rc == 0, out + err
    rows = {r["kernel"]: r for r in json.loads(report.read_text())["results"]}
    # softmax_dx comes with softmax (its vjp's kernel): a kernel without a vjp of its own, skipped too.
    assert sorted(r["kernel"] for r in json.loads(report.read_text())["results"]) == ["add", "softmax", "softmax_dx"]
    assert rows["add"]["status"] == "skip"
    assert rows["add"]["message"] == "no `vjp:`: the spec declares no backward pass to time"
    row = rows["softmax"]
    assert row["status"] == "pass" and row["grad"] is True and row["mode"] == "bench"
    # The forward and backward pass of the kernel, of the reference and of the right competitor, round by round.
    raw = row["samples_ms"]
    assert sorted(raw) == ["competitor:xla", "kernel", "reference"] and all(len(v) == 3 for v in raw.values())
    ratios = sorted(r / k for r, k in zip(raw["reference"], raw["kernel"]))
    assert row["speedup"] == pytest.approx(ratios[1])
    # The cost estimate counts the forward pass: no roofline, no copy, for a grad row.
    assert row["bound"] is None and row["copy_ms"] is None and row["roofline_pct"] is None and row["flops"] is None
    assert row["competitors"]["xla"]["status"] == "pass"
    assert row["competitors"]["frozen"]["status"] == "fail"
    assert row["competitors"]["frozen"]["message"].startswith("not timed, wrong gradient: grad of x: ")
    assert "jax_pallas" not in raw and row["competitors"]["jax_pallas"]["status"] == "skip"
    text = md.read_text()
    assert "- timed: the forward and backward pass, jax.vjp through the spec's `vjp:` kernels" in text
    assert "skipped 2 interpret task(s): no `vjp:`: the spec declares no backward pass to time" in out
    assert "1 passed, 0 failed, 0 errors, 2 skipped" in out


def test_short_calls_are_timed_several_to_an_executable_and_still_checked(monkeypatch):
    """With every call counted as short (timing.SHORT_S raised), the kernel, the reference and the copy
    are each timed 8 calls to an executable, one per input set: the row records it and passes as before.
    In this process (the worker's run_task), so that the raised constant holds."""
    from kspec.codegen.run import timing, worker
    from kspec.codegen.run.tasks import BenchTask

    monkeypatch.setattr(timing, "SHORT_S", 1e3)
    task = BenchTask(spec_path=str(ROOT / "specs" / "add.yaml"), kernel="add", backend="interpret", case="ragged",
                     case_index=1, dtypes=(("x", "float32"), ("y", "float32"), ("o", "float32")), dtype_label="float32", seed=3,
                     out_root=str(ROOT / "generated"), samples=3)
    row = worker.run_task(task)
    assert row.status == "pass", row.message
    figures = row.extra
    assert figures["input_copies"] == 8 and figures["calls_per_executable"] == 8
    raw = figures["samples_ms"]
    assert sorted(raw) == ["copy", "kernel", "reference"]
    assert all(len(v) == 3 and min(v) > 0 for v in raw.values())
    assert figures["ms"] == pytest.approx(statistics.median(raw["kernel"]))


def test_a_time_budget_starts_no_task_past_it():
    """--budget-seconds: the tasks started before the budget is spent run to the end; no task starts
    after it (a clock that moves 10 s per task, a budget of 25 s: three tasks run)."""
    from kspec.cli import _run_with_progress

    now = [0.0]

    import types

    class Session:  # runs a task by advancing the clock
        def run(self, task):
            now[0] += 10.0
            return types.SimpleNamespace(status="pass", label=task.label)

    class Task:
        def __init__(self, i):
            self.label = f"t{i}"

    seen = []
    rows = _run_with_progress(Session(), [Task(i) for i in range(6)], on_row=lambda r: seen.append(len(r)),
                              budget=25.0, clock=lambda: now[0])
    assert [r.label for r in rows] == ["t0", "t1", "t2"] and seen == [1, 2, 3]
    assert len(_run_with_progress(Session(), [Task(i) for i in range(6)], clock=lambda: now[0])) == 6


def test_a_row_whose_probe_read_long_but_whose_rounds_read_short_is_sampled_again_several_to_an_executable(monkeypatch):
    """The warm probe reads a call long where the host is busy (another thread holding Python's lock),
    so it picks one call to an executable; the rounds, back-to-back calls, read it short: the row is
    sampled again k calls to an executable (timing.read_short). A probe that reads 10 s, SHORT_S 5 s:
    every call here reads short in the rounds."""
    from kspec.codegen.run import timing, worker
    from kspec.codegen.run.tasks import BenchTask

    monkeypatch.setattr(timing, "SHORT_S", 5.0)
    monkeypatch.setattr(timing, "warm_call_s", lambda fn, args: 10.0)
    task = BenchTask(spec_path=str(ROOT / "specs" / "add.yaml"), kernel="add", backend="interpret", case="ragged",
                     case_index=1, dtypes=(("x", "float32"), ("y", "float32"), ("o", "float32")), dtype_label="float32", seed=3,
                     out_root=str(ROOT / "generated"), samples=3)
    row = worker.run_task(task)
    assert row.status == "pass", row.message
    assert row.extra["input_copies"] == 8 and row.extra["calls_per_executable"] == 8
    assert timing.read_short({"a": [1.0, 2.0, 3.0], "b": [9.0, 9.0, 9.0]})  # the fastest's median, 2 s
    assert not timing.read_short({"a": [6.0, 5.5, 9.0]})
