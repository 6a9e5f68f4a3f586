"""`kspec verify --inputs`: input kinds beyond standard normal data (large magnitudes, rows of
one value, zero rows, very negative rows), a spec's `kinds` per input, and the planted bugs
that only those kinds find. The data itself is tested in tests/unit/run/test_inputs.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import declared, invoke_kspec, mutate

PLANTED = Path(__file__).resolve().parent / "planted"
SOFTMAX = PLANTED / "softmax_add_max.yaml"
RMS = PLANTED / "rms_norm_minus_eps.yaml"


def project(tmp_path: Path, *specs, texts: dict | None = None) -> Path:
    """A project holding copies of `specs` (and specs/<name>.yaml for each of `texts`), generated."""
    (tmp_path / "specs").mkdir()
    for spec in specs:
        shutil.copy(spec, tmp_path / "specs" / spec.name)
    for name, text in (texts or {}).items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    return tmp_path


def verify(proj: Path, *args):
    """(rc, the rows of the declared cases in the JSON report, the table) of `kspec verify --seed 3 *args`
    (the derived cases run normal inputs only)."""
    report = proj / "r.json"
    r = invoke_kspec("verify", "--seed", "3", "--schedules", "1", "--json", report, *args, cwd=proj, timeout=300)
    rows = json.loads(report.read_text())["results"]
    return r.rc, declared(rows), r.out


def test_softmax_that_adds_the_row_max_fails_only_on_large_inputs(tmp_path):
    """Standard normal data cannot tell exp(x + max) from exp(x - max); at 30 times the scale it
    overflows, and the default run (normal data and one more kind: the first case gets `large`)
    fails naming the kind, on both backends."""
    proj = project(tmp_path, SOFTMAX)
    rc, rows, _ = verify(proj, "--inputs", "normal")
    assert rc == 0 and [r["status"] for r in rows] == ["pass", "pass"]
    assert [r["inputs"] for r in rows] == [["normal"], ["normal"]]
    rc, rows, out = verify(proj)
    assert rc == 1
    assert [(r["backend"], r["status"], r["inputs"]) for r in rows] == [
        ("interpret", "fail", ["normal", "large"]), ("mosaic_tpu", "fail", ["normal", "large"])]
    nan = ("with large inputs (standard normal x 30): output o: 2433 element(s) are NaN/Inf where the reference "
           "is finite")
    assert rows[0]["message"] == nan
    assert rows[1]["message"] == nan + " [TPU interpret mode, seed 3, on_wait DMAs, 2 cores]"
    assert "    " + nan in out.splitlines()


def test_rms_norm_that_subtracts_eps_fails_on_zero_rows(tmp_path):
    proj = project(tmp_path, RMS)
    rc, rows, _ = verify(proj)  # normal and large: a mean square far from eps
    assert rc == 0 and rows[0]["inputs"] == ["normal", "large"]
    for selection in ("zero_rows", "all", "equal_rows,zero_rows"):
        rc, rows, _ = verify(proj, "--inputs", selection)
        assert rc == 1
        assert rows[0]["message"] == ("with zero_rows inputs (rows 0, 2, 4, ... all zero): output y: 2560 element(s) "
                                      "are NaN/Inf where the reference is finite"), selection
    rc, rows, _ = verify(proj, "--inputs", "all")
    assert rows[0]["inputs"] == ["normal", "large", "equal_rows", "zero_rows", "negative_rows"]


def test_kinds_an_input_declares_are_the_only_ones_it_gets(tmp_path):
    """`kinds: [zero_rows]` on x: the softmax bug is out of reach of every run; `kinds: []` leaves
    normal data alone."""
    only_zero = SOFTMAX.read_text().replace("x: {shape: [M, N], dtype: float32}",
                                            "x: {shape: [M, N], dtype: float32, kinds: [zero_rows]}")
    proj = project(tmp_path, texts={"softmax_add_max": only_zero})
    rc, rows, _ = verify(proj, "--inputs", "all", "--backend", "interpret")
    assert rc == 0 and rows[0]["inputs"] == ["normal", "zero_rows"]
    (proj / "specs" / "softmax_add_max.yaml").write_text(only_zero.replace("kinds: [zero_rows]", "kinds: []"))
    assert invoke_kspec("generate", cwd=proj).rc == 0  # a spec-sha line changes; the kernel does not
    rc, rows, _ = verify(proj, "--inputs", "all", "--backend", "interpret")
    assert rc == 0 and rows[0]["inputs"] == ["normal"]


def test_the_default_gives_each_case_the_next_kind(tmp_path):
    three = SOFTMAX.read_text().replace("cases: [{name: rows, M: 20, N: 256}]",
                                        "cases: [{name: a, M: 20, N: 256}, {name: b, M: 12, N: 128}, {name: c, M: 4, N: 128}]")
    proj = project(tmp_path, texts={"softmax_add_max": three})
    rc, rows, _ = verify(proj, "--inputs", "default", "--backend", "interpret")
    assert [(r["case"], r["inputs"]) for r in rows] == [
        ("a", ["normal", "large"]), ("b", ["normal", "equal_rows"]), ("c", ["normal", "zero_rows"])]


@pytest.mark.parametrize("value, says", [
    ("wide", "error: --inputs: unknown input kind 'wide'; use default, all, normal or kinds from: large, "
             "equal_rows, zero_rows, negative_rows, opposed_rows\n"),
    ("large,all", "error: --inputs: unknown input kind 'all'; use default, all, normal or kinds from: large, "
                  "equal_rows, zero_rows, negative_rows, opposed_rows\n"),
])
def test_an_unknown_input_kind_is_a_usage_error(tmp_path, value, says):
    r = invoke_kspec("verify", "--inputs", value, cwd=tmp_path)
    assert (r.rc, r.err) == (2, says)


@pytest.mark.parametrize("edit, expected", [
    (("x: {shape: [M, N], dtype: float32}", "x: {shape: [M, N], dtype: float32, kinds: [huge]}"),
     'specs/s.yaml:8:46: error[E200]: inputs.x.kinds.0 must be one of "large", "equal_rows", "zero_rows", '
     '"negative_rows", "opposed_rows"'),
    (("x: {shape: [M, N], dtype: float32}", "x: {shape: [M, N], dtype: float32, kinds: [large, large]}"),
     "specs/s.yaml:8:45: error[E200]: inputs.x.kinds: ['large', 'large'] has non-unique elements"),
    (("x: {shape: [M, N], dtype: float32}", "x: {shape: [M, N], dtype: bool, kinds: [large]}"),
     "specs/s.yaml:8:42: error[E411]: x.kinds: a bool input has only its normal data; it takes no input kinds"),
])
def test_kinds_are_checked(tmp_path, edit, expected):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "s.yaml").write_text(mutate(SOFTMAX.read_text(), edit))
    r = invoke_kspec("check", "specs/s.yaml", cwd=tmp_path)
    assert r.rc == 2 and r.out.splitlines()[0] == expected, r.out


def test_scores_whose_max_starts_at_zero_fail_only_on_opposed_rows(tmp_path):
    """A row max of x @ y^T that starts at 0 is exact on normal data; `opposed_rows`, which both inputs
    list, makes every score of x's rows 0, 2, 4, ... very negative, and those rows become 0 / 0."""
    proj = project(tmp_path, PLANTED / "scores_max_from_zero.yaml")
    rc, rows, _ = verify(proj, "--inputs", "normal")
    assert rc == 0 and [(r["status"], r["inputs"]) for r in rows] == [("pass", ["normal"])]
    rc, rows, _ = verify(proj)  # the one case takes the one kind the inputs offer
    assert rc == 1 and rows[0]["inputs"] == ["normal", "opposed_rows"]
    assert rows[0]["message"] == (
        "with opposed_rows inputs (rows 0, 2, 4, ... near -1000 in the first input taking it, |standard normal| "
        "+ 0.5 in the others): output o: 1280 element(s) are NaN/Inf where the reference is finite")
