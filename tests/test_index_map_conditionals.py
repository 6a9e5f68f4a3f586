"""Index maps that choose with a conditional, `select(c, a, b)` or `a if c else b`: checked over
the grid like any index map, rendered as jnp.where, and run on the CPU (interpret mode, and
mosaic_tpu in TPU interpret mode)."""

from __future__ import annotations

import json

from conftest import mutate

PICK_SPEC = """\
kspec: 1
name: pick_blocks
doc: |
  Output block i is block i - 1 of x (block 0 for i = 0) plus a block of y: the mirror
  block for even i, block i itself for odd i. Both index maps choose with a conditional.
params:
  bm: 8
inputs:
  x: {shape: [M, N], dtype: float32}
  y: {shape: [M, N], dtype: x}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
grid: {i: "M // bm"}
blocks:
  x: {block_shape: [bm, N], index_map: "i -> (select(i > 0, i - 1, 0), 0)"}
  y: {block_shape: [bm, N], index_map: "i -> (M // bm - 1 - i if i % 2 == 0 else i, 0)"}
  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...] + y_ref[...]
reference: |
  g = M // bm
  xb, yb = x.reshape(g, bm, N), y.reshape(g, bm, N)
  mirror = jnp.array([g - 1 - i if i % 2 == 0 else i for i in range(g)])
  return (jnp.concatenate([xb[:1], xb[:-1]]) + yb[mirror]).reshape(M, N)
cases:
  - {name: even, M: 64, N: 128}
  - {name: odd, M: 40, N: 256}
backends:
  interpret:
  mosaic_tpu:
"""


def test_conditional_index_maps_render_as_jnp_where_and_match_the_reference(kspec, write_spec, tmp_path):
    write_spec(PICK_SPEC, "pick_blocks")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    for backend in ("interpret", "mosaic_tpu"):
        text = (tmp_path / "generated" / "pick_blocks" / f"{backend}.py").read_text()
        assert "pl.BlockSpec((bm, N), lambda i: (jnp.where(i > 0, i - 1, 0), 0))" in text
        assert "pl.BlockSpec((bm, N), lambda i: (jnp.where(i % 2 == 0, M // bm - 1 - i, i), 0))" in text
    report = tmp_path / "run.json"
    r = kspec("verify", "--case", "odd", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    rows = [(x["backend"], x["case"], x["status"]) for x in json.loads(report.read_text())["results"]]
    assert rows == [("interpret", "odd", "pass"), ("mosaic_tpu", "odd", "pass")]


def test_a_conditional_that_steps_outside_the_array_is_located(kspec, write_spec):
    write_spec(mutate(PICK_SPEC, ("select(i > 0, i - 1, 0)", "select(i > 0, i - 1, -1)")), "pick_blocks")
    r = kspec("check")
    assert (r.rc, r.out) == (2, (
        "specs/pick_blocks.yaml:17:40: error[E502]: case `even`: x.index_map at grid point (0,) gives block index "
        "(-1, 0); dim 0 is -1, valid 0..7\n"
        "  = help: x dim 0 has 64 elements in blocks of 8\n"
        "specs/pick_blocks.yaml:17:40: error[E502]: case `odd`: x.index_map at grid point (0,) gives block index "
        "(-1, 0); dim 0 is -1, valid 0..4\n"
        "  = help: x dim 0 has 40 elements in blocks of 8\n"
        "2 error(s) in 1 of 1 spec(s)\n"))


def test_a_conditional_outside_an_index_map_is_refused(kspec, write_spec):
    write_spec(mutate(PICK_SPEC, ('grid: {i: "M // bm"}', 'grid: {i: "M // bm if M else 1"}')), "pick_blocks")
    r = kspec("check")
    assert (r.rc, r.out) == (2, "specs/pick_blocks.yaml:15:12: error[E300]: a conditional (`a if c else b`) outside an index map is "
                                "not allowed in an expression\n"
                                "1 error(s) in 1 of 1 spec(s)\n")
