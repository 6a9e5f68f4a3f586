"""Collective outputs and mesh-only specs: an output gathered along a mesh axis
(`reductions: {o: {all_gather: [d]}}`, whole on every device after shard_map), and
`sharding.mesh_only`, which single-device verify and --lower skip with the reason."""

from __future__ import annotations

import json

import pytest

from conftest import mutate

GATHER_SPEC = """\
kspec: 1
name: gather_double
doc: |
  Doubles x on each device's shard, then gathers the shards: every device along d
  ends with the whole output.
params:
  bs: 1024
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: [N], dtype: x}
constraints:
  - {expr: "N % bs == 0", message: "N must be a multiple of bs"}
grid: ["N // bs"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
sharding:
  mesh: {d: 2}
  mesh_only: true
  specs:
    x: [d]
  reductions:
    o: {all_gather: [d]}
cases:
  - {name: c, N: 4096}
backends:
  interpret:
  mosaic_tpu:
"""
# its case and the one verify derives from it
MESH_ONLY = ("skipped 2 {} task(s): mesh-only spec (sharding.mesh_only): it runs on a device mesh only; "
             "kspec verify --devices N runs it")


def _rows(path) -> list:
    return [(x["backend"], x["mode"], x["status"]) for x in json.loads(path.read_text())["results"]]


def test_a_gathered_output_runs_on_a_mesh_and_a_mesh_only_spec_skips_one_device(kspec, write_spec, tmp_path):
    write_spec(GATHER_SPEC, "gather_double")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    text = (tmp_path / "generated" / "gather_double" / "sharded.py").read_text()
    assert "OUT_SPECS = P()\n" in text
    assert 'return lax.all_gather(o, "d", axis=0, tiled=True, to="invarying")' in text
    for lower in ((), ("--lower",)):
        r = kspec("verify", *lower, timeout=120)
        assert r.rc == 0, r.out + r.err
        assert MESH_ONLY.format("interpret") in r.out and MESH_ONLY.format("mosaic_tpu") in r.out
        assert "0 passed, 0 failed, 0 errors, 4 skipped" in r.out
    for lower, mode in (((), "sharded"), (("--lower",), "lower-sharded")):
        report = tmp_path / f"{mode}.json"
        r = kspec("verify", "--devices", "2", *lower, "--json", report, timeout=300)
        assert r.rc == 0, r.out + r.err
        assert [row for row in _rows(report) if row[2] != "skip"] == [("mosaic_tpu", mode, "pass")]


@pytest.mark.parametrize("change, expected", [
    (("    x: [d]\n", "    x: []\n"),
     "specs/gather_double.yaml:28:5: error[E805]: o: gathered over `d`, which splits none of its dims in the inputs\n"
     "  = help: all_gather collects the shards of a dim that the inputs split over d; drop it, or use psum for "
     "partial results\n"),
    (("o: {all_gather: [d]}", "o: {psum: [d]}"),
     "specs/gather_double.yaml:22:1: error[E805]: o: dim 0 (N) is split over nothing but the inputs split N over (d)\n"
     "  = help: split o dim 0 as the inputs split N\n"),
])
def test_what_a_gather_needs(kspec, write_spec, change, expected):
    write_spec(mutate(GATHER_SPEC, change), "gather_double")
    r = kspec("check")
    assert (r.rc, r.out) == (2, expected + "1 error(s) in 1 of 1 spec(s)\n")


TILE_SPEC = """\
kspec: 1
name: tile_mesh
doc: |
  Each device of the mesh writes x doubled once per device along d: the output's
  shape reads the mesh axis size d.
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: ["N * d"], dtype: x}
body: |
  o_ref[...] = jnp.tile(x_ref[...] * 2, d)
reference: |
  return jnp.tile(x * 2, d)
sharding:
  mesh: {d: 2}
  mesh_only: true
cases:
  - {name: c, N: 1024}
backends:
  interpret:
  mosaic_tpu:
"""


def test_a_mesh_only_spec_reads_its_mesh_axis_sizes_in_output_shapes_body_and_reference(kspec, write_spec, tmp_path):
    write_spec(TILE_SPEC, "tile_mesh")
    assert kspec("check").rc == 0
    assert kspec("generate").rc == 0
    kernel = (tmp_path / "generated" / "tile_mesh" / "mosaic_tpu.py").read_text()
    assert "    d = 2  # mesh axis d: this kernel runs on each device of a mesh (sharding.mesh_only)\n" in kernel
    assert "functools.partial(_tile_mesh_kernel, N=N, d=d)" in kernel
    assert "jax.ShapeDtypeStruct((N * d,), x.dtype," in kernel
    reference = (tmp_path / "generated" / "tile_mesh" / "reference.py").read_text()
    assert "    N, = bind(x, check_dtypes=False)\n    d = 2  # mesh axis d\n    return jnp.tile(x * 2, d)\n" in reference
    report = tmp_path / "run.json"
    r = kspec("verify", "--devices", "2", "--json", report, timeout=300)
    assert r.rc == 0, r.out + r.err
    assert [row for row in _rows(report) if row[2] != "skip"] == [("mosaic_tpu", "sharded", "pass")]


@pytest.mark.parametrize("change, hint", [
    (("  mesh_only: true\n", ""), "a mesh axis size may be read in the output shapes of a spec with "
                                  "`sharding.mesh_only: true`"),
    (("mesh: {d: 2}", "mesh: {d: devices}"), "mesh axis d is sized by the device count; give it a size to read it "
                                             "in a shape"),
])
def test_where_a_mesh_axis_size_may_be_read(kspec, write_spec, change, hint):
    write_spec(mutate(TILE_SPEC, change), "tile_mesh")
    r = kspec("check")
    assert (r.rc, r.out) == (2, "specs/tile_mesh.yaml:9:15: error[E408]: o: `d` is not a dim bound by an input shape, "
                                f"nor a param\n  = help: {hint}\n1 error(s) in 1 of 1 spec(s)\n")


def test_a_mesh_axis_a_mesh_only_spec_binds_takes_a_name_of_its_own(kspec, write_spec):
    write_spec(mutate(TILE_SPEC, ("mesh: {d: 2}", "mesh: {N: 2}"), ('"N * d"', '"N * N"'), ("tile(x_ref[...] * 2, d)", "tile(x_ref[...] * 2, N)"),
                      ("tile(x * 2, d)", "tile(x * 2, N)")), "tile_mesh")
    r = kspec("check")
    assert (r.rc, r.out) == (2, "specs/tile_mesh.yaml:15:10: error[E400]: mesh axis `N` has the same name as dim `N`\n"
                                "  = help: give each operand, dim, param and scratch buffer its own name\n"
                                "1 error(s) in 1 of 1 spec(s)\n")
