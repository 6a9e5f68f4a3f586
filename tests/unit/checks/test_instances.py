"""checks/instances.py: a spec's variant evaluated for one case (the Instance that the per-case
checks, the hardware rules, verify and tune read), the grid walk of its index maps, and the
dtype combinations a case runs. tests/test_diagnostics.py pins the same codes through `kspec check`.
"""

from __future__ import annotations

import pytest

from kspec.codegen.checks import instances
from conftest import VALID_SPEC, build_spec, instance, mutate

X_BLOCK = 'x: {block_shape: [bs], index_map: "i -> (i,)"}'
O_BLOCK = 'o: {block_shape: [bs], index_map: "i -> (i,)"}'
GRID = 'grid: ["cdiv(N, bs)"]'


def found(*edits) -> tuple:
    """(whether an Instance came out, the formatted diagnostics) of the valid spec with `edits`."""
    inst, diags = instance(build_spec(mutate(VALID_SPEC, *edits)))
    return inst is not None, [d.format() for d in diags]


def test_the_valid_spec_evaluates_to_numbers():
    inst, diags = instance(build_spec(VALID_SPEC))
    assert diags == []
    assert inst.env == {"bs": 8, "N": 64}
    assert (inst.shapes, inst.dtypes) == ({"x": (64,), "o": (64,)}, {"x": "float32", "o": "float32"})
    assert (inst.grid, inst.block_shapes, inst.scratch_shapes) == ((8,), {"x": (8,), "o": (8,)}, {})
    assert (inst.case.name, inst.variant.backend, inst.mesh, inst.pipes) == ("c", "interpret", {}, {})


def test_a_case_param_and_the_backend_params_override_the_defaults():
    spec = build_spec(mutate(VALID_SPEC, ("{name: c, N: 64}", "{name: c, N: 64, params: {bs: 16}}"),
                             ("cases:", "backends:\n  interpret:\n  triton:\n    params: {bs: 32}\ncases:")))
    assert instance(spec, "interpret")[0].grid == (4,)
    assert instance(spec, "triton")[0].env == {"bs": 16, "N": 64}  # the case's own value wins


def test_a_broken_constraint_names_the_values():
    """E501, at the case, with the constraint's line as the hint."""
    assert found(("cases:", "constraints:\n  - {expr: \"N % 128 == 0\", message: N must be a multiple of 128}\ncases:")) == (
        False, ["specs/tiny.yaml:21:5: error[E501]: case `c` (N=64): N must be a multiple of 128\n"
                "  = help: constraint at line 19"])


@pytest.mark.parametrize("edits, expected", [
    ([("o: {shape: [N]", 'o: {shape: ["N - 64"]')],
     "specs/tiny.yaml:9:3: error[E506]: case `c`: o has shape (0,)\n  = help: every dim must be at least 1"),
    ([(GRID, 'grid: ["N // 128"]')], "specs/tiny.yaml:10:8: error[E505]: case `c`: grid axis 0 has size 0"),
    ([(GRID, 'grid: ["N * N * N"]'), ("N: 64", "N: 4096")],
     "specs/tiny.yaml:10:8: error[E508]: case `c`: grid axis 0 has size 68719476736, more than int32 holds "
     "(2147483647)\n  = help: Pallas program ids are int32: use bigger blocks or split the axis into several"),
])
def test_sizes_out_of_range_give_no_instance(edits, expected):
    assert found(*edits) == (False, [expected])


def test_sizes_must_be_integers():
    assert found(("  bs: 8", "  bs: 2.5")) == (False, [
        "specs/tiny.yaml:10:8: error[E303]: case `c`: grid: `cdiv(N, bs)` is 26.0, not an integer",
        "specs/tiny.yaml:12:21: error[E303]: case `c`: x.block_shape: `bs` is 2.5, not an integer",
        "specs/tiny.yaml:13:21: error[E303]: case `c`: o.block_shape: `bs` is 2.5, not an integer",
    ])


def test_the_grid_walk_finds_a_block_index_out_of_bounds():
    """E502, at the first grid point that goes out, with the instance (the walk is a check of it)."""
    assert found((X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> (i + 1,)"}')) == (True, [
        "specs/tiny.yaml:12:37: error[E502]: case `c`: x.index_map at grid point (7,) gives block index (8,); "
        "dim 0 is 8, valid 0..7\n  = help: x dim 0 has 64 elements in blocks of 8"])


