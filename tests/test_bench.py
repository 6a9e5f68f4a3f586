"""`kspec bench`: a timed row's figures hang together, and memory-bound rows carry a copy of
as many bytes timed in the same rounds (the ceiling they are judged against)."""

from __future__ import annotations

import json

import pytest
from test_verify import ROOT, kspec, project

from codegen import benchrun
from codegen.devices import peak_for


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
    assert row["speedup"] == pytest.approx(row["ref_ms"] / row["ms"])
    # No peaks for a CPU, so the copy is measured: its time over the kernel's and over the reference's.
    assert row["bound"] is None and row["copy_ms"] > 0
    assert row["copy_pct"] == pytest.approx(100 * row["copy_ms"] / row["ms"])
    assert row["ref_copy_pct"] == pytest.approx(100 * row["copy_ms"] / row["ref_ms"])
    assert row["copy_gbs"] == pytest.approx(row["bytes"] / (row["copy_ms"] / 1e3) / 1e9)
    header = next(line for line in md.read_text().splitlines() if line.startswith("| kernel"))
    assert "| XLA % roofline | % of copy | compile s |" in header
    line = next(line for line in md.read_text().splitlines() if line.startswith("| add | interpret | small"))
    assert f"| {row['copy_pct']:.0f} |" in line


def test_roofline_bound_decides_whether_a_copy_is_timed_alongside():
    h200 = peak_for("NVIDIA H200")
    mm = 2 * 8192**3, 3 * 8192 * 8192 * 2  # bf16 matmul: flops, bytes
    norm = 8 * 8192 * 8192, 2 * 8192 * 8192 * 4  # f32 layer norm
    assert benchrun._bound(h200, "bfloat16", *mm) == "compute"
    assert benchrun._bound(h200, "float32", *norm) == "memory"
    assert benchrun._bound(h200, "float32", None, 1 << 20) == "memory"
    assert benchrun._bound(None, "float32", *norm) is None


def test_untimed_row_keeps_the_columns_and_shows_why():
    from codegen import bench

    r = {"kernel": "add", "backend": "triton", "case": "small", "dtype": "float32", "status": "fail",
         "message": "not timed, wrong result: 3 of 8 elements differ\nmore"}
    line = bench.row(r)
    assert len(line) == len(bench.COLUMNS)
    assert line[4] == "fail" and line[-1] == "not timed, wrong result: 3 of 8 elements differ"
    assert set(line[5:-1]) == {""}
