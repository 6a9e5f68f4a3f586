"""specs/gmm.yaml, the grouped matmul: its group sizes come from init code (summing to M, some
groups empty), its prologue turns them into a work list read through scalar prefetch, and a grid
extent is the list's length. verify runs it against the plain-JAX reference; a kernel that loses
the rows an earlier group wrote into a shared row tile fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, declared, invoke_kspec, mutate

GMM = REPO / "specs" / "gmm.yaml"


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "gmm.yaml").write_text(text)
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    return tmp_path


def verify(proj: Path, *args) -> tuple:
    """(rc, the declared cases' rows) of `kspec verify --seed 4 --schedules 1 *args`."""
    r = invoke_kspec("verify", "--seed", "4", "--schedules", "1", "--json", proj / "r.json", *args, cwd=proj,
                     timeout=600)
    return r.rc, declared(json.loads((proj / "r.json").read_text())["results"]), r.out


def test_gmm_matches_its_reference_in_interpret_mode(tmp_path):
    proj = project(tmp_path, GMM.read_text())
    rc, rows, out = verify(proj, "-b", "interpret", "--inputs", "normal")
    assert rc == 0, out
    assert [(r["case"], r["dtype"], r["status"]) for r in rows] == [
        ("experts", "float32,int32", "pass"), ("experts", "bfloat16,int32", "pass"),
        ("ragged", "float32,int32", "pass"), ("ragged", "bfloat16,int32", "pass"),
        ("one_group", "float32,int32", "pass"), ("many_groups", "bfloat16,int32", "pass")]


@pytest.mark.slow
def test_gmm_runs_in_tpu_interpret_mode_and_lowers_for_tpu(tmp_path):
    proj = project(tmp_path, GMM.read_text())
    rc, rows, out = verify(proj, "-b", "mosaic_tpu", "--case", "ragged", "--case", "many_groups")
    assert rc == 0, out
    assert [r["status"] for r in rows] == ["pass", "pass", "pass"]
    rc, rows, out = verify(proj, "-b", "mosaic_tpu", "--lower")
    assert rc == 0 and {r["status"] for r in rows} == {"pass"}, out


def test_a_kernel_that_restarts_each_visit_of_a_shared_tile_fails(tmp_path):
    """Two groups that share a row tile visit it in consecutive steps; starting every visit from zeros
    erases the first group's rows. The sizes of `ragged` (M = 200, tiles of 64, five groups) put a
    group boundary inside a tile unless all four cuts fall on multiples of 64, so the kernel fails on both
    dtypes."""
    text = mutate(GMM.read_text(), ("first = (t == 0) | (m_tile_ids_ref[jnp.maximum(t - 1, 0)] != tile)", "first = True"))
    proj = project(tmp_path, text)
    rc, rows, _ = verify(proj, "-b", "interpret", "--case", "ragged", "--inputs", "normal")
    assert rc == 1
    assert [r["status"] for r in rows] == ["fail", "fail"]
    assert all(r["message"].startswith("output out: ") for r in rows), rows


def test_gmm_competitor_is_megablox_on_tpu_only():
    from kspec.codegen.project import compile_spec

    spec = compile_spec(GMM).spec
    assert [(c.name, c.platforms) for c in spec.competitors] == [("megablox", ("tpu",))]
    assert "megablox.gmm import gmm" in spec.competitors[0].body.source


@pytest.mark.parametrize("edit, expected", [
    (("    lhs: {shape: [M, K], dtype: lhs}\n", "    lhs: {shape: [M, K], dtype: lhs, init: {kind: index, bound: 3}}\n"),
     ["specs/gmm.yaml:48:5: error[E410]: kernel input lhs has `init` but is not scalar-prefetched",
      "  = help: the prologue makes a kernel input: `init` gives the range of a prefetched one's values"]),
    (('init: {kind: index, bound: "cdiv(M, bm)"}', "init: {kind: normal}"),
     ["specs/gmm.yaml:41:5: error[E410]: scalar-prefetch input m_tile_ids has no `init: {kind: index, ...}` saying "
      "what values it holds",
      "  = help: a prefetched input holds indices: a shape such as [n] or [B, n], an int dtype, init {kind: index, "
      "bound: ...}"]),
])
def test_prefetched_kernel_inputs_are_checked(tmp_path, edit, expected):
    """A kernel input's `init` is the range of a prefetched one's values, which the prologue makes."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "gmm.yaml").write_text(mutate(GMM.read_text(), edit))
    r = invoke_kspec("check", "specs/gmm.yaml", cwd=tmp_path)
    assert r.rc == 2 and r.out.splitlines()[:-1] == expected, r.out
