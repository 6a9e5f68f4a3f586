"""Cases verify derives from a spec (codegen/checks/derive.py): a ragged extent and 1, 2 and 3 steps
on every split dim, a full persistent grid; checked statically by `kspec check` and run by verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import REPO, build_spec, invoke_kspec, mutate

from kspec.codegen.checks import derive, semantic
from kspec.codegen.verify import plan

PLANTED = Path(__file__).resolve().parent / "planted"

ROWS = """
name: rows
params: {bm: 8}
inputs:
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, N], dtype: x}
grid: {i: "cdiv(M, bm)"}
blocks:
  x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = 2 * x_ref[...]
reference: |
  return 2 * x
cases: [{name: big, M: 64, N: 128}]
"""


def derived(text: str, exhaustive: bool = False) -> list:
    spec = build_spec(text)
    return [(d.case.name, dict(d.case.dims), d.base) for d in semantic.derived_cases(spec, exhaustive)]


def test_derives_what_the_declared_cases_lack():
    # 64 rows in blocks of 8: 8 steps, never ragged, never 1, 2 or 3 steps; the ragged M = 12 runs
    # 2 steps, so no other case is derived for 2
    assert derived(ROWS) == [
        ("derived:ragged_M", {"M": 12, "N": 128}, "big"),
        ("derived:steps1_M", {"M": 8, "N": 128}, "big"),
        ("derived:steps3_M", {"M": 24, "N": 128}, "big"),
    ]
    # a declared case of 2 whole steps covers steps2 only
    covered = mutate(ROWS, ("cases: [{name: big, M: 64, N: 128}]",
                            "cases: [{name: big, M: 64, N: 128}, {name: two, M: 16, N: 128}]"))
    assert [n for n, _, _ in derived(covered)] == ["derived:ragged_M", "derived:steps1_M", "derived:steps3_M"]
    assert derived(covered)[0] == ("derived:ragged_M", {"M": 12, "N": 128}, "two")  # from the smallest case
    # --exhaustive derives them anyway, and the smallest extent
    assert derived(covered, exhaustive=True) == [
        ("derived:ragged_M", {"M": 12, "N": 128}, "two"),
        ("derived:steps1_M", {"M": 8, "N": 128}, "two"),
        ("derived:steps3_M", {"M": 24, "N": 128}, "two"),
        ("derived:smallest_M", {"M": 1, "N": 128}, "two"),
    ]


def test_derivation_respects_constraints_and_hardware_rules():
    # `M % bm == 0` rules a ragged M out: no derived case breaks it
    constrained = mutate(ROWS, ("grid:", 'constraints: ["M % bm == 0"]\ngrid:'))
    cases = derived(constrained, exhaustive=True)
    assert [n for n, _, _ in cases] == ["derived:steps1_M", "derived:steps2_M", "derived:steps3_M"]
    assert all(dims["M"] % 8 == 0 for _, dims, _ in cases)
    # mosaic_tpu's tiling rule (a block's second-to-last dim a multiple of 8 or the whole dim) holds
    # for every derived case, on every backend
    tpu = ROWS + "backends:\n  interpret:\n  mosaic_tpu:\n"
    spec = build_spec(tpu)
    for d in semantic.derived_cases(spec, exhaustive=True):
        assert semantic._fits(spec, d.case)


def test_splits_come_from_grids_pipelines_and_bodies_without_running_them():
    spec = build_spec((REPO / "specs" / "dma_copy.yaml").read_text())
    found = [(s.num.source, s.den.source, s.where) for s in derive.splits(spec, spec.variants["mosaic_tpu"])]
    assert found == [("M", "bm", "body")]  # `steps = M // bm` in the body; k * bm etc. split nothing
    spec = build_spec((REPO / "specs" / "matmul.yaml").read_text())
    found = [(s.num.source, s.den.source, s.where) for s in derive.splits(spec, spec.variants["triton"])]
    assert found == [("M", "bm", "grid axis i"), ("N", "bn", "grid axis j"), ("K", "bk", "body")]


def test_library_derived_cases_are_pinned():
    spec = build_spec((REPO / "specs" / "matmul.yaml").read_text(), "specs/matmul.yaml")
    shown = [(d.case.name, dict(d.case.dims), d.base, d.case.backends) for d in semantic.derived_cases(spec)]
    assert shown == [
        ("derived:steps1_M", {"M": 64, "N": 320, "K": 256}, "ragged_n", ()),
        ("derived:steps2_M", {"M": 128, "N": 320, "K": 256}, "ragged_n", ()),
        ("derived:steps3_M", {"M": 192, "N": 320, "K": 256}, "ragged_n", ()),
        ("derived:steps1_N", {"M": 200, "N": 128, "K": 256}, "ragged_n", ()),
        ("derived:steps1_K", {"M": 200, "N": 320, "K": 128}, "ragged_n", ()),
        # K = 384: 3 mosaic_tpu steps; triton's 384-wide x block passes E711, as its body slices it in powers of two
        ("derived:steps3_K", {"M": 200, "N": 320, "K": 384}, "ragged_n", ()),
    ]
    spec = build_spec((REPO / "specs" / "dma_copy.yaml").read_text(), "specs/dma_copy.yaml")
    assert [(d.case.name, dict(d.case.dims)) for d in semantic.derived_cases(spec)] == [
        ("derived:steps2_M", {"M": 16, "N": 128}), ("derived:steps3_M", {"M": 24, "N": 128})]


def test_persistent_grid_gets_a_full_case_on_the_gpu_only():
    spec = build_spec((REPO / "specs" / "matmul_persistent.yaml").read_text(), "specs/matmul_persistent.yaml")
    first = semantic.derived_cases(spec)[0]
    assert (first.case.name, dict(first.case.dims), first.case.backends) == (
        "derived:persistent", {"M": 17408, "N": 512, "K": 512}, ("mosaic_gpu",))
    tiles = (17408 // 256) * (512 // 256)  # cluster tiles: 136 for 66 clusters of the checked 132 SMs
    per = -(-tiles // 66)
    assert per >= 2 and tiles % per  # more tiles than programs, the last program's share short


def test_case_backends_skip_the_others_with_the_reason(tmp_path):
    text = mutate(ROWS, ("cases: [{name: big, M: 64, N: 128}]", "cases: [{name: big, M: 64, N: 128, backends: [mosaic_tpu]}]"))
    text += "backends:\n  interpret:\n  mosaic_tpu:\n"
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "rows.yaml").write_text(text)
    rc, out, err = invoke_kspec("generate", cwd=tmp_path)
    assert rc == 0, out + err
    from kspec.codegen import project

    compiled = [project.compile_spec(tmp_path / "specs" / "rows.yaml")]
    tasks, skipped = plan(compiled, backends=[], cases=["big"], seed=0, lower=False, platform="cpu")
    assert [(t.backend, t.case) for t in tasks] == [("mosaic_tpu", "big")]
    assert [(r.backend, r.message) for r in skipped] == [("interpret", "case `big` runs only on mosaic_tpu")]
    bad = mutate(text, ("backends: [mosaic_tpu]", "backends: [triton]"))
    (tmp_path / "specs" / "rows.yaml").write_text(bad)
    rc, out, _ = invoke_kspec("check", "specs/rows.yaml", cwd=tmp_path)
    assert rc == 2
    assert out.splitlines()[0] == (
        "specs/rows.yaml:16:9: error[E500]: case `big` runs on backend `triton`, which the spec does not generate "
        "(backends: interpret, mosaic_tpu)")


def test_check_reports_what_only_a_derived_case_exposes(tmp_path):
    # `M // bm` row blocks where cdiv(M, bm) is needed: the declared case has M a multiple of bm
    (tmp_path / "specs").mkdir()
    shutil.copy(PLANTED / "floor_grid.yaml", tmp_path / "specs")
    rc, out, err = invoke_kspec("check", "specs/floor_grid.yaml", cwd=tmp_path)
    assert rc == 2, out + err
    assert out.splitlines() == [
        "specs/floor_grid.yaml:13:3: error[E503]: case `derived:ragged_M`: output o is not fully written: "
        "block (1, 0) (elements [8:12, 0:128]) is never visited by the grid",
        "  = help: derived by verify from case `rows` with M = 12; make the grid and index_map reach every block "
        "of the output",
        "1 error(s) in 1 of 1 spec(s)",
    ]
    (tmp_path / "specs" / "floor_grid.yaml").write_text(
        mutate((PLANTED / "floor_grid.yaml").read_text(), ('"M // bm"', '"cdiv(M, bm)"')))
    rc, out, err = invoke_kspec("check", "specs/floor_grid.yaml", cwd=tmp_path)
    assert rc == 0, out + err


def test_verify_fails_a_loop_off_by_one_at_exactly_two_steps(tmp_path):
    # The drain skips chunk 0's write-back when there are exactly 2 chunks; the declared cases run 8 and 1.
    (tmp_path / "specs").mkdir()
    shutil.copy(PLANTED / "dma_drain_two.yaml", tmp_path / "specs")
    rc, out, err = invoke_kspec("generate", cwd=tmp_path)
    assert rc == 0, out + err
    report = tmp_path / "r.json"
    rc, out, err = invoke_kspec("verify", "-b", "mosaic_tpu", "--seed", "3", "--json", str(report), cwd=tmp_path,
                                timeout=300)
    assert rc == 1, out + err
    rows = {r["case"]: r for r in json.loads(report.read_text())["results"]}
    assert sorted(rows) == ["derived:steps2_M", "derived:steps3_M", "even", "one_chunk"]
    assert {c: r["status"] for c, r in rows.items()} == {
        "even": "pass", "one_chunk": "pass", "derived:steps2_M": "fail", "derived:steps3_M": "pass"}
    assert rows["derived:steps2_M"]["message"] == (
        "output o: 1024 element(s) are NaN/Inf where the reference is finite "
        "[TPU interpret mode, seed 3, on_wait DMAs, 2 cores]")
    # the declared cases alone pass: only the derived case finds it
    rc, out, err = invoke_kspec("verify", "-b", "mosaic_tpu", "--seed", "3", "--case", "even", "--case", "one_chunk",
                                cwd=tmp_path, timeout=300)
    assert rc == 0, out + err
    # a derived case can be named with --case
    rc, out, err = invoke_kspec("verify", "-b", "mosaic_tpu", "--seed", "3", "--case", "derived:steps2_M",
                                cwd=tmp_path, timeout=300)
    assert rc == 1 and "0 passed, 1 failed" in out, out + err
