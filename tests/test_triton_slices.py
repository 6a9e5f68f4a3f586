"""E711 (Triton block dims are powers of two) is judged by how the body uses a block: Pallas
Triton lowers a block of 384 that the body only loads and stores in slices of 128
(`x_ref[pl.ds(s * 128, 128)]`), but not one it reads whole (`x_ref[...]`)."""

from __future__ import annotations

import json

from conftest import declared, mutate

SLICES_SPEC = """\
kspec: 1
name: scale_slices
doc: Doubles a vector, each block of 384 in three slices of 128.
params:
  bs: 384
  sl: 128
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  for s in range(bs // sl):
      o_ref[pl.ds(s * sl, sl)] = x_ref[pl.ds(s * sl, sl)] * 2
reference: |
  return x * 2
cases:
  - {name: c, N: 768}
  - {name: ragged, N: 960}
backends:
  interpret:
  triton:
"""

SLICED_LOOP = "  for s in range(bs // sl):\n      o_ref[pl.ds(s * sl, sl)] = x_ref[pl.ds(s * sl, sl)] * 2\n"
WHOLE = "  o_ref[...] = x_ref[...] * 2\n"


def e711(*ops: tuple) -> str:
    """kspec check's output for E711 on each (line, operand) of `ops`, in both cases."""
    return "".join(
        f"specs/scale_slices.yaml:{line}:3: error[E711]: case `{case}` (triton): {op} block dim 0 is 384; Triton block "
        "dims must be powers of two\n  = help: use 512 (padding covers the ragged edge) or 256\n"
        for line, op in ops for case in ("c", "ragged")
    ) + f"{2 * len(ops)} error(s) in 1 of 1 spec(s)\n"


E711 = e711((13, "x"), (14, "o"))


def _rows(report) -> list:
    return [(r["backend"], r["mode"], r["case"], r["status"]) for r in declared(json.loads(report.read_text())["results"])]


def test_a_block_the_body_only_slices_by_powers_of_two_lowers_for_cuda_and_runs(kspec, write_spec, tmp_path):
    write_spec(SLICES_SPEC, "scale_slices")
    r = kspec("check")
    assert r.rc == 0 and "E711" not in r.out, r.out
    assert kspec("generate").rc == 0
    report = tmp_path / "lower.json"
    r = kspec("verify", "--lower", "--backend", "triton", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    assert _rows(report) == [("triton", "lower", "c", "pass"), ("triton", "lower", "ragged", "pass")]
    report = tmp_path / "run.json"
    r = kspec("verify", "--backend", "interpret", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    assert _rows(report) == [("interpret", "run", "c", "pass"), ("interpret", "run", "ragged", "pass")]


def test_a_block_the_body_reads_whole_is_still_e711(kspec, write_spec):
    write_spec(mutate(SLICES_SPEC, (SLICED_LOOP, SLICED_LOOP + WHOLE)), "scale_slices")
    r = kspec("check")
    assert (r.rc, r.out) == (2, E711)


def test_slices_that_are_not_powers_of_two_are_e711(kspec, write_spec):
    write_spec(mutate(SLICES_SPEC, ("  sl: 128\n", "  sl: 96\n")), "scale_slices")
    r = kspec("check")
    assert (r.rc, r.out) == (2, E711)


def test_sliced_true_declares_what_the_body_does_where_the_check_cannot_see_it(kspec, write_spec):
    helper = ("  def twice(src, dst):\n      for s in range(bs // sl):\n"
              "          dst[pl.ds(s * sl, sl)] = src[pl.ds(s * sl, sl)] * 2\n  twice(x_ref, o_ref)\n")
    passed_on = mutate(SLICES_SPEC, (SLICED_LOOP, helper))
    write_spec(passed_on, "scale_slices")
    r = kspec("check")
    assert (r.rc, r.out) == (2, E711)
    x_sliced = mutate(passed_on, ('index_map: "i -> (i,)"}', 'index_map: "i -> (i,)", sliced: true}'))
    write_spec(x_sliced, "scale_slices")
    r = kspec("check")
    assert (r.rc, r.out) == (2, e711((14, "o")))
    write_spec(x_sliced.replace('index_map: "i -> (i,)"}', 'index_map: "i -> (i,)", sliced: true}'), "scale_slices")
    r = kspec("check")
    assert r.rc == 0 and "E711" not in r.out, r.out
