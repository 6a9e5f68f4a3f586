"""A grid extent read from a prefetched scalar (`grid: [num_tiles]`, `max: cdiv(M, bm)`): the
checks prove bounds and coverage at the bound, the kernel runs the call's value."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import mutate

TILES_SPEC = """\
kspec: 1
name: scale_tiles
doc: |
  Doubles the first num_tiles row blocks of x, in place: the grid has num_tiles steps,
  a prefetched scalar of at most cdiv(M, bm), and the rest of x is left as it was.
params:
  bm: 8
inputs:
  num_tiles: {shape: [1], dtype: int32, prefetch: true, max: "cdiv(M, bm)", init: {kind: index, bound: "cdiv(M, bm) + 1"}}
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, N], dtype: x}
input_output_aliases: {o: x}
grid: [num_tiles]
blocks:
  x: {block_shape: [bm, N], index_map: "i, nt -> (i, 0)"}
  o: {block_shape: [bm, N], index_map: "i, nt -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  rows = jnp.arange(M)[:, None] < num_tiles[0] * bm
  return jnp.where(rows, x * 2, x)
cases:
  - {name: c, M: 64, N: 128}
backends:
  interpret:
  mosaic_tpu:
"""
MAX = 'max: "cdiv(M, bm)"'

CALL = """\
import jax.numpy as jnp, numpy as np
from generated.scale_tiles.interpret import scale_tiles
x = jnp.ones((64, 128), jnp.float32)
out = np.asarray(scale_tiles(jnp.array([3], jnp.int32), x))
print(out[:, 0].tolist())
"""


def test_the_grid_runs_the_prefetched_extent(kspec, write_spec, tmp_path):
    write_spec(TILES_SPEC, "scale_tiles")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    assert "            grid=(num_tiles[0],),\n" in (tmp_path / "generated" / "scale_tiles" / "mosaic_tpu.py").read_text()
    report = tmp_path / "run.json"
    r = kspec("verify", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    rows = [(x["backend"], x["status"]) for x in json.loads(report.read_text())["results"]]
    assert rows == [("interpret", "pass"), ("mosaic_tpu", "pass")]
    run = subprocess.run([sys.executable, "-c", CALL], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [2.0] * 24 + [1.0] * 40  # three blocks of 8 rows doubled


@pytest.mark.parametrize("change, expected", [
    ((MAX, 'max: "cdiv(M, bm) + 1"'),
     "specs/scale_tiles.yaml:16:40: error[E502]: case `c`: x.index_map at grid point (8,) gives block index (8, 0); "
     "dim 0 is 8, valid 0..7\n  = help: x dim 0 has 64 elements in blocks of 8\n"
     "specs/scale_tiles.yaml:17:40: error[E502]: case `c`: o.index_map at grid point (8,) gives block index (8, 0); "
     "dim 0 is 8, valid 0..7\n  = help: o dim 0 has 64 elements in blocks of 8\n2 error(s)"),
    ((MAX, 'max: "cdiv(M, bm) - 1"'),
     "specs/scale_tiles.yaml:17:3: error[E503]: case `c`: output o is not fully written: block (7, 0) "
     "(elements [56:64, 0:128]) is never visited by the grid\n"
     "  = help: make the grid and index_map reach every block of the output\n1 error(s)"),
    (("shape: [1], dtype: int32", "shape: [2], dtype: int32"),
     "specs/scale_tiles.yaml:9:3: error[E410]: scalar-prefetch input num_tiles has `max` (a grid extent) but shape [2], "
     "not [1]\n  = help: a prefetched input holds indices: a shape such as [n] or [B, n], an int dtype, "
     "init {kind: index, bound: ...}\n1 error(s)"),
    (("x: {shape: [M, N], dtype: float32}", 'x: {shape: [M, N], dtype: float32, max: "M"}'),
     "specs/scale_tiles.yaml:10:3: error[E410]: input x has `max` but is not scalar-prefetched\n"
     "  = help: a grid extent read in the kernel is a `prefetch: true` input of shape [1]\n1 error(s)"),
])
def test_the_checks_use_the_bound(kspec, write_spec, change, expected):
    write_spec(mutate(TILES_SPEC, change), "scale_tiles")
    r = kspec("check")
    assert (r.rc, r.out) == (2, expected + " in 1 of 1 spec(s)\n")
