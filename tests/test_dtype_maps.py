"""Dtype maps: an output's and a scratch buffer's dtype looked up from an input's (int8 rows
summed in int32), the generated function's out_dtype option, and E419."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import declared, mutate

SUM_SPEC = """\
kspec: 1
name: sum_rows
doc: |
  Sums x's rows in groups of 8: row r of o is the sum of rows r, r + 8, r + 16, ... of x.
  The sum accumulates over the grid in a scratch buffer whose dtype, like o's, is looked
  up from x's: int8 rows add up in int32.
params:
  bm: 32
inputs:
  x: {shape: [M, N], dtype: [int8, float32]}
outputs:
  o: {shape: [8, N], dtype: {from: x, map: {int8: int32, float32: float32}}}
scratch:
  acc: {shape: [8, N], dtype: {from: x, map: {int8: int32, float32: float32}}}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
grid: {k: "M // bm"}
blocks:
  x: {block_shape: [bm, N], index_map: "k -> (k, 0)"}
  o: {block_shape: [8, N], index_map: "k -> (0, 0)"}
body: |
  @pl.when(k == 0)
  def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += x_ref[...].astype(acc_ref.dtype).reshape(bm // 8, 8, N).sum(axis=0)

  @pl.when(k == pl.num_programs(0) - 1)
  def _():
      o_ref[...] = acc_ref[...].astype(o_ref.dtype)
reference: |
  acc = jnp.int32 if x.dtype == jnp.int8 else jnp.float32
  return x.astype(acc).reshape(M // 8, 8, N).sum(axis=0)
cases:
  - {name: c, M: 128, N: 256}
backends:
  interpret:
  mosaic_tpu:
    compiler_params: {dimension_semantics: [arbitrary]}
"""

CALLS = """\
import jax.numpy as jnp, numpy as np
from generated.sum_rows import sum_rows
from generated.sum_rows.interpret import sum_rows as on_interpret
x = jnp.asarray(np.arange(64 * 128).reshape(64, 128) % 100 - 50, jnp.int8)
want = np.asarray(x, np.int64).reshape(8, 8, 128).sum(axis=0)
for out in (sum_rows(x), sum_rows(x, out_dtype=jnp.float32), on_interpret(x, out_dtype="int16"),
            sum_rows(x, out_dtype=jnp.float32, bm=24)):  # bm=24: no backend runs it, the reference does
    assert (np.asarray(out, np.int64) == want).all()
    print(out.dtype)
"""


def test_mapped_dtypes_follow_the_input_and_out_dtype_overrides_them(kspec, write_spec, tmp_path):
    write_spec(SUM_SPEC, "sum_rows")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    text = (tmp_path / "generated" / "sum_rows" / "mosaic_tpu.py").read_text()
    assert "pltpu.VMEM((8, N), {'int8': jnp.int32, 'float32': jnp.float32}[jnp.dtype(x.dtype).name])" in text
    assert "def sum_rows(x, *, bm=32, interpret=False, out_dtype=None):" in text
    report = tmp_path / "run.json"
    r = kspec("verify", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    rows = [(x["backend"], x["dtype"], x["status"]) for x in declared(json.loads(report.read_text())["results"])]
    assert rows == [("interpret", "int8", "pass"), ("interpret", "float32", "pass"),
                    ("mosaic_tpu", "int8", "pass"), ("mosaic_tpu", "float32", "pass")]
    run = subprocess.run([sys.executable, "-c", CALLS], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["int32", "float32", "int16", "float32"]


def test_a_dtype_map_must_read_an_input_and_cover_its_dtypes(kspec, write_spec):
    spec = mutate(SUM_SPEC, ("dtype: {from: x, map: {int8: int32, float32: float32}}}", "dtype: {from: y, map: {int8: int32}}}"))
    write_spec(mutate(spec, ("{from: x, map: {int8: int32, float32: float32}}", "{from: x, map: {int8: int32}}")), "sum_rows")
    r = kspec("check")
    assert (r.rc, r.out) == (2, (
        "specs/sum_rows.yaml:12:29: error[E419]: o: dtype map reads `y`, which is not an input with dtypes of its own\n"
        "  = help: name one of: x\n"
        "specs/sum_rows.yaml:14:3: error[E419]: scratch acc: dtype map has no entry for x of dtype float32\n"
        "  = help: add `float32: <dtype>` to the map\n"
        "2 error(s) in 1 of 1 spec(s)\n"))


def test_an_input_takes_no_dtype_map(kspec, write_spec):
    write_spec(mutate(SUM_SPEC, ("dtype: [int8, float32]}", "dtype: {from: x, map: {int8: int8}}}")), "sum_rows")
    r = kspec("check")
    assert (r.rc, r.out) == (2, "specs/sum_rows.yaml:10:29: error[E203]: inputs.x.dtype must be a dtype name, a list of "
                                "dtype names, or an input's name\n1 error(s) in 1 of 1 spec(s)\n")
