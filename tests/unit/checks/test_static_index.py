"""checks/static_index.py (E511): constant indices of a body's refs against the ref's shape in each
case. tests/test_diagnostics.py pins the text through `kspec check`."""

from __future__ import annotations

import pytest

from kspec.codegen.checks import static_index
from conftest import VALID_SPEC, build_spec, instance, mutate

BODY = "o_ref[...] = x_ref[...] * 2"
SCRATCH = "scratch:\n  buf: {shape: [2, bs], dtype: float32}\nbody: |"


def e511(body: str, *edits) -> list:
    """The E511 messages of the valid spec (block of 8, N 64) with `body` for its body."""
    inst, diags = instance(build_spec(mutate(VALID_SPEC, (BODY, body), *edits)))
    assert inst is not None, diags
    return [(d.loc.line, d.loc.col, d.message) for d in static_index.check(inst)]


def test_a_constant_index_past_the_block_is_found_where_it_is_written():
    assert e511("o_ref[...] = x_ref[...] * 2 + x_ref[8]") == [
        (15, 39, "case `c`: `x_ref[8]` takes index 8 of an axis of 8 (valid 0..7)")]


@pytest.mark.parametrize("body", [
    "o_ref[...] = x_ref[...] * 2 + x_ref[7]",  # the last element
    "o_ref[...] = x_ref[...] * 2 + x_ref[-8]",  # from the end
    "o_ref[...] = x_ref[...] * 2 + x_ref[pl.ds(0, 8)][12]",  # a slice of unknown size: not judged
    "x_ref = o_ref\n  o_ref[...] = x_ref[12] * 2",  # a name the body binds is not the ref
    "o_ref[...] = x_ref[...] * 2 + x_ref[None, 7][0, 9]",  # past a new axis: not judged
])
def test_indices_within_the_axis_or_of_unknown_reach_pass(body):
    assert e511(body) == []


def test_negative_indices_count_from_the_end():
    assert [m for _, _, m in e511("o_ref[...] = x_ref[...] * 2 + x_ref[-9]")] == [
        "case `c`: `x_ref[-9]` takes index -9 of an axis of 8 (valid 0..7)"]


def test_scratch_refs_chains_and_ellipses_follow_the_axes():
    body = "buf_ref.at[1][...] = x_ref[...]\n  buf_ref.at[2][0] = x_ref[...]\n  o_ref[...] = buf_ref[..., 8] + buf_ref.at[:][0, 7]"
    assert [m for _, _, m in e511(body, ("body: |", SCRATCH))] == [
        "case `c`: `buf_ref.at[2]` takes index 2 of an axis of 2 (valid 0..1)",
        "case `c`: `buf_ref[..., 8]` takes index 8 of an axis of 8 (valid 0..7)"]


def test_the_axis_size_is_the_cases():
    # a block of bs = 16 in the second case: x_ref[8] is past the first case's block only
    spec = build_spec(mutate(VALID_SPEC, (BODY, "o_ref[...] = x_ref[...] * 2 + x_ref[8]"),
                             ("{name: c, N: 64}", "{name: c, N: 64}\n  - {name: d, N: 64, params: {bs: 16}}")))
    found = {n: [d.message for d in static_index.check(instance(spec, case=k)[0])] for k, n in enumerate("cd")}
    assert found == {"c": ["case `c`: `x_ref[8]` takes index 8 of an axis of 8 (valid 0..7)"], "d": []}


def test_a_mesh_kernels_refs_are_its_whole_operands():
    """In a mesh kernel the body indexes whole arrays: a [1, N] bias row has one row, whatever the mesh."""
    from test_diagnostics import MESH

    spec = build_spec(mutate(MESH, ("  x: {shape: [N], dtype: float32}\n",
                                    "  x: {shape: [N], dtype: float32}\n  b: {shape: [1, N], dtype: x}\n"),
                             ("x_ref.at[half], o_ref.at[half])", "x_ref.at[half], o_ref.at[half])\n  b_ref.at[1].at[half]")))
    inst, diags = instance(spec, "mosaic_gpu")
    assert inst is not None, diags
    assert [d.message for d in static_index.check(inst)] == [
        "case `c`: `b_ref.at[1]` takes index 1 of an axis of 1 (valid 0..0)"]
