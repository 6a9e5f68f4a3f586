"""run/inputs.py and run/kinds.py: the data of each input kind, which inputs take which kinds,
how --inputs chooses them per case, and the comparison the kinds other than normal are judged
by (run/compare.py). tests/test_inputs.py runs kernels on them through `kspec verify`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kspec.codegen.run import compare, inputs, kinds
from kspec.codegen.run.tasks import RunTask
from conftest import VALID_SPEC, build_spec, mutate

TASK = RunTask(spec_path="specs/tiny.yaml", kernel="tiny", backend="interpret", case="c", case_index=0,
               dtypes=(("x", "float32"),), dtype_label="float32", seed=5, out_root="generated")


@dataclasses.dataclass
class Op:
    name: str = "x"
    init: object = None
    prefetch: bool = False
    kinds: tuple | None = None


def data(kind: str, shape=(6, 64), dtype="float32", op=Op(), lead=True) -> np.ndarray:
    return np.asarray(inputs.make_input(TASK, op, shape, dtype, {}, {}, kind, lead=lead)).astype(np.float64)


def test_each_float_kind_has_its_shape():
    normal, large = data("normal"), data("large")
    assert 0.5 < normal.std() < 2 and 15 < large.std() < 60  # standard normal, and 30 times that
    zero, equal, negative = data("zero_rows"), data("equal_rows"), data("negative_rows")
    assert (zero[0::2] == 0).all() and (zero[1::2] != 0).all()  # rows 0, 2, 4 zero; the others normal
    assert (equal[0::2] == equal[0::2, :1]).all() and (equal[1::2].std(axis=1) > 0.3).all()
    assert (negative[0::2] < -990).all() and (negative[0::2] > -1010).all() and (abs(negative[1::2]) < 10).all()
    assert not np.array_equal(normal, data("normal", op=Op("y")))  # each input its own stream
    assert np.array_equal(normal, data("normal"))  # and the same one every time


def test_a_one_dim_input_is_one_row_and_narrow_floats_stay_finite():
    assert (data("zero_rows", shape=(16,)) == 0).all()
    deep = data("negative_rows", dtype="float8_e4m3fn")  # range 448: rows near -448 / 16, not -1000
    assert np.isfinite(deep).all() and (deep[0::2] < -20).all()
    assert np.isfinite(data("large", dtype="float16")).all()


def test_integers_take_their_bounds():
    big = data("large", dtype="int8")
    assert set(np.unique(big)) == {-128, 127}
    assert set(np.unique(data("large", dtype="uint8"))) == {0, 255}
    negative = data("negative_rows", dtype="int32")
    assert (negative[0::2] == -(2**31)).all() and (abs(negative[1::2]) <= 100).all()


def test_opposed_rows_make_every_product_of_the_first_with_the_others_very_negative():
    listed = ("opposed_rows",)
    first = data("opposed_rows", op=Op("q", kinds=listed))
    other = data("opposed_rows", op=Op("k", kinds=listed), lead=False)
    assert (first[0::2] < -990).all() and (abs(first[1::2]) < 10).all()  # the first: negative_rows
    assert (other >= 0.5).all() and not np.array_equal(other, data("opposed_rows", op=Op("v", kinds=listed), lead=False))
    assert ((first @ other.T)[0::2] < -10_000).all()  # every score of rows 0, 2, 4, ... (64 columns)
    ints = data("opposed_rows", dtype="int32", op=Op(kinds=listed), lead=False)
    assert (ints >= 1).all() and (ints <= 101).all()
    assert np.array_equal(data("opposed_rows"), data("normal"))  # an input that does not list it keeps normal data


def test_which_inputs_take_which_kinds():
    everything = tuple(k for k in kinds.KINDS if k not in kinds.OPT_IN)  # opposed_rows only where listed
    assert "opposed_rows" in kinds.KINDS and everything == ("large", "equal_rows", "zero_rows", "negative_rows")
    assert kinds.takes(Op(), "float32") == everything and kinds.takes(Op(), "int32") == everything
    assert kinds.takes(Op(), "bool") == ()
    assert kinds.takes(Op(init=object()), "float32") == ()  # an init says what the data is
    assert kinds.takes(Op(init=object(), kinds=("large",)), "float32") == ("large",)
    assert kinds.takes(Op(prefetch=True, kinds=("large",)), "int32") == ()
    assert kinds.takes(Op(kinds=("zero_rows", "large")), "float32") == ("large", "zero_rows")  # in KINDS order
    assert kinds.takes(Op(kinds=("opposed_rows",)), "float32") == ("opposed_rows",)
    # an input that takes no kind keeps its normal data in a kind's run
    assert np.array_equal(data("large", op=Op(kinds=())), data("normal", op=Op(kinds=())))


def test_the_selection_per_case():
    spec = build_spec(VALID_SPEC)
    assign = {"x": "float32", "o": "float32"}
    assert [kinds.chosen(("default",), spec, assign, i) for i in range(5)] == [
        ("normal", "large"), ("normal", "equal_rows"), ("normal", "zero_rows"), ("normal", "negative_rows"),
        ("normal", "large")]
    assert kinds.chosen(("all",), spec, assign, 0) == ("normal", "large", "equal_rows", "zero_rows", "negative_rows")
    assert kinds.chosen(("normal",), spec, assign, 3) == ("normal",)
    assert kinds.chosen(("zero_rows", "large"), spec, assign, 0) == ("normal", "zero_rows", "large")
    only = build_spec(mutate(VALID_SPEC, ("dtype: float32}", "dtype: float32, kinds: [zero_rows]}")))
    assert kinds.chosen(("default",), only, assign, 1) == ("normal", "zero_rows")
    assert kinds.chosen(("large",), only, assign, 0) == ("normal",)  # not a kind x takes
    assert kinds.chosen(("opposed_rows",), spec, assign, 0) == ("normal",)  # nor one it does not list
    opposed = build_spec(mutate(VALID_SPEC, ("dtype: float32}", "dtype: float32, kinds: [large, opposed_rows]}")))
    assert [kinds.chosen(("default",), opposed, assign, i) for i in range(3)] == [
        ("normal", "large"), ("normal", "opposed_rows"), ("normal", "large")]
    assert kinds.leads(opposed, opposed.inputs[0], "opposed_rows", assign)
    assert kinds.parse([]) == ("default",) and kinds.parse(["all"]) == ("all",)
    assert kinds.parse(["large,zero_rows", "normal", "large"]) == ("large", "zero_rows")
    with pytest.raises(ValueError, match="unknown input kind 'wide'"):
        kinds.parse(["large,wide"])


def test_the_other_kinds_are_judged_by_nan_inf_and_the_relative_error_norm():
    ref = np.ones(1000)
    near_zero = ref.copy()
    near_zero[0] = 1 + 5e-3  # one element off by 5e-3: fails per element, a rel_err of 1.6e-4
    assert not compare.compare(near_zero, ref, 1e-4, 1e-4)["passed"]
    assert compare.compare(near_zero, ref, 1e-4, 1e-4, normwise=1e-3)["passed"]
    broken = ref.copy()
    broken[3] = np.nan
    assert compare.compare(broken, ref, 1e-4, 1e-4, normwise=1e-3)["message"] == (
        "1 element(s) are NaN/Inf where the reference is finite")
    off = ref * 1.01
    assert compare.compare(off, ref, 1e-4, 1e-4, normwise=1e-3)["message"] == (
        "rel_err 0.01 is above 0.001; worst at (0,): got 1.01, expected 1")
    inf_ref = ref.copy()
    inf_ref[7] = np.inf
    assert compare.compare(ref, inf_ref, 1e-4, 1e-4, normwise=1e-3)["message"] == (
        "1 element(s) are not NaN/Inf as the reference's are")


def test_large_normal_inputs_are_drawn_on_the_device_reproducibly(monkeypatch):
    """Above DEVICE_THRESHOLD elements a normal input is drawn by jax.random from the input's
    own stream: the same data every time, another input's differs, the dtype and the spec's mean
    and std kept; below it the host draws as before."""
    import jax

    monkeypatch.setattr(inputs, "DEVICE_THRESHOLD", 1000)
    big = inputs.make_input(TASK, Op(), (40, 64), "bfloat16", {}, {})
    assert isinstance(big, jax.Array) and big.dtype == jax.numpy.bfloat16 and big.shape == (40, 64)
    values = np.asarray(big).astype(np.float64)
    assert np.array_equal(values, data("normal", shape=(40, 64), dtype="bfloat16"))
    assert not np.array_equal(values, data("normal", shape=(40, 64), dtype="bfloat16", op=Op("y")))
    assert 0.9 < values.std() < 1.1 and abs(values.mean()) < 0.1
    init = type("Init", (), {"same_as": None, "code": None, "kind": inputs.InitKind.NORMAL, "mean": 3.0, "std": 0.5})
    shifted = data("normal", shape=(40, 64), op=Op(init=init()))
    assert 2.9 < shifted.mean() < 3.1 and 0.45 < shifted.std() < 0.55
    host = inputs.rng_for(TASK, "x").standard_normal((10, 64)).astype(np.float32)  # 640 elements: the host's draw
    assert np.array_equal(data("normal", shape=(10, 64)), host)
