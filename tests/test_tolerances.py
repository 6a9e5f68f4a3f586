"""The tolerance rule of `kspec verify` (codegen/run/compare.py, docs/verify.md "Tolerances"): with s the
RMS of the reference's finite values, an element passes when |out - ref| <= atol * s + rtol * |ref|,
and an output when every element passes and its rel_err is at most the tolerance's rel_err. Unit tests
on compare() with hand-built arrays, and end to end: library kernels with a planted bfloat16 bug, which
`kspec verify` must fail. scripts/calibrate_tolerances.py reproduces the calibration of the defaults."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import invoke_kspec

from kspec.codegen.run import compare
from kspec.codegen.spec import dtypes as dt

REPO = Path(__file__).resolve().parent.parent
BF16 = dt.TOLERANCES["bfloat16"]


def bf16(x) -> np.ndarray:
    """x rounded to bfloat16 (to nearest even), as float32."""
    return np.array(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


def softmax_rows(rows: int = 8, width: int = 512) -> np.ndarray:
    """A softmax over rows of deterministic scores, in float64: values around 1 / width."""
    x = 2 * np.sin(np.arange(rows * width, dtype=np.float64).reshape(rows, width) * 0.37)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def check(out, ref, tol=BF16, **kw) -> dict:
    return compare.compare(out, ref, tol["atol"], tol["rtol"], rel_err=tol.get("rel_err"), **kw)


def test_the_defaults_and_overrides():
    assert dt.tolerance(["bfloat16"]) == {"atol": 1e-2, "rtol": 1e-2, "rel_err": 5e-3}
    assert dt.tolerance(["float32", "bfloat16", "int32"]) == BF16
    assert dt.tolerance(["float32"]) == {"atol": 1e-4, "rtol": 1e-4, "rel_err": 1e-5}
    assert dt.tolerance(["int32"]) == {"atol": 0.0, "rtol": 0.0}  # exact; compare bounds rel_err by 0 too
    spec = {"bfloat16": {"atol": 2e-2, "rel_err": 3.3e-3}}
    assert dt.tolerance(["bfloat16"], spec) == {"atol": 2e-2, "rtol": 1e-2, "rel_err": 3.3e-3}
    assert dt.tolerance(["bfloat16"], spec, {"bfloat16": {"rel_err": 5e-3}})["rel_err"] == 5e-3


def test_gradients_take_their_own_bounds_where_an_entry_gives_them():
    spec = {"bfloat16": {"atol": 2e-2, "rel_err": 2.45e-3, "grad": {"rel_err": 3.3e-3}}}
    tol = dt.tolerance(["bfloat16"], spec)
    assert tol == {"atol": 2e-2, "rtol": 1e-2, "rel_err": 2.45e-3, "grad": {"rel_err": 3.3e-3}}
    assert dt.for_outputs(tol) == {"atol": 2e-2, "rtol": 1e-2, "rel_err": 2.45e-3}
    assert dt.for_gradients(tol) == {"atol": 2e-2, "rtol": 1e-2, "rel_err": 3.3e-3}
    # a later entry's bound holds outputs and gradients alike, over an earlier entry's `grad`
    case = {"bfloat16": {"atol": 0.1, "rel_err": 5e-3}}
    assert dt.tolerance(["bfloat16"], spec, case) == {"atol": 0.1, "rtol": 1e-2, "rel_err": 5e-3}
    # and its own `grad` over its bounds
    case = {"bfloat16": {"rel_err": 3e-3, "grad": {"atol": 0.05}}}
    tol = dt.tolerance(["bfloat16"], spec, case)
    assert dt.for_outputs(tol) == {"atol": 2e-2, "rtol": 1e-2, "rel_err": 3e-3}
    assert dt.for_gradients(tol) == {"atol": 0.05, "rtol": 1e-2, "rel_err": 3e-3}
    # an entry for another dtype changes nothing
    assert dt.tolerance(["float32"], spec) == dt.tolerance(["float32"])


def test_an_all_zero_softmax_fails_in_bfloat16():
    """Every softmax value is below 0.01, the bfloat16 atol: as an absolute floor it would pass zeros.
    Scaled by the output's RMS, the floor is 0.01 x 0.00288, and zeros fail everywhere."""
    ref = softmax_rows()
    assert ref.max() < BF16["atol"]
    assert compare.scale(ref) == pytest.approx(0.00288, rel=1e-3)
    v = check(np.zeros(ref.shape, np.float32), ref)
    assert not v["passed"]
    assert v["message"] == "4096 of 4096 elements outside tolerance; worst at (5, 433): got 0, expected 0.00636036"
    assert v["rel_err"] == 1.0 and v["norm_ratio"] == 200.0
    assert v["worst_ratio"] == pytest.approx(0.00636036 / (1e-2 * 0.00288 + 1e-2 * 0.00636036), rel=1e-3)


