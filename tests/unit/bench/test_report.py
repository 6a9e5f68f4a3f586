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