def test_the_grid_walk_finds_an_output_block_never_written():
    assert found((O_BLOCK, 'o: {block_shape: [bs], index_map: "i -> (i // 2,)"}')) == (True, [
        "specs/tiny.yaml:13:3: error[E503]: case `c`: output o is not fully written: block (4,) (elements [32:40]) "
        "is never visited by the grid\n  = help: make the grid and index_map reach every block of the output"])
    # an extra grid axis that revisits every block writes them all
    assert found((GRID, 'grid: ["cdiv(N, bs)", 3]'), (X_BLOCK, X_BLOCK.replace("i -> (i,)", "i, j -> (i,)")),
                 (O_BLOCK, O_BLOCK.replace("i -> (i,)", "i, j -> (i,)"))) == (True, [])


def test_grid_points_walks_small_grids_and_samples_large_ones():
    points, exhaustive = instances.grid_points((3, 2))
    assert exhaustive and list(points) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    n = instances.MAX_GRID_POINTS * 2
    points, exhaustive = instances.grid_points((n,))
    assert not exhaustive and list(points) == [(0,), (1,), (n // 2,), (n - 2,), (n - 1,)]  # both ends and the middle


def test_grid_points_spends_and_keeps_to_the_budget():
    budget = [10]
    points, exhaustive = instances.grid_points((3, 3), budget)
    assert exhaustive and len(list(points)) == 9 and budget == [1]
    points, exhaustive = instances.grid_points((2,), budget, cost=2)  # 4 evaluations, 1 left: a sample
    assert not exhaustive and budget == [1]


TWO_INPUTS = mutate(VALID_SPEC, ("dtype: float32", "dtype: [float32, bfloat16]"),
                    ("  x: {shape", "  y: {shape: [N], dtype: [int8, int32]}\n  x: {shape"))


def test_dtype_assignments_are_every_combination_with_the_followers_filled_in():
    spec = build_spec(TWO_INPUTS)
    assignments = instances.dtype_assignments(spec, spec.cases[0])
    assert len(assignments) == instances.dtype_combinations(spec, spec.cases[0]) == 4
    assert list(assignments) == [
        {"y": "int8", "x": "float32", "o": "float32"}, {"y": "int8", "x": "bfloat16", "o": "bfloat16"},
        {"y": "int32", "x": "float32", "o": "float32"}, {"y": "int32", "x": "bfloat16", "o": "bfloat16"},
    ]
    assert [assignments[i] for i in (0, 3, -1)] == [list(assignments)[0], list(assignments)[3], list(assignments)[3]]
    with pytest.raises(IndexError):
        assignments[4]


@pytest.mark.parametrize("dtype, expected", [
    ("bfloat16", [{"y": "int8", "x": "bfloat16", "o": "bfloat16"}, {"y": "int32", "x": "bfloat16", "o": "bfloat16"}]),
    ("{y: int32, x: float32}", [{"y": "int32", "x": "float32", "o": "float32"}]),
])
def test_a_case_dtype_narrows_the_combinations(dtype, expected):
    spec = build_spec(mutate(TWO_INPUTS, ("{name: c, N: 64}", f"{{name: c, N: 64, dtype: {dtype}}}")))
    assert list(instances.dtype_assignments(spec, spec.cases[0])) == expected


def test_too_many_combinations_are_counted_but_never_listed():
    """E507 reports them; the lazy sequence refuses to list them."""
    many = "[float32, bfloat16, float16, int32, int8, uint8, int16, uint16]"
    spec = build_spec(mutate(VALID_SPEC, ("  x: {shape: [N], dtype: float32}\n",
                                          "".join(f"  x{i or ''}: {{shape: [N], dtype: {many}}}\n" for i in range(3))),
                             ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: float32}")))
    assignments = instances.dtype_assignments(spec, spec.cases[0])
    assert len(assignments) == 512 and assignments[511] == {"x": "uint16", "x1": "uint16", "x2": "uint16", "o": "float32"}
    with pytest.raises(ValueError, match=r"512 dtype combinations; at most 256 are run \(E507\)"):
        iter(assignments)