def test_a_correctly_rounded_bfloat16_result_passes():
    ref = softmax_rows()
    v = check(bf16(ref), ref)
    assert v["passed"] and v["message"] == ""
    # bfloat16 rounds to within 2^-9 = 0.2% of the value: a fifth of rtol; rel_err 0.16%, a third of its bound
    assert v["worst_ratio"] < 0.4 and v["norm_ratio"] < 0.4
    big = np.random.default_rng(0).standard_normal((64, 512)) * 1e3
    assert check(bf16(big), big)["passed"]


def test_the_rule_is_the_same_at_every_magnitude():
    """Scaling reference and output together changes no verdict and no ratio."""
    ref = softmax_rows()
    out = ref * (1 + 0.015 * np.cos(np.arange(ref.size).reshape(ref.shape)))
    verdicts = [check(out * k, ref * k) for k in (1e-20, 1.0, 1e20)]
    assert {v["passed"] for v in verdicts} == {False}
    for v in verdicts[1:]:
        assert v["worst_ratio"] == pytest.approx(verdicts[0]["worst_ratio"], rel=1e-9)
        assert v["norm_ratio"] == pytest.approx(verdicts[0]["norm_ratio"], rel=1e-9)


def test_the_floor_excuses_elements_near_zero_not_large_ones():
    """A sign-changing output: an element near zero may be off by up to atol * s, a large one by rtol of itself."""
    ref = np.array([1.0, -1.0, 0.0, 1.0])  # s = sqrt(3/4)
    near_zero = ref + np.array([0, 0, 0.008, 0])  # 0.008 <= 0.01 * 0.866
    assert check(near_zero, ref)["passed"]
    too_far = ref + np.array([0, 0, 0.009, 0])
    assert check(too_far, ref)["message"] == "1 of 4 elements outside tolerance; worst at (2,): got 0.009, expected 0"
    # One element dominates: s = 50, so its bound is 0.01 * 50 + 0.01 * 100 = 1.5, but as it makes the norm,
    # rel_err <= 0.005 holds it to 0.5.
    large = np.array([100.0, -0.5, 0.25, 0.5])
    assert check(large + np.array([0.45, 0, 0, 0]), large)["passed"]
    v = check(large + np.array([1.4, 0, 0, 0]), large)
    assert v["worst_ratio"] < 1 and not v["passed"]
    assert v["message"] == "rel_err 0.014 is above 0.005; worst at (0,): got 101.4, expected 100"


def test_a_bias_within_every_elements_bound_fails_the_norm():
    """0.8% too large everywhere: each element is within 0.01 * s + 0.01 * |ref| = 2%, the output is not."""
    ref = np.ones(1000)
    v = check(ref * 1.008, ref)
    assert v["frac_within_tol"] == 1.0 and v["worst_ratio"] == pytest.approx(0.4)
    assert v["norm_ratio"] == pytest.approx(1.6)
    assert v["message"] == "rel_err 0.008 is above 0.005; worst at (0,): got 1.008, expected 1"
    assert check(ref * 1.004, ref)["passed"]
    # without a rel_err, the bound is the larger of atol and rtol
    assert compare.compare(ref * 1.008, ref, 1e-2, 1e-2)["passed"]
    assert compare.compare(ref * 1.015, ref, 1e-2, 1e-2)["message"] == (
        "rel_err 0.015 is above 0.01; worst at (0,): got 1.015, expected 1")


def test_a_reference_of_zeros_is_matched_only_by_zeros():
    zeros = np.zeros(4)
    assert compare.scale(zeros) == compare.SCALE_FLOOR
    assert check(zeros, zeros)["passed"]
    v = check(np.full(4, 1e-3), zeros)
    assert v["message"] == "4 of 4 elements outside tolerance; worst at (0,): got 0.001, expected 0"


def test_nonfinite_values_and_exact_dtypes():
    ref = softmax_rows()
    out = bf16(ref)
    out[3, 7] = np.nan
    assert check(out, ref)["message"] == "1 element(s) are NaN/Inf where the reference is finite"
    ints = np.arange(10)
    assert check(ints, ints, dt.EXACT)["passed"]
    assert check(ints + (ints == 4), ints, dt.EXACT)["message"] == (
        "1 of 10 elements outside tolerance; worst at (4,): got 5, expected 4")
    with_inf = np.array([1.0, np.inf, 2.0])
    assert check(with_inf, with_inf)["passed"]  # the scale is the RMS of the finite values


