"""`kspec verify --inputs`: input kinds beyond standard normal data (large magnitudes, rows of
one value, zero rows, very negative rows), a spec's `kinds` per input, and the planted bugs
that only those kinds find. The data itself is tested in tests/unit/run/test_inputs.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, declared, invoke_kspec, mutate

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


# Inputs whose data has structure: a window [start, length) per row, segment ids equal in two inputs,
# and group sizes that sum to S. The kernel zeroes x wherever the structure it relies on breaks (a
# window with its end before its start keeps nothing, unequal ids or sizes that miss S zero the row),
# so verify fails unless every input holds it; x alone takes input kinds.
WINDOWS = """\
kspec: 1
name: windows
doc: Keeps each row's window [start, length) of x; zero elsewhere.
inputs:
  x: {shape: [B, S], dtype: float32, kinds: [large]}
  start: {shape: [B], dtype: int32, init: {kind: index, bound: S}}
  length: {shape: [B], dtype: int32, init: {kind: index, low: "start + 1", bound: "S + 1"}}
  q_ids: {shape: [S], dtype: int32, init: {kind: index, bound: 4}}
  kv_ids: {shape: [S], dtype: int32, init: {same_as: q_ids}}
  sizes:
    shape: [G]
    dtype: int32
    init:
      code: |
        cuts = jnp.sort(jax.random.randint(key, (G - 1,), 0, S + 1))
        edges = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts, jnp.full((1,), S, jnp.int32)])
        return jnp.diff(edges).astype(dtype)
outputs:
  o: {shape: [B, S], dtype: x}
grid: [1]
blocks:
  x: {block_shape: [B, S], index_map: "i -> (0, 0)"}
  start: {block_shape: [B], index_map: "i -> (0,)"}
  length: {block_shape: [B], index_map: "i -> (0,)"}
  q_ids: {block_shape: [S], index_map: "i -> (0,)"}
  kv_ids: {block_shape: [S], index_map: "i -> (0,)"}
  sizes: {block_shape: [G], index_map: "i -> (0,)"}
  o: {block_shape: [B, S], index_map: "i -> (0, 0)"}
body: |
  col = lax.broadcasted_iota(jnp.int32, (B, S), 1)
  inside = (col >= start_ref[...][:, None]) & (col < length_ref[...][:, None])
  same = jnp.all(q_ids_ref[...] == kv_ids_ref[...]) & (jnp.sum(sizes_ref[...]) == S)
  o_ref[...] = jnp.where(inside & same & (start_ref[...] < length_ref[...])[:, None], x_ref[...], 0.0)
reference: |
  col = jnp.arange(S)[None, :]
  return jnp.where((col >= start[:, None]) & (col < length[:, None]), x, 0.0)
cases:
  - {name: c, B: 8, S: 128, G: 4}
  - {name: one_group, B: 3, S: 40, G: 1}
backends:
  interpret:
"""

# Makes the inputs of the windows spec's cases for several seeds, as the worker does, and prints them.
MAKE = """\
import importlib, json, sys
sys.path.insert(0, ".")
from kspec.codegen.checks import instances
from kspec.codegen.project import compile_spec
from kspec.codegen.run.inputs import make_inputs
from kspec.codegen.run.tasks import RunTask
from pathlib import Path
spec = compile_spec(Path("specs/windows.yaml")).spec
ref = importlib.import_module("generated.windows.reference")
out = []
for index, case in enumerate(spec.cases):
    dtypes = {op.name: op.dtypes[0] if op.dtypes else "float32" for op in spec.inputs}
    inst, _ = instances.instantiate(spec, spec.variants["interpret"], case, dtypes)
    for seed in range(5):
        task = RunTask(spec_path="specs/windows.yaml", kernel="windows", backend="interpret", case=case.name,
                       case_index=index, dtypes=tuple(dtypes.items()), dtype_label="float32", seed=seed,
                       out_root="generated")
        made = make_inputs(task, spec, inst, dtypes, (), ref.INITS)
        out.append({"S": case.dims["S"], **{op.name: [str(x.dtype), x.tolist()] for op, x in zip(spec.inputs, made)}})
