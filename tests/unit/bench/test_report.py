"""bench/: a row of the `kspec bench` table, whatever the run left in it. tests/test_bench.py runs
`kspec bench` end to end."""

from __future__ import annotations


def test_untimed_row_keeps_the_columns_and_shows_why():
    from kspec.codegen import bench

    r = {"kernel": "add", "backend": "triton", "case": "small", "dtype": "float32", "status": "fail",
         "message": "not timed, wrong result: 3 of 8 elements differ\nmore"}
    line = bench.row(r)
    assert len(line) == len(bench.COLUMNS)
    assert line[4] == "fail" and line[-1] == "not timed, wrong result: 3 of 8 elements differ"
    assert set(line[5:-1]) == {""}


def test_a_floor_inside_the_interval_reads_as_neither_met_nor_failed():
    # On an H100, 1.167x (1.153-1.207) against a floor of 1.2 passed (the interval reaches it) but read
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


def test_a_sweep_split_in_parts_sums_up_as_one(tmp_path):
    """scripts/sweep_summary.py: the rows of every part, a shape measured twice counted once (the
    later part's), the geomean and worst over all; parts of another device are refused."""
    import json
    import subprocess
    import sys

    from conftest import REPO

    def part(name, rows, device="NVIDIA H100 80GB HBM3"):
        meta = {"device": device, "jax_version": "0.11.2", "seed": 3, "samples": 5, "grad": False, "date": "2026-11-27"}
        path = tmp_path / name
        path.write_text(json.dumps(dict(meta, results=[
            {"kernel": "softmax", "backend": "triton", "case": case, "dtype": "float32", "status": "pass",
             "message": "", "ms": 1.0, "speedup": s, "compile_s": 0.5, "competitors": {}} for case, s in rows])))
        return str(path)

    first = part("a.json", [("llm_M1000_N768", 0.5), ("llm_M1000_N1024", 1.0)])
    second = part("b.json", [("llm_M1000_N768", 0.8), ("llm_M2048_N768", 1.25)])
    script = [sys.executable, str(REPO / "scripts" / "sweep_summary.py")]
    r = subprocess.run(script + [first, second], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("3 rows from 2 runs (device NVIDIA H100 80GB HBM3, jax_version 0.11.2, seed 3, samples 5")
    # geomean of 0.8, 1.0 and 1.25 is 1.0; the worst is the later part's 0.8
    assert "| softmax | triton | float32 | 3 | 0 | 0 | 1.000x | 0.800x (llm_M1000_N768) | - | 0.5 |" in r.stdout
    other = part("c.json", [("llm_M4096_N768", 1.0)], device="NVIDIA H200")
    r = subprocess.run(script + [first, other], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == f"error: {other}: device 'NVIDIA H200' differs from the earlier files' 'NVIDIA H100 80GB HBM3'\n"


def test_a_gradient_xla_differentiates_counts_as_auto_on_the_reference(tmp_path):
    """A grad sweep's row where auto differentiates the reference is XLA timed against itself: the
    summary counts it at 1.0x with the shapes auto runs on the reference, whatever the rounds said;
    a plot places gradient rows by their inputs' bytes, and draws nothing without a size."""
    from kspec.codegen import bench

    def grad_row(case, speedup, **more):
        return dict({"kernel": "rms_norm", "backend": "triton", "case": case, "dtype": "bfloat16", "status": "pass",
                     "message": "", "ms": 0.1, "speedup": speedup, "compile_s": 0.5, "competitors": {},
                     "bytes": None}, **more)

    rows = [grad_row("llm_M4096_N1024", 0.53, fallback=True), grad_row("llm_M4096_N4096", 1.5),
            grad_row("llm_M1000_N768", 0.9)]
    (s,) = bench.sweep_summary(rows)
    assert (s["shapes"], s["fallbacks"], s["worst"], s["worst_case"]) == (3, 1, 0.9, "llm_M1000_N768")
    assert abs(s["geomean"] - (1.5 * 0.9) ** (1 / 3)) < 1e-12
    assert not bench.plot_sweep(rows, str(tmp_path / "none.png")) and not (tmp_path / "none.png").exists()


def test_a_gradient_sweep_is_plotted_by_its_inputs_bytes(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")  # the `plot` extra
    from kspec.codegen import bench

    rows = [{"kernel": "rms_norm", "backend": "triton", "case": f"llm_M{m}_N1024", "dtype": "bfloat16",
             "status": "pass", "message": "", "ms": 0.1, "speedup": 1.2, "compile_s": 0.5, "competitors": {},
             "bytes": None, "input_bytes": m * 1024 * 2} for m in (1000, 2048)]
    assert bench.plot_sweep(rows, str(tmp_path / "sized.png"))
    assert (tmp_path / "sized.png").stat().st_size > 0