def test_an_entry_with_bounds_of_its_own_is_held_to_them():
    ref = softmax_rows()
    off = ref * 1.004  # rel_err 4e-3: inside bfloat16's 5e-3, outside a bound of 3e-3
    tight = dict(BF16, rel_err=3e-3)
    v = compare.compare_all([("output o", bf16(ref), ref), ("grad of x", off, ref, BF16)], **tight)
    assert v["passed"] and v["message"] == "" and v["rel_err"] == pytest.approx(4e-3, rel=1e-6)
    v = compare.compare_all([("output o", bf16(ref), ref), ("grad of x", off, ref)], **tight)
    assert not v["passed"] and v["message"].startswith("grad of x: rel_err 0.004 is above 0.003")


def test_compare_all_names_the_output_and_big_outputs_follow_the_same_rule():
    ref = softmax_rows()
    v = compare.compare_all([("output a", bf16(ref), ref), ("output o", ref * 1.015, ref)], **BF16)
    # 1.5% off everywhere: the elements above 2 s break 0.01 * s + 0.01 * |ref|
    assert v["message"] == ("output o: 390 of 4096 elements outside tolerance; worst at (5, 433): got 0.00645576, "
                            "expected 0.00636036")
    n = compare.DEVICE_THRESHOLD + 1  # compared on the device, in float32
    big = jnp.ones(n)
    on_device = check(big * 1.008, big)
    assert on_device["message"] == "rel_err 0.008 is above 0.005; worst at (0,): got 1.008, expected 1"
    assert check(big.at[5].set(0.5), big)["message"] == (
        f"1 of {n} elements outside tolerance; worst at (5,): got 0.5, expected 1")
    assert check(jnp.zeros(n), big)["norm_ratio"] == 200.0


def causal_like(rows: int = 64, width: int = 16) -> np.ndarray:
    """Rows of falling size, as causal attention's gradients: row i averages i + 1 terms."""
    rng = np.random.default_rng(5)
    return rng.standard_normal((rows, width)) / np.sqrt(np.arange(1, rows + 1))[:, None] ** 2