print(json.dumps(out))
"""


def test_structured_inputs_hold_their_structure_for_every_seed(tmp_path):
    """Group sizes from init code sum to S (some zero, across seeds), kv_ids equal q_ids, and each
    length lies in [start + 1, S + 1): for five seeds of each case, the data differing between seeds."""
    proj = project(tmp_path, texts={"windows": WINDOWS})
    r = subprocess.run([sys.executable, "-c", MAKE], cwd=proj, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert len(runs) == 10
    for run in runs:
        S = run["S"]
        (sizes_dtype, sizes), (_, start), (_, length) = run["sizes"], run["start"], run["length"]
        assert sizes_dtype == "int32" and sum(sizes) == S and min(sizes) >= 0
        assert run["kv_ids"] == run["q_ids"] and set(run["q_ids"][1]) == {0, 1, 2, 3}
        assert all(0 <= s < S and s + 1 <= n <= S for s, n in zip(start, length))
    assert len({str(run["sizes"][1]) for run in runs[:5]}) > 1  # each seed its own sizes
    assert len({str(run["start"][1]) for run in runs[:5]}) > 1
    assert any(0 in run["sizes"][1] for run in runs[:5])  # G - 1 = 3 cuts in [0, 128]: some seeds repeat one


def test_structured_inputs_verify_and_keep_their_structure_under_kinds(tmp_path):
    """The kernel zeroes x where the structure breaks; every seed and the `large` run of x pass."""
    proj = project(tmp_path, texts={"windows": WINDOWS})
    rc, rows, out = verify(proj, "--inputs", "all", "--repeat", "3")
    assert rc == 0, out
    assert sorted((r["case"], r["status"], r["inputs"]) for r in rows) == [
        (case, "pass", ["normal", "large"]) for case in ("c", "one_group") for _ in range(3)]


def test_init_code_of_the_wrong_dtype_is_an_error_naming_the_input(tmp_path):
    wrong = mutate(WINDOWS, ("return jnp.diff(edges).astype(dtype)", "return jnp.diff(edges).astype(jnp.float32)"))
    proj = project(tmp_path, texts={"windows": wrong})
    rc, rows, _ = verify(proj, "--case", "c")
    assert rc == 1
    assert [(r["status"], r["message"]) for r in rows] == [
        ("error", "InitError: input sizes: its init code returned float32[4], but sizes is int32[4] here")]


@pytest.mark.parametrize("edit, expected", [
    (("same_as: q_ids", "same_as: q_id"),
     ["specs/windows.yaml:9:44: error[E411]: kv_ids.init: `same_as` names unknown input `q_id`",
      "  = help: did you mean `q_ids`?"]),
    (('low: "start + 1"', 'low: "stat + 1"'),
     ["specs/windows.yaml:7:63: error[E411]: length.init: unknown name `stat`", "  = help: did you mean `start`?"]),
    (("init: {kind: index, bound: S}}", 'init: {kind: index, bound: "length"}}'),
     ["specs/windows.yaml:6:43: error[E450]: input initialisers read each other in a cycle: start -> length -> start",
      "  = help: make one of them from dims and params alone"]),
    (("kv_ids: {shape: [S],", "kv_ids: {shape: [B],"),
     ["specs/windows.yaml:9:44: error[E451]: kv_ids.init: same_as q_ids, of shape [S], but kv_ids has shape [B]",
      "  = help: give kv_ids the shape of q_ids"]),
    (("kv_ids: {shape: [S], dtype: int32,", "kv_ids: {shape: [S], dtype: int8,"),
     ["specs/windows.yaml:9:43: error[E451]: kv_ids.init: same_as q_ids, of dtype int32, but kv_ids has dtype int8",
      "  = help: write `dtype: q_ids`"]),
    (("cuts = jnp.sort", "import torch\n        cuts = jnp.sort"),
     ["specs/windows.yaml:15:9: error[E601]: sizes.init.code: import of `torch`",
      "  = help: generated modules may import only jax, numpy and the standard library"]),
    (("(G - 1,)", "(H - 1,)"),
     ["specs/windows.yaml:15:50: error[E602]: sizes.init.code: unknown name `H`",
      "  = help: a name the code reads must be bound in it, or be a ref, param, dim, grid index, input, import of "
      "the generated module or a builtin"]),
    (("return jnp.diff", "jnp.diff"),
     ["specs/windows.yaml:15:9: error[E452]: sizes.init.code: returns nothing; it must return the data of sizes",
      "  = help: end it with `return <array>`, or write one expression"]),
    (("init: {kind: index, bound: 4}}", "init: {kind: index, bound: 4}, kinds: [large]}"),
     ["specs/windows.yaml:8:75: error[E453]: q_ids.kinds: kv_ids.init reads its values; an input kind would break "
      "that structure", "  = help: drop `kinds`, or write `kinds: []`"]),
    (("init: {same_as: q_ids}}", "init: {same_as: q_ids}, kinds: [large]}"),
     ["specs/windows.yaml:9:69: error[E453]: kv_ids.kinds: its data is made by `same_as`; an input kind would "
      "break that structure", "  = help: drop `kinds`, or write `kinds: []`"]),
    (("x: {shape: [B, S], dtype: float32, kinds: [large]}", "x: {shape: [B, S], dtype: float32, init: {low: 1}}"),
     ["specs/windows.yaml:5:44: error[E411]: x.init: has none of `kind`, `code` and `same_as`; an initialiser has "
      "exactly one", "  = help: add `kind: normal`, `code: ...` or `same_as: <input>`"]),
    (("init: {same_as: q_ids}}", "init: {same_as: q_ids, kind: zeros}}"),
     ["specs/windows.yaml:9:44: error[E411]: kv_ids.init: has `kind` and `same_as`; an initialiser has exactly one "
      "of `kind`, `code` and `same_as`", "  = help: keep the one that says what the data is"]),
])
def test_structured_inits_are_checked(tmp_path, edit, expected):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "windows.yaml").write_text(mutate(WINDOWS, edit))
    r = invoke_kspec("check", "specs/windows.yaml", cwd=tmp_path)
    assert r.rc == 2 and r.out.splitlines()[:-1] == expected, r.out


def test_a_prefetched_input_is_bounds_checked_from_its_low(tmp_path):
    """The index maps that read a prefetched input are checked with all its entries at each end of
    its range, [low, bound): a low of -1 is out of bounds, though the high end is in them."""
    library = (Path(__file__).resolve().parent.parent / "specs" / "gather_rows.yaml").read_text()
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "gather_rows.yaml").write_text(mutate(
        library, ('init: {kind: index, bound: "R // bm"}', 'init: {kind: index, low: -1, bound: "R // bm"}')))
    r = invoke_kspec("check", "specs/gather_rows.yaml", cwd=tmp_path)
    assert r.rc == 2
    assert r.out.splitlines()[:2] == [
        "specs/gather_rows.yaml:19:44: error[E502]: case `square`: table.index_map at grid point (0,) with "
        "idx[...] = -1 gives block index (-1, 0); dim 0 is -1, valid 0..15",
        "  = help: table dim 0 has 128 elements in blocks of 8"]


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


# An input made by init code from another input's data (as a backward kernel's `o` and `lse` are made
# from q, k and v): the kernel keeps x only where y is 2 x + 1, so verify fails unless y is made from
# the very x of the run, the `large` one included.
DERIVED = """\
kspec: 1
name: derived
doc: Keeps x where y = 2 x + 1.
inputs:
  x: {shape: [N], dtype: float32, kinds: [large]}
  y: {shape: [N], dtype: x, init: {code: "(2 * x + 1).astype(dtype)"}}
