"""`kspec bench`: a timed row's figures hang together, and memory-bound rows carry a copy of
as many bytes timed in the same rounds (the ceiling they are judged against)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from test_verify import ROOT, kspec, project

from kspec.codegen.run import bench as benchrun
from kspec.codegen.run import timing
from kspec.codegen.backends.devices import peak_for


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


def test_median_interval_takes_the_binomial_ranks():
    # The 95% interval for a median of n values runs between the order statistics that the
    # binomial tables give: ranks 4 and 12 of 15, 40 and 61 of 100; below 6 values, the range.
    values = [float(v) for v in range(1, 16)]
    assert timing.median_ci(values[::-1]) == (8.0, 4.0, 12.0)
    assert timing.median_ci([float(v) for v in range(100, 0, -1)]) == (50.5, 40.0, 61.0)
    assert timing.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)
    assert timing.median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (3.5, 1.0, 6.0)
    assert timing.median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], level=0.5) == (3.5, 2.0, 5.0)


def test_paired_ratios_cancel_a_clock_swing_that_the_medians_keep():
    # The reference is 1.10x slower than the kernel in every round but one, while the clock
    # halves the speed of both in the last two rounds. Round by round the ratio is 1.10 but for
    # the one slow kernel sample; the kernel's median falls on that sample, so the ratio of the
    # two medians says 0.58x.
    clock = [1.0, 1.0, 1.0, 2.0, 2.0]
    reference = [1.1 * c for c in clock]
    kernel = [1.0, 1.0, 1.9, 2.0, 2.0]
    ratios = timing.paired(reference, kernel)
    assert ratios == pytest.approx([1.1, 1.1, 1.1 / 1.9, 1.1, 1.1])
    assert timing.median_ci(ratios)[0] == pytest.approx(1.1)
    assert statistics.median(reference) / statistics.median(kernel) == pytest.approx(1.1 / 1.9)
    with pytest.raises(ValueError):
        timing.paired([1.0, 2.0], [1.0])


def test_roofline_bound_decides_whether_a_copy_is_timed_alongside():
    h200 = peak_for("NVIDIA H200")
    mm = 2 * 8192**3, 3 * 8192 * 8192 * 2  # bf16 matmul: flops, bytes
    norm = 8 * 8192 * 8192, 2 * 8192 * 8192 * 4  # f32 layer norm
    assert benchrun._bound(h200, "bfloat16", *mm) == "compute"
    assert benchrun._bound(h200, "float32", *norm) == "memory"
    assert benchrun._bound(h200, "float32", None, 1 << 20) == "memory"
    assert benchrun._bound(None, "float32", *norm) is None


def test_untimed_row_keeps_the_columns_and_shows_why():
    from kspec.codegen import bench

    r = {"kernel": "add", "backend": "triton", "case": "small", "dtype": "float32", "status": "fail",
         "message": "not timed, wrong result: 3 of 8 elements differ\nmore"}
    line = bench.row(r)
    assert len(line) == len(bench.COLUMNS)
    assert line[4] == "fail" and line[-1] == "not timed, wrong result: 3 of 8 elements differ"
    assert set(line[5:-1]) == {""}


def test_a_floor_inside_the_interval_reads_as_neither_met_nor_failed():
    # H100 call j3: 1.167x (1.153-1.207) against a floor of 1.2 passed (the interval reaches it) but read
    # `>= min 1.2`; the median under the floor now reads `~`.
    from kspec.codegen import bench

    r = {"kernel": "mm", "backend": "mosaic_gpu", "case": "mlp2048", "dtype": "bfloat16", "status": "pass",
         "message": "", "ms": 0.944, "ms_p10": 0.872, "ms_p90": 0.968, "ref_ms": 1.093, "speedup": 1.167,
         "speedup_ci95": [1.153, 1.207], "tflops": 584.1, "gbs": 391, "roofline_pct": 59, "ref_roofline_pct": 51,
         "copy_pct": None, "compile_s": 0.95, "params": {}, "min_speedup": 1.2}
    column = bench.COLUMNS.index("speedup (95% CI)")
    assert bench.row(r)[column] == "1.167x (1.153-1.207) ~ min 1.2"
    assert bench.row(dict(r, speedup=1.2))[column] == "1.200x (1.153-1.207) >= min 1.2"
    assert bench.row(dict(r, status="fail", speedup_ci95=[1.1, 1.19]))[column] == "1.167x (1.100-1.190) < min 1.2"


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
        "  broken: {body: return x @ y}\n"))
    reference = (root / "generated" / "add" / "reference.py").read_text()
    assert "def add_xla(x, y, *, bm=8, bn=128):" in reference and "    return jnp.add(x, y)\n" in reference
    assert "\"gpu_only\": (add_gpu_only, ('gpu',))," in reference
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