@pytest.mark.parametrize("size", ["host", "device"])
def test_rows_scale_follows_each_row_and_never_tightens(size):
    ref = causal_like()
    if size == "device":  # the same rule on the device, past the size compared on the host
        ref = np.tile(ref, (compare.DEVICE_THRESHOLD // ref.size + 1, 1))
    s = compare.scale(ref)
    big_row = ref.copy()
    big_row[0, 3] += 0.05 * np.sqrt(np.mean(ref[0] ** 2))  # 5% of its own row's RMS, far above 1% of s
    by_output = compare.compare(big_row, ref, 0.01, 0.0)
    by_rows = compare.compare(big_row, ref, 0.1, 0.0, rows=True)
    assert not compare.compare(big_row, ref, 0.1, 0.0)["passed"] and by_rows["passed"], (by_output, by_rows)
    # a small row keeps the output's scale: an error of 0.2 s there fails under either
    small_row = ref.copy()
    small_row[-1, 0] += 0.2 * s
    for rows in (False, True):
        v = compare.compare(small_row, ref, 0.1, 0.0, rows=rows)
        assert not v["passed"] and v["message"].startswith("1 of ")
        assert "worst at (%d, 0)" % (ref.shape[0] - 1) in v["message"]


def test_rows_scale_comes_from_the_tolerance_table_and_its_grad():
    tol = dt.tolerance(["bfloat16"], {"bfloat16": {"atol": 0.1, "rel_err": 0.02, "grad": {"scale": "rows"}}})
    assert tol == {"atol": 0.1, "rtol": 1e-2, "rel_err": 0.02, "grad": {"scale": "rows"}}
    ref = causal_like()
    off = ref.copy()
    off[0, 3] += 0.05 * np.sqrt(np.mean(ref[0] ** 2))
    named = [("grad of q", off, ref, dt.for_gradients(tol))]
    assert compare.compare_within(named, tol)["passed"]
    assert not compare.compare_within([("output o", off, ref)], dt.for_outputs(tol))["passed"]


# End to end: a library spec with one line of its body changed, under its own name (so its inputs are
# the library kernel's on the same seed), in a tmp_path project with the specs its vjp names.


def mutant_project(tmp_path: Path, spec: str, old: str, new: str) -> Path:
    (tmp_path / "specs").mkdir(parents=True)
    text = (REPO / "specs" / f"{spec}.yaml").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "specs" / f"{spec}.yaml").write_text(text.replace(old, new))
    wanted = set(re.findall(r"spec:\s*(\S+\.yaml)", text))
    while wanted:
        name = wanted.pop()
        if not (tmp_path / "specs" / name).exists():
            shutil.copy(REPO / "specs" / name, tmp_path / "specs" / name)
            wanted |= set(re.findall(r"spec:\s*(\S+\.yaml)", (REPO / "specs" / name).read_text()))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    return tmp_path


def verify_bf16(proj: Path, spec: str, case: str):
    """(rc, the bfloat16 run rows) of `kspec verify specs/<spec>.yaml --backend interpret --case CASE --seed 3`."""
    report = proj / "r.json"
    r = invoke_kspec("verify", f"specs/{spec}.yaml", "--backend", "interpret", "--case", case, "--seed", "3",
                     "--inputs", "normal", "--json", report, cwd=proj, timeout=600)
    rows = json.loads(report.read_text())["results"]
    return r.rc, [x for x in rows if x["kernel"] == spec and x["dtype"] == "bfloat16" and x["mode"] == "run"]


@pytest.mark.slow
def test_verify_fails_a_softmax_that_returns_zeros_in_bfloat16(tmp_path):
    good = "o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)"
    bad = "o_ref[...] = jnp.zeros_like(o_ref)"
    rc, rows = verify_bf16(mutant_project(tmp_path / "library", "softmax", good, good), "softmax", "square")
    assert rc == 0 and [r["status"] for r in rows] == ["pass"]
    rc, rows = verify_bf16(mutant_project(tmp_path / "mutant", "softmax", good, bad), "softmax", "square")
    assert rc == 1
    assert [r["status"] for r in rows] == ["fail"]
    assert rows[0]["message"] == ("output o: 32761 of 32768 elements outside tolerance; worst at (15, 431): got 0, "
                                  "expected 0.0513796")
    assert rows[0]["rel_err"] == 1.0 and rows[0]["tolerance"] == {"atol": 0.01, "rtol": 0.01, "rel_err": 0.005}


@pytest.mark.slow
def test_verify_fails_flash_attention_with_scores_rounded_to_bfloat16(tmp_path):
    """Every element stays within its bound; the output as a whole is off by 4e-3, above the spec's 2.45e-3."""
    good = "      ) * scale\n"
    bad = good + "      s = s.astype(jnp.bfloat16).astype(jnp.float32)\n"
    rc, rows = verify_bf16(mutant_project(tmp_path / "library", "flash_attention", good, good), "flash_attention",
                           "small")
    assert rc == 0 and [r["status"] for r in rows] == ["pass"]
    assert rows[0]["rel_err"] < 2.5e-3
    rc, rows = verify_bf16(mutant_project(tmp_path / "mutant", "flash_attention", good, bad), "flash_attention",
                           "small")
    assert rc == 1
    assert [r["status"] for r in rows] == ["fail"]
    assert rows[0]["message"] == ("output o: rel_err 0.00427 is above 0.00245; worst at (0, 42, 0, 2): got 0.376953, "
                                  "expected 0.380037")
    assert rows[0]["frac_within_tol"] == 1.0
    assert rows[0]["tolerance"] == {"atol": 0.02, "rtol": 0.01, "rel_err": 0.00245, "scale": "rows",
                                    "grad": {"rel_err": 0.0033}}


def test_a_gradient_bound_is_checked_as_the_others_are(kspec, write_spec):
    from conftest import VALID_SPEC

    write_spec(VALID_SPEC.replace("cases:", "tolerance:\n  float32: {rel_err: 1.0e-5, grad: {rel_err: 1.0e-4}}\ncases:"))
    r = kspec("check", "specs/tiny.yaml")
    assert r.rc == 0 and r.out.endswith("1 spec(s) OK\n") and "error" not in r.out
    write_spec(VALID_SPEC.replace("cases:", "tolerance:\n  float32: {grad: {rel_err: 2, slack: 1}}\ncases:"))
    r = kspec("check", "specs/tiny.yaml")
    assert r.rc == 2
    assert r.out.splitlines() == [
        "specs/tiny.yaml:19:29: error[E200]: tolerance.float32.grad.rel_err: 2 is greater than the maximum of 1",
        "specs/tiny.yaml:19:32: error[E201]: unknown key `slack` in tolerance.float32.grad",
        "  = help: allowed keys: atol, rel_err, rtol, scale",
        "2 error(s) in 1 of 1 spec(s)",
    ]
