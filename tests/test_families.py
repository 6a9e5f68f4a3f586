"""Shape families (`families:`): expansion, their checks (E510, E501), and `kspec bench --sweep` and
`kspec tune --sweep` over them, on the CPU (interpret mode)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import build_spec

SPEC = """\
kspec: 1
name: scale_even
params:
  bs: {default: 4, choices: [2, 4], doc: Rows per program.}
inputs:
  x: {shape: [M, N], dtype: [float32]}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M <= 64", message: "M must be at most 64"}
grid: {i: "cdiv(M, bs)"}
blocks:
  x: {block_shape: [bs, N], index_map: "i -> (i, 0)"}
  o: {block_shape: [bs, N], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
cases:
  - {name: even, M: 8, N: 16}
families:
  small:
    dims: {M: [4, 8], N: [3, 4, 16]}
    dtype: float32
backends:
  interpret:
    constraints:
      - {expr: "N % 2 == 0", message: "interpret runs even widths only"}
"""


def test_a_family_leaves_optional_inputs_out():
    """`absent:` on a family: every shape leaves those optional inputs out, as a case does; a name that is
    not an optional input is E442 at the family's shapes."""
    from kspec.codegen.checks import wrapper

    from test_optional_inputs import BIASED

    text = BIASED + "families:\n  plain:\n    dims: {M: [16, 32], N: [128]}\n    absent: [bias]\n"
    spec = build_spec(text)
    assert [(c.name, c.absent) for c in spec.sweep] == [("plain_M16_N128", ("bias",)), ("plain_M32_N128", ("bias",))]
    assert not wrapper.check(spec)
    found = wrapper.check(build_spec(text.replace("    absent: [bias]\n", "    absent: [x]\n")))
    assert [d.message for d in found] == ["case `plain_M16_N128`: absent `x` is not an optional input",
                                          "case `plain_M32_N128`: absent `x` is not an optional input"]


def test_a_family_expands_to_named_cases_crossed_zipped_and_over_ranges():
    spec = build_spec(SPEC.replace("""    dims: {M: [4, 8], N: [3, 4, 16]}
    dtype: float32""", """    dims: {M: [4, 8], N: [3, 4, 16]}
    dtype: float32
  ranged:
    dims: {M: {from: 2, to: 40, times: 4}, N: {from: 8, to: 20, step: 6}}
    combine: zip
    dtype: [float32, bfloat16]
    params: {bs: 2}"""))
    small, ranged = spec.families
    assert [c.name for c in small.cases] == [
        "small_M4_N3", "small_M4_N4", "small_M4_N16", "small_M8_N3", "small_M8_N4", "small_M8_N16"]
    assert [(c.dims, c.dtype, c.params) for c in ranged.cases] == [
        ({"M": 2, "N": 8}, "float32", {"bs": 2}), ({"M": 2, "N": 8}, "bfloat16", {"bs": 2}),
        ({"M": 8, "N": 14}, "float32", {"bs": 2}), ({"M": 8, "N": 14}, "bfloat16", {"bs": 2}),
        ({"M": 32, "N": 20}, "float32", {"bs": 2}), ({"M": 32, "N": 20}, "bfloat16", {"bs": 2})]
    assert spec.sweep == small.cases + ranged.cases
    assert spec.cases[0].name == "even"  # verify's cases are not the families'


@pytest.mark.parametrize("family, message", [
    ("    dims: {M: [4, 8], N: [3, 4, 16]}\n    combine: zip",
     "specs/tiny.yaml:23:11: error[E510]: family `small` zips dims of different lengths (M: 2, N: 3)"),
    ("    dims: {M: {from: 1, to: 1000, step: 1}, N: [1, 2]}",
     "specs/tiny.yaml:23:11: error[E510]: family `small` has 2000 shapes; at most 512 allowed"),
    ("    dims: {M: {from: 9, to: 8, times: 2}, N: [1, 2]}",
     "specs/tiny.yaml:23:15: error[E510]: family `small`: dim M's range from 9 to 8 is empty"),
    ("    dims: {M: [4, 80, 90], N: [3]}",
     "specs/tiny.yaml:22:3: error[E501]: case `small_M80_N3` (M=80): M must be at most 64"),
])
def test_family_diagnostics(kspec, write_spec, family, message):
    path = write_spec(SPEC.replace("    dims: {M: [4, 8], N: [3, 4, 16]}", family))
    r = kspec("check", str(path))
    assert r.rc == 2 and r.out.splitlines()[0] == message, r.both
    assert r.out.count("error[") == 1  # one diagnostic per family and problem, not one per shape


def test_bench_sweep_sums_up_each_kernel_and_counts_the_shapes_auto_runs_on_the_reference(kspec, write_spec, tmp_path):
    path = write_spec(SPEC)
    assert kspec("generate", str(path)).rc == 0
    r = kspec("bench", str(path), "--sweep", "--samples", "3", "--seed", "1", "--json", "out.json", timeout=300)
    assert r.rc == 0, r.both
    rows = [line for line in r.out.splitlines() if line.startswith("| scale_even | interpret | float32 | 6 |")]
    assert len(rows) == 1 and rows[0].split(" | ")[4:6] == ["2", "0"], r.out  # 2 shapes on the reference, 0 errors
    report = json.loads((tmp_path / "out.json").read_text())
    (summary,) = report["sweep"]
    assert (summary["shapes"], summary["fallbacks"], summary["errors"]) == (6, 2, 0)
    fallbacks = [x for x in report["results"] if x.get("fallback")]
    assert sorted(x["case"] for x in fallbacks) == ["small_M4_N3", "small_M8_N3"]
    assert {x["message"] for x in fallbacks} == {"auto runs the reference here: interpret runs even widths only (N=3)"}
    timed = [x["speedup"] for x in report["results"] if x.get("ms") is not None]
    assert len(timed) == 4 and summary["worst"] == min(timed + [1.0])


def test_a_sweep_split_in_shards_takes_each_shape_once(kspec, write_spec, tmp_path):
    """`--shard I/N`: the family's shapes by size (M x N), the largest first, each to the lightest shard:
    M8 N16 (128) to 0, then 64, 32, 24 and 16 to 1, and M4 N3 (12) to 0 again. Together the shards hold
    every shape once; a shard past the shapes, or not I/N, is a usage error."""
    from kspec.codegen.verify import shard_names

    path = write_spec(SPEC)
    assert kspec("generate", str(path)).rc == 0
    got = []
    for i in (0, 1):
        r = kspec("bench", str(path), "--sweep", "--shard", f"{i}/2", "--samples", "3", "--seed", "1", "--json",
                  f"part{i}.json", timeout=300)
        assert r.rc == 0, r.both
        got.append(sorted(x["case"] for x in json.loads((tmp_path / f"part{i}.json").read_text())["results"]))
    assert got == [["small_M4_N3", "small_M8_N16"], ["small_M4_N16", "small_M4_N4", "small_M8_N3", "small_M8_N4"]]
    assert shard_names({"a": 5, "b": 5, "c": 1}, 1, 2) == ["b"]  # equal sizes go by name, ties to the lower shard
    r = kspec("bench", str(path), "--sweep", "--shard", "6/7")
    assert r.rc == 2 and "error: --shard 6/7 holds none of the 6 case(s)" in r.err, r.both
    r = kspec("tune", str(path), "--sweep", "--shard", "2/2")
    assert r.rc == 2 and "'2/2' is not I/N with 0 <= I < N (e.g. 0/4)" in r.err, r.both


def test_sweep_usage_errors(kspec, write_spec):
    path = write_spec(SPEC.replace("families:\n  small:\n    dims: {M: [4, 8], N: [3, 4, 16]}\n    dtype: float32\n", ""))
    assert kspec("generate", str(path)).rc == 0
    r = kspec("bench", str(path), "--sweep")
    assert r.rc == 2 and "error: --sweep needs specs with `families:`; none of the selected specs declares one" in r.err
    r = kspec("bench", str(path), "--family", "small")
    assert r.rc == 2 and "error: --family needs --sweep" in r.err


def test_case_and_family_together_select_the_named_cases_of_that_family(kspec, write_spec, tmp_path):
    two = SPEC.replace("    dtype: float32\nbackends:", "    dtype: float32\n  wide:\n    dims: {M: [8], N: [32]}\n"
                       "    dtype: float32\nbackends:")
    path = write_spec(two)
    assert kspec("generate", str(path)).rc == 0
    r = kspec("bench", str(path), "--sweep", "--family", "small", "--case", "small_M8_N16", "--samples", "3",
              "--seed", "1", "--json", "out.json", timeout=300)
    assert r.rc == 0, r.both
    assert [x["case"] for x in json.loads((tmp_path / "out.json").read_text())["results"]] == ["small_M8_N16"]
    r = kspec("bench", str(path), "--sweep", "--family", "small", "--case", "wide_M8_N32")
    assert r.rc == 2 and "error: no case named wide_M8_N32 in the families small" in r.err, r.both


def test_tune_sweep_records_each_bucket_and_a_rerun_skips_them(kspec, write_spec, tmp_path):
    path = write_spec(SPEC.replace("N: [3, 4, 16]", "N: [4, 16]"))
    assert kspec("generate", str(path)).rc == 0
    args = ("tune", str(path), "--sweep", "--family", "small", "--backend", "interpret", "--samples", "3", "--seed", "2")
    r = kspec(*args, timeout=300)
    assert r.rc == 0, r.both
    assert r.out.count("2 configs, 0 pruned statically, 2 to try") == 4  # 2 x 2 buckets
    (table,) = list((tmp_path / "tuning" / "scale_even").glob("*.json"))
    entries = json.loads(table.read_text())["entries"]
    assert {tuple(e["bucket"]) for e in entries} == {(4, 4), (4, 16), (8, 4), (8, 16)} and len(entries) == 8
    r = kspec(*args, timeout=300)
    assert r.rc == 0 and r.out.count("0 to try") == 4, r.out


def test_tune_sweep_tunes_each_shape_of_a_bucket_every_bucket_once_first(kspec, write_spec, tmp_path):
    """N 12 and 16 share bucket 16: both are tuned, each config at each, and every bucket at its first
    shape before any at its second; the second shape's summary names the config for the bucket."""
    path = write_spec(SPEC.replace("N: [3, 4, 16]", "N: [12, 16]"))
    assert kspec("generate", str(path)).rc == 0
    r = kspec("tune", str(path), "--sweep", "--family", "small", "--backend", "interpret", "--samples", "3",
              "--seed", "2", timeout=300)
    assert r.rc == 0, r.both
    assert re.findall(r"scale_even\[interpret\] (\w+) float32: 2 configs, 0 pruned statically, 2 to try", r.out) == [
        "small_M4_N12", "small_M8_N12", "small_M4_N16", "small_M8_N16"]
    assert len(re.findall(r"^  bucket \[(?:4|8), 16\] over 2 cases: \{'bs': [24]\}, within", r.out, re.M)) == 2


def test_auto_calls_the_reference_where_tuning_measured_it_faster(kspec, write_spec, tmp_path):
    """dispatch.reference_when_faster: at a bucket where the best tuned config ran below 1.0x the
    reference (`kspec tune --sustained`), backend="auto" calls the reference, and says so once."""
    import importlib
    import sys
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    text = SPEC.replace("backends:\n", "dispatch: {reference_when_faster: true}\nbackends:\n")
    path = write_spec(text)
    spec = build_spec(text)
    kind = jax.devices()[0].device_kind
    entry = {"backend": "interpret", "bucket": [8, 16], "case": "even", "dtype": "float32", "fixed": {},
             "jax_version": jax.__version__, "kernel_sha": spec.kernel_sha, "load": "sustained",
             "reference_sha": spec.reference_sha, "message": "", "ms": 2.0, "params": {"bs": 2}, "ref_ms": 1.0, "speedup": 0.5, "speedup_ci95": [0.45, 0.55],
             "status": "pass"}
    table = tmp_path / "tuning" / "scale_even" / f"{kind}.json"
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"kernel": "scale_even", "device_kind": kind, "entries": [entry]}))
    r = kspec("generate", "--out", "slower_out", str(path))
    assert r.rc == 0, r.both
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module("slower_out.scale_even")
        assert pkg._tuning.SLOWER == {(kind, "interpret", "float32", (8, 16), ()): 0.5}
        x = jnp.ones((8, 16))
        with pytest.warns(pkg.KernelFallbackWarning, match=r"^scale_even: calling the reference instead of backend "
                          r"'interpret': kspec tune measured interpret at 0.5x the reference at this shape bucket$"):
            assert np.array_equal(pkg.scale_even(x), x * 2)
        assert pkg._dispatch.choose("auto", x) is None
        assert pkg._dispatch.choose("auto", x, bs=4) == "interpret"  # params given: the kernel asked for
        assert pkg._dispatch.choose("interpret", x) == "interpret"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert pkg._dispatch.choose("auto", jnp.ones((4, 4))) == "interpret"  # another bucket
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == "slower_out" or m.startswith("slower_out.")]:
            del sys.modules[mod]


def test_a_family_tolerance_applies_to_each_of_its_shapes():
    text = SPEC.replace("    dtype: float32\nbackends:", "    dtype: float32\n    tolerance: {float32: {atol: 0.5}}\nbackends:")
    (family,) = build_spec(text).families
    assert {c.name: c.tolerance for c in family.cases}["small_M4_N16"] == {"float32": {"atol": 0.5}}
    assert all(c.tolerance == {} for c in build_spec(SPEC).families[0].cases)