outputs:
  o: {shape: [N], dtype: x}
grid: [1]
blocks:
  x: {block_shape: [N], index_map: "i -> (0,)"}
  y: {block_shape: [N], index_map: "i -> (0,)"}
  o: {block_shape: [N], index_map: "i -> (0,)"}
body: |
  o_ref[...] = jnp.where(y_ref[...] == 2 * x_ref[...] + 1, x_ref[...], 0.0)
reference: |
  return x
cases:
  - {name: c, N: 64}
backends:
  interpret:
"""


def test_init_code_computes_from_another_inputs_data_in_every_run(tmp_path):
    """y's init code reads x: it is made after x, from the x of each run (normal and `large`), and
    the generated initialiser takes x as an argument."""
    proj = project(tmp_path, texts={"derived": DERIVED})
    rc, rows, out = verify(proj, "--inputs", "all", "--repeat", "2")
    assert rc == 0, out
    assert sorted((r["status"], r["inputs"]) for r in rows) == [("pass", ["normal", "large"])] * 2
    assert "def derived_init_y(key, dtype, x):" in (proj / "generated" / "derived" / "reference.py").read_text()


def test_init_code_that_reads_inputs_in_a_cycle_is_refused(tmp_path):
    cycle = mutate(DERIVED, ("x: {shape: [N], dtype: float32, kinds: [large]}",
                             'x: {shape: [N], dtype: float32, init: {code: "(y - 1) / 2"}}'))
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "derived.yaml").write_text(cycle)
    r = invoke_kspec("check", "specs/derived.yaml", cwd=tmp_path)
    assert r.rc == 2
    assert r.both.splitlines()[:2] == [
        "specs/derived.yaml:5:41: error[E450]: input initialisers read each other in a cycle: x -> y -> x",
        "  = help: make one of them from dims and params alone"]
