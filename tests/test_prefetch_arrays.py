"""Scalar-prefetch arrays of any rank: a `[B, S]` page table read `pt[b, i]` in an index map and
`page_table_ref[b, i]` in the body, bounds-checked over its declared range and run on the CPU
(interpret mode, and mosaic_tpu in TPU interpret mode)."""

from __future__ import annotations

import json

import pytest

from conftest import mutate

PAGED_SPEC = """\
kspec: 1
name: paged_gather
doc: |
  Gather pages per sequence, as paged attention reads its KV cache: row block i of
  sequence b is page page_table[b, i] of the pool, plus that page number (the body reads
  the table too).
params:
  pg: {default: 8, doc: Rows per page.}
inputs:
  page_table: {shape: [B, S], dtype: int32, prefetch: true, init: {kind: index, bound: "R // pg"}}
  pool: {shape: [R, D], dtype: float32}
outputs:
  o: {shape: [B, "S * pg", D], dtype: pool}
constraints:
  - {expr: "R % pg == 0", message: "R must be a multiple of pg"}
grid: {b: B, i: S}
blocks:
  pool: {block_shape: [pg, D], index_map: "b, i, pt -> (pt[b, i], 0)"}
  o: {block_shape: [null, pg, D], index_map: "b, i, pt -> (b, i, 0)"}
body: |
  o_ref[...] = pool_ref[...] + page_table_ref[b, i].astype(jnp.float32)
reference: |
  pages = pool.reshape(R // pg, pg, D)[page_table] + page_table[:, :, None, None].astype(pool.dtype)
  return pages.reshape(B, S * pg, D)
cases:
  - {name: small, B: 3, S: 4, R: 64, D: 128}
backends:
  interpret:
  mosaic_tpu:
"""
MAP = "(pt[b, i], 0)"


def test_a_two_dimensional_page_table_runs_against_the_reference(kspec, write_spec, tmp_path):
    write_spec(PAGED_SPEC, "paged_gather")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    text = (tmp_path / "generated" / "paged_gather" / "mosaic_tpu.py").read_text()
    assert "pl.BlockSpec((pg, D), lambda b, i, pt: (pt[b, i], 0))" in text
    report = tmp_path / "run.json"
    r = kspec("verify", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    rows = [(x["backend"], x["status"]) for x in json.loads(report.read_text())["results"]]
    assert rows == [("interpret", "pass"), ("mosaic_tpu", "pass")]


@pytest.mark.parametrize("index_map, expected", [
    ("(pt[i], 0)", "specs/paged_gather.yaml:18:43: error[E303]: case `small`: pool.index_map: `pt[i]` gives 1 index to "
                   "an array of rank 2\n"),
    ("(pt[b, i + 1], 0)", "specs/paged_gather.yaml:18:43: error[E303]: case `small`: pool.index_map: `pt[b, i + 1]` "
                          "reads index 4 of 4 along dim 1\n"),
    ("(pt[b, i] + 1, 0)", "specs/paged_gather.yaml:18:43: error[E502]: case `small`: pool.index_map at grid point (0, 0) "
                          "with pt[...] = 7 gives block index (8, 0); dim 0 is 8, valid 0..7\n"
                          "  = help: pool dim 0 has 64 elements in blocks of 8\n"),
])
def test_page_table_reads_are_checked_against_its_shape_and_range(kspec, write_spec, index_map, expected):
    write_spec(mutate(PAGED_SPEC, (MAP, index_map)), "paged_gather")
    r = kspec("check")
    assert (r.rc, r.out) == (2, expected + "1 error(s) in 1 of 1 spec(s)\n")
