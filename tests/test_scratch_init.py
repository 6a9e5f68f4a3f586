"""Scratch `init`: an SMEM array set to a constant before the body runs at each grid step, run
on the CPU (interpret mode, and mosaic_tpu in TPU interpret mode)."""

from __future__ import annotations

import json

import pytest

from conftest import declared, mutate

INIT_SPEC = """\
kspec: 1
name: smem_init
doc: |
  o = x * 2 + 1, from SMEM scratch that its init sets before the body runs at each step:
  the scale (2.0) and a counter (-1) that the body adds 2 to.
params:
  bm: 8
inputs:
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
scratch:
  scale: {shape: [2], dtype: float32, memory_space: smem, init: 2.0}
  count: {shape: [2, 3], dtype: int32, memory_space: smem, init: -1}
grid: {i: "M // bm"}
blocks:
  x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
body: |
  count_ref[1, 2] += 2
  o_ref[...] = x_ref[...] * scale_ref[1] + count_ref[1, 2].astype(jnp.float32)
reference: |
  return x * 2 + 1
cases:
  - {name: c, M: 32, N: 128}
backends:
  interpret:
  mosaic_tpu:
"""
COUNT = "count: {shape: [2, 3], dtype: int32, memory_space: smem, init: -1}"


def test_smem_scratch_is_set_before_the_body_at_every_step(kspec, write_spec, tmp_path):
    """Four grid steps: a counter that kept its value from step to step would give x * 2 + 3, + 5, ..."""
    write_spec(INIT_SPEC, "smem_init")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    text = (tmp_path / "generated" / "smem_init" / "mosaic_tpu.py").read_text()
    assert ("def _smem_init_kernel(x_ref, o_ref, scale_ref, count_ref, *, bm, M, N):\n"
            "    _fill_scratch(scale_ref, 2.0)  # the spec's scratch init, before the body\n"
            "    _fill_scratch(count_ref, -1)  # the spec's scratch init, before the body\n"
            "    count_ref[1, 2] += 2\n") in text
    report = tmp_path / "run.json"
    r = kspec("verify", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    rows = [(x["backend"], x["status"]) for x in declared(json.loads(report.read_text())["results"])]
    assert rows == [("interpret", "pass"), ("mosaic_tpu", "pass")]


@pytest.mark.parametrize("count, expected", [
    ("count: {shape: [2, 3], dtype: int32, init: -1}",
     "specs/smem_init.yaml:16:10: error[E202]: scratch.count is missing required key `memory_space`\n"),
    ("count: {shape: [2, 3], dtype: int32, memory_space: vmem, init: -1}",
     "specs/smem_init.yaml:16:54: error[E200]: scratch.count.memory_space must be one of \"smem\"\n"
     "  = help: did you mean `smem`?\n"),
])
def test_init_is_for_smem_arrays(kspec, write_spec, count, expected):
    write_spec(mutate(INIT_SPEC, (COUNT, count)), "smem_init")
    r = kspec("check")
    assert (r.rc, r.out) == (2, expected + "1 error(s) in 1 of 1 spec(s)\n")
