"""backends/rules.py: each hardware rule on a minimal Instance, its diagnostics pinned.

The instances are the valid spec of conftest.py (x, o of [N] float32 in blocks of bs, N = 64,
bs = 8) or a small mesh kernel, with one backend section added, built by the real stages
(loader -> schema -> model) and evaluated by checks/instances.instantiate. tests/test_diagnostics.py
pins the same codes through `kspec check`; here each rule function is called alone.
"""

from __future__ import annotations

import pytest

from kspec.codegen.backends import rules
from kspec.codegen.diagnostics import Location
from conftest import REPO, VALID_SPEC, build_spec, instance, mutate
from test_diagnostics import MESH

HERE = Location("specs/tiny.yaml", 3, 5)


def inst(section: str, backend: str):
    """The valid spec with `backends: {section}`, evaluated for its case on `backend`."""
    spec = build_spec(VALID_SPEC + "backends:\n" + section)
    found, diags = instance(spec, backend)
    assert diags == [], diags
    return found


def inst_of(text: str, backend: str, path: str = "specs/tiny.yaml"):
    """Spec `text` evaluated for its first case on `backend`."""
    found, diags = instance(build_spec(text, path), backend)
    assert diags == [], diags
    return found


def shown(diagnostics: list) -> list:
    return [d.format() for d in diagnostics]


def test_check_runs_the_rules_of_the_instances_backend_and_kind():
    assert rules.check(inst("  interpret:\n", "interpret")) == []  # interpret mode has no hardware
    tpu = inst("  mosaic_tpu:\n", "mosaic_tpu")
    assert rules.check(tpu) == rules._mosaic_tpu(tpu) != []
    wide = inst_of(mutate(MESH, ("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 9}")), "mosaic_gpu")
    assert rules.check(wide) == rules._mesh_gpu(wide) != []


# -- Mosaic TPU ---------------------------------------------------------------------


def test_tpu_sublane_tile_packs_narrow_dtypes():
    assert [rules.tpu_sublane_tile(d) for d in ("float32", "bfloat16", "int8", "float64")] == [8, 16, 32, 8]


def test_tpu_tiling():
    """E701: the last two block dims tile by (8 x packing, 128), or are the whole array dim; a 1-D
    block is the whole dim, a multiple of 1024 or a power of two of at least 128 x packing."""
    assert shown(rules._mosaic_tpu(inst("  mosaic_tpu:\n", "mosaic_tpu"))) == [
        "specs/tiny.yaml:12:3: error[E701]: case `c` (mosaic_tpu): x block dim 0 is 8; on TPU a 1-D block must be "
        "the whole array dim (64), a multiple of 1024, or a power of two of at least 128 for float32\n"
        "  = help: use 128, or the full dim (jax 0.10.2's Mosaic TPU rule for 1-D blocks)",
        "specs/tiny.yaml:13:3: error[E701]: case `c` (mosaic_tpu): o block dim 0 is 8; on TPU a 1-D block must be "
        "the whole array dim (64), a multiple of 1024, or a power of two of at least 128 for float32\n"
        "  = help: use 128, or the full dim (jax 0.10.2's Mosaic TPU rule for 1-D blocks)",
    ]
    assert rules._mosaic_tpu(inst("  mosaic_tpu:\n    params: {bs: 64}\n", "mosaic_tpu")) == []  # the whole dim
    assert shown(rules.tpu_tiling("w", "x", (4096,), (128,), "bfloat16", HERE)) == [
        "specs/tiny.yaml:3:5: error[E701]: w: x block dim 0 is 128; on TPU a 1-D block must be the whole array dim "
        "(4096), a multiple of 1024, or a power of two of at least 256 for bfloat16\n"
        "  = help: use 256, or the full dim (jax 0.10.2's Mosaic TPU rule for 1-D blocks)"
    ]
    assert shown(rules.tpu_tiling("w", "x", (768,), (384,), "float32", HERE)) == [
        "specs/tiny.yaml:3:5: error[E701]: w: x block dim 0 is 384; on TPU a 1-D block must be the whole array dim "
        "(768), a multiple of 1024, or a power of two of at least 128 for float32\n"
        "  = help: use 256 or 512, or the full dim (jax 0.10.2's Mosaic TPU rule for 1-D blocks)"
    ]
    for block, dim, dtype in [(256, 4096, "bfloat16"), (3072, 8192, "bfloat16"), (768, 768, "float32"), (512, 4096, "int8")]:
        assert rules.tpu_tiling("w", "x", (dim,), (block,), dtype, HERE) == [], (block, dim, dtype)
    assert rules.tpu_tiling("w", "x", (64, 256), (16, 128), "bfloat16", HERE) == []
    assert rules.tpu_tiling("w", "x", (4, 64, 256), (1, 16, 256), "bfloat16", HERE) == []  # leading dims are free
    assert shown(rules.tpu_tiling("w", "x", (64, 256), (8, 128), "bfloat16", HERE)) == [
        "specs/tiny.yaml:3:5: error[E701]: w: x block dim 0 is 8; on TPU the second-to-last block dim must be "
        "divisible by 16 for bfloat16 or equal the array dim (64)\n  = help: use a multiple of 16 (e.g. 16) or the full dim"
    ]
    assert shown(rules.tpu_tiling("w", "x", (64, 256), (None, 128), "float32", HERE)) == [
        "specs/tiny.yaml:3:5: error[E701]: w: x block dim 0 is squeezed (1); on TPU the second-to-last block dim must "
        "be divisible by 8 for float32 or equal the array dim (64)\n"
        "  = help: use a multiple of 8 (e.g. 8) or the full dim; squeeze a leading dim instead"
    ]


def _mosaic_lowers_1d(block: int, dim: int, dtype: str) -> bool:
    """Whether jax lowers a copy kernel over a (dim,) array in (block,) blocks for Mosaic TPU, on a
    TPU v5e named by an abstract mesh (no TPU needed); False when it refuses the block shape."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((block,), lambda i: (i,))
    call = pl.pallas_call(copy, out_shape=jax.ShapeDtypeStruct((dim,), dtype), grid=(pl.cdiv(dim, block),),
                          in_specs=[spec], out_specs=spec)
    chip = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("chip",), axis_types=(AxisType.Explicit,), abstract_device=chip)
    try:
        with use_abstract_mesh(mesh):
            jax.jit(call).trace(jax.ShapeDtypeStruct((dim,), jnp.dtype(dtype))).lower(lowering_platforms=("tpu",))
    except ValueError as e:
        if "rank 1 block" in str(e):
            return False
        raise
    return True


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_tpu_tiling_of_1d_blocks_is_the_rule_jax_lowers_by(dtype):
    """E701 on a 1-D block agrees with jax's own Mosaic TPU lowering, block by block: bfloat16
    needs powers of two from 256, int8 from 512, and 384 or 1536 lower only as the whole dim."""
    for block, dim in [(128, 6144), (256, 6144), (384, 6144), (512, 6144), (768, 6144), (1024, 6144),
                       (1536, 6144), (2048, 6144), (3072, 6144), (384, 768), (768, 768)]:
        accepted = rules.tpu_tiling("w", "x", (dim,), (block,), dtype, HERE) == []
        assert accepted == _mosaic_lowers_1d(block, dim, dtype), (block, dim, dtype)


def test_tpu_parallel_revisits():
    """E702: two steps of a `parallel` grid axis write the same output block."""
    section = ('  mosaic_tpu:\n    blocks:\n      o: {block_shape: [64], index_map: "i -> (0,)"}\n'
               "    compiler_params: {dimension_semantics: [parallel]}\n")
    assert shown(rules._tpu_parallel_revisits(inst(section, "mosaic_tpu"))) == [
        "specs/tiny.yaml:23:7: error[E702]: case `c` (mosaic_tpu): output o is written by several steps of parallel "
        "grid axis 0 (grid points (0,) and (1,) write the same block)\n"
        "  = help: mark grid axis 0 `arbitrary` in dimension_semantics, or index o's blocks by it"
    ]
    assert rules._tpu_parallel_revisits(inst(section.replace("parallel", "arbitrary"), "mosaic_tpu")) == []
    parallel = "  mosaic_tpu:\n    compiler_params: {dimension_semantics: [parallel]}\n"
    assert rules._tpu_parallel_revisits(inst(parallel, "mosaic_tpu")) == []  # o's blocks follow the axis


def test_tpu_vmem():
    """E703: blocks x buffers + VMEM scratch within the scoped VMEM limit."""
    small = "  mosaic_tpu:\n    params: {bs: 64}\n    compiler_params: {vmem_limit_bytes: 512}\n"
    assert shown(rules._tpu_vmem(inst(small, "mosaic_tpu"))) == [
        "specs/tiny.yaml:21:3: error[E703]: case `c` (mosaic_tpu): VMEM estimate 1.0 KiB (blocks x 2 buffers "
        "1.0 KiB + scratch) exceeds the limit of 512 bytes\n"
        "  = help: use smaller blocks, or raise compiler_params.vmem_limit_bytes"
    ]
    single = mutate(small, ("    compiler_params", '    blocks:\n      x: {block_shape: [bs], index_map: "i -> (i,)", '
                                                  "pipeline_mode: {buffered: 1}}\n    compiler_params"))
    one = inst(single, "mosaic_tpu")
    assert [rules.tpu_buffers(one, op) for op in one.spec.operands] == [1, 2]
    assert shown(rules._tpu_vmem(one)) == [
        "specs/tiny.yaml:21:3: error[E703]: case `c` (mosaic_tpu): VMEM estimate 768 bytes (blocks x their buffer "
        "counts 768 bytes + scratch) exceeds the limit of 512 bytes\n"
        "  = help: use smaller blocks, or raise compiler_params.vmem_limit_bytes"
    ]
    assert rules._tpu_vmem(inst("  mosaic_tpu:\n    params: {bs: 64}\n", "mosaic_tpu")) == []  # the 16 MiB default


def test_semantics_length():
    """E704: one dimension_semantics entry per grid axis, one allow_input_fusion entry per input."""
    i = inst("  mosaic_tpu:\n    params: {bs: 64}\n    compiler_params: {dimension_semantics: [parallel, parallel], "
             "allow_input_fusion: [true, false]}\n", "mosaic_tpu")
    assert shown(rules._semantics_length(i, "dimension_semantics", 1, "grid axis", "grid axes")) == [
        "specs/tiny.yaml:21:3: error[E704]: mosaic_tpu: dimension_semantics has 2 entries but the kernel has 1 grid "
        "axis\n  = help: give one entry per grid axis"
    ]
    assert shown(rules._semantics_length(i, "allow_input_fusion", 1, "input", "inputs")) == [
        "specs/tiny.yaml:21:3: error[E704]: mosaic_tpu: allow_input_fusion has 2 entries but the kernel has 1 input\n"
        "  = help: give one entry per input"
    ]
    assert rules._semantics_length(i, "dimension_semantics", 2, "grid axis", "grid axes") == []
    assert rules._semantics_length(i, "not_given", 3, "grid axis", "grid axes") == []


def test_tpu_block_specs():
    """E705: 1 or 2 buffers, and element dims all or none."""
    three = ('  mosaic_tpu:\n    params: {bs: 64}\n    blocks:\n'
             '      x: {block_shape: [bs], index_map: "i -> (i,)", pipeline_mode: {buffered: 3}}\n')
    assert shown(rules._tpu_block_specs(inst(three, "mosaic_tpu"))) == [
        "specs/tiny.yaml:24:7: error[E705]: case `c` (mosaic_tpu): x asks for 3 buffers; Mosaic TPU lowers 1 or 2\n"
        "  = help: use pipeline_mode: {buffered: 1} or {buffered: 2}"
    ]
    assert rules._tpu_block_specs(inst(three.replace("buffered: 3", "buffered: 1"), "mosaic_tpu")) == []
    mixed = mutate(VALID_SPEC, ("x: {shape: [N]", "x: {shape: [N, 128]"), ("o: {shape: [N]", "o: {shape: [N, 128]"),
                   ('x: {block_shape: [bs], index_map: "i -> (i,)"}',
                    'x: {block_shape: [{element: 8}, 128], index_map: "i -> (i * 8, 0)"}'),
                   ('o: {block_shape: [bs], index_map: "i -> (i,)"}', 'o: {block_shape: [bs, 128], index_map: "i -> (i, 0)"}'),
                   ("return x * 2", "return x * 2\nbackends:\n  mosaic_tpu:"))
    assert shown(rules._tpu_block_specs(inst_of(mixed, "mosaic_tpu"))) == [
        "specs/tiny.yaml:12:20: error[E705]: case `c` (mosaic_tpu): x mixes element dims with blocked dims; Mosaic "
        "TPU takes all element dims or none\n"
        "  = help: write the other dims as {element: <size>} too (the index map then gives their element offsets)"
    ]


# -- Triton -------------------------------------------------------------------------


def test_triton_block_dims_are_powers_of_two():
    """E711, with the two powers of two around the block dim as the fix."""
    assert shown(rules._triton(inst("  triton:\n    params: {bs: 12}\n", "triton"))) == [
        "specs/tiny.yaml:12:3: error[E711]: case `c` (triton): x block dim 0 is 12; Triton block dims must be powers "
        "of two\n  = help: use 16 (padding covers the ragged edge) or 8",
        "specs/tiny.yaml:13:3: error[E711]: case `c` (triton): o block dim 0 is 12; Triton block dims must be powers "
        "of two\n  = help: use 16 (padding covers the ragged edge) or 8",
    ]
    assert rules._triton(inst("  triton:\n", "triton")) == []


def test_triton_dot_operands_are_at_least_16_along_each_dim():
    """E712, for the refs whose whole block feeds a dot."""
    dot = "  triton:\n    body: |\n      o_ref[...] = jnp.dot(x_ref[...], x_ref[...]) * x_ref[...]\n"
    assert shown(rules._triton(inst(dot, "triton"))) == [
        "specs/tiny.yaml:12:3: error[E712]: case `c` (triton): x is a dot operand with block (8,); Triton dots need "
        "every dim >= 16\n  = help: make each block dim of x at least 16"
    ]
    assert rules._triton(inst(dot.replace("  triton:\n", "  triton:\n    params: {bs: 16}\n"), "triton")) == []


def test_triton_num_warps_is_a_power_of_two_up_to_32():
    """E713, the param that num_warps names evaluated."""
    assert shown(rules._triton(inst("  triton:\n    params: {warps: 6}\n    compiler_params: {num_warps: warps}\n",
                                    "triton"))) == [
        "specs/tiny.yaml:21:3: error[E713]: case `c` (triton): num_warps is 6; Triton runs 1, 2, 4, 8, 16 or 32 warps "
        "per program\n  = help: give num_warps (or the param it names) a power of two up to 32"
    ]
    assert rules._triton(inst("  triton:\n    params: {warps: 32}\n    compiler_params: {num_warps: warps}\n",
                              "triton")) == []


def test_dot_operands():
    body = "a = x_ref[...]\nb = y_ref[:, :].astype(jnp.float32)\no_ref[...] = a @ b + jnp.dot(z_ref[0], w_ref[...])\n"
    assert rules.dot_operands(body) == {"x_ref", "y_ref", "w_ref"}  # z_ref[0] is not a whole block
    assert rules.dot_operands("o_ref[...] = lax.dot_general(x_ref[...], y_ref[:], dims)\n") == {"x_ref", "y_ref"}
    assert rules.dot_operands("o_ref[...] = x_ref[...] * y_ref[...]\n") == set()
    assert rules.dot_operands("def (:") == set()  # E600 reports the syntax error


# -- Mosaic GPU ---------------------------------------------------------------------


def test_mosaic_gpu_shared_memory():
    """E721: blocks x steps in flight + shared-memory scratch within 227 KiB."""
    scratch = "  mosaic_gpu:\n    scratch:\n      buf: {shape: [256, 256], dtype: float32, memory_space: smem}\n"
    assert shown(rules._mosaic_gpu(inst(scratch, "mosaic_gpu"))) == [
        "specs/tiny.yaml:21:3: error[E721]: case `c` (mosaic_gpu): shared memory estimate 258 KiB (blocks x 1 steps "
        "0 KiB + scratch) exceeds 227 KiB per block on Hopper\n"
        "  = help: use smaller blocks or fewer max_concurrent_steps"
    ]
    assert rules._mosaic_gpu(inst("  mosaic_gpu:\n    compiler_params: {max_concurrent_steps: 4}\n", "mosaic_gpu")) == []


def test_tma_block_dims():
    """E722: one TMA copy moves at most 256 elements along each dim (of the tiled block)."""
    assert shown(rules._tma_block_dims(inst("  mosaic_gpu:\n    params: {bs: 512}\n", "mosaic_gpu"))) == [
        "specs/tiny.yaml:12:3: error[E722]: case `c` (mosaic_gpu): x block (512,) is too large for TMA, which copies "
        "at most 256 elements along each dim\n  = help: use smaller blocks and cover the rest with the grid",
        "specs/tiny.yaml:13:3: error[E722]: case `c` (mosaic_gpu): o block (512,) is too large for TMA, which copies "
        "at most 256 elements along each dim\n  = help: use smaller blocks and cover the rest with the grid",
    ]
    assert rules._tma_block_dims(inst("  mosaic_gpu:\n    params: {bs: 256}\n", "mosaic_gpu")) == []
    assert rules._tma_box((128, 512), (64, 64)) == (2, 8, 64, 64)
    assert rules.tma_box_limit("w", "x", (128, 512), (64, 64), HERE, "fix") == []  # tiles of 64 x 64
    assert shown(rules.tma_box_limit("w", "x", (64, 512), (8, 512), HERE, "fix")) == [
        "specs/tiny.yaml:3:5: error[E722]: w: x block (64, 512) (tiled by (8, 512) it is copied as (8, 1, 8, 512)) is "
        "too large for TMA, which copies at most 256 elements along each dim\n  = help: fix"
    ]


# -- mesh kernels ---------------------------------------------------------------------


def test_mesh_gpu():
    """A Mosaic GPU mesh kernel: warpgroups (E723), clusters (E724), its pipelines' TMA boxes (E722)
    and shared memory (E721)."""

    def found(*edits) -> list:
        return shown(rules._mesh_gpu(inst_of(mutate(MESH, *edits), "mosaic_gpu")))

    assert found() == []
    assert found(("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 9}")) == [
        "specs/tiny.yaml:12:13: error[E723]: case `c` (mosaic_gpu): 9 warpgroups per CTA are 1152 CUDA threads; "
        "a CTA has 1 to 1024 (8 warpgroups)\n  = help: use at most 8 warpgroups"
    ]
    assert found(("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 2}"),
                 ('    grid: {i: "N // 2 // bs"}', '    grid: {i: "N // 2 // bs"}\n    warp_specialized: {num_compute_wgs: 2}')) == [
        "specs/tiny.yaml:12:13: error[E723]: case `c` (mosaic_gpu): pipeline steps computes on 2 warpgroups and "
        "copies on one more, but the mesh has 2\n  = help: set threads to 3"
    ]
    assert found(("  grid: {sm: 2}", "  grid: {sm: num_sms}\n  cluster: {c: 5}")) == [
        "specs/tiny.yaml:12:13: error[E724]: case `c` (mosaic_gpu): cluster c of 5 does not divide grid sm of 132 "
        "(num_sms = 132)\n  = help: choose a cluster size that divides the grid axis"
    ]
    assert found(("  grid: {sm: 2}", "  grid: {sm: 16}\n  cluster: {c: 16}")) == [
        "specs/tiny.yaml:12:13: error[E724]: case `c` (mosaic_gpu): a cluster of 16 CTAs is above the portable limit "
        "of 8\n  = help: use at most 8 CTAs per cluster"
    ]
    assert found(("  bs: 128", "  bs: 512"), ("N: 1024", "N: 65536")) == [
        "specs/tiny.yaml:16:7: error[E722]: case `c` (mosaic_gpu): pipeline steps block of x block (512,) is too "
        "large for TMA, which copies at most 256 elements along each dim\n"
        "  = help: use smaller blocks and cover the rest with the pipeline grid",
        "specs/tiny.yaml:18:7: error[E722]: case `c` (mosaic_gpu): pipeline steps block of o block (512,) is too "
        "large for TMA, which copies at most 256 elements along each dim\n"
        "  = help: use smaller blocks and cover the rest with the pipeline grid",
    ]
    assert found(("  bs: 128", "  bs: 256"), ("N: 1024", "N: 65536"),
                 ('    grid: {i: "N // 2 // bs"}', '    grid: {i: "N // 2 // bs"}\n    buffers: 128')) == [
        "specs/tiny.yaml:30:3: error[E721]: case `c` (mosaic_gpu): shared memory estimate 256 KiB (pipeline blocks "
        "x buffers 256 KiB + scratch) exceeds 227 KiB per block on Hopper\n"
        "  = help: use smaller blocks, fewer pipeline buffers or less scratch"
    ]


def test_mesh_tpu():
    """A Mosaic TPU mesh kernel (specs/rms_norm_cores.yaml): its pipelines' blocks tile (E701) and
    fit VMEM double-buffered (E703)."""
    text = (REPO / "specs" / "rms_norm_cores.yaml").read_text()
    path = "specs/rms_norm_cores.yaml"

    def found(*edits) -> list:
        return shown(rules._mesh_tpu(inst_of(mutate(text, *edits), "mosaic_tpu", path)))

    assert found() == []
    assert found(("bm: {default: 16, choices: [8, 16, 32, 64]", "bm: {default: 4, choices: [4]")) == [
        f"{path}:25:49: error[E701]: case `square` (mosaic_tpu): pipeline rows block of x block dim 0 is 4; on TPU "
        "the second-to-last block dim must be divisible by 8 for float32 or equal the array dim (128)\n"
        "  = help: use a multiple of 8 (e.g. 8) or the full dim",
        f"{path}:28:49: error[E701]: case `square` (mosaic_tpu): pipeline rows block of y block dim 0 is 4; on TPU "
        "the second-to-last block dim must be divisible by 8 for float32 or equal the array dim (128)\n"
        "  = help: use a multiple of 8 (e.g. 8) or the full dim",
    ]
    wide = ("- {name: square, M: 256, N: 256}", "- {name: square, M: 256, N: 65536}")
    assert found(wide) == [
        f"{path}:55:3: error[E703]: case `square` (mosaic_tpu): VMEM estimate 16.5 MiB (pipeline blocks x 2 buffers "
        "16.5 MiB + scratch) exceeds the limit of 16.0 MiB\n"
        "  = help: use smaller pipeline blocks, or raise compiler_params.vmem_limit_bytes"
    ]
    assert found(wide, ("backends:\n  mosaic_tpu:",
                        "backends:\n  mosaic_tpu:\n    compiler_params: {vmem_limit_bytes: 100000000}")) == []


@pytest.mark.parametrize("n, shown_as", [(512, "512 bytes"), (1536, "1.5 KiB"), (3 << 20, "3.0 MiB")])
def test_budgets_print_in_readable_units(n, shown_as):
    assert rules._bytes(n) == shown_as


def test_slice_sizes_reads_every_access_of_the_ref():
    """The dims every access of `x_ref` slices statically, with each slice's size."""
    loop = "for s in range(3):\n    o_ref[pl.ds(s * 128, 128)] = x_ref[pl.ds(s * 128, sl), 0:64]\n"
    assert rules.slice_sizes(loop, "x", (384, 128)) == {0: ["sl"], 1: [64]}
    assert rules.slice_sizes(loop, "o", (384,)) == {0: [128]}
    assert rules.slice_sizes("o_ref[...] = x_ref[pl.ds(0, 8), ...]\n", "x", (384, None, 12)) == {0: [8]}
    assert rules.slice_sizes("a = x_ref[pl.ds(0, 8)]\nb = x_ref[...]\n", "x", (384,)) == {}  # read whole once
    assert rules.slice_sizes("f(x_ref)\nb = x_ref[pl.ds(0, 8)]\n", "x", (384,)) == {}  # passed on
    assert rules.slice_sizes("sl = 96\nb = x_ref[pl.ds(0, sl)]\n", "x", (384,)) == {}  # sl is the body's own
    assert rules.slice_sizes("b = x_ref.at[pl.ds(0, 16)][...].astype(x_ref.dtype)\n", "x", (384,)) == {0: [16]}
    assert rules.slice_sizes("def (:", "x", (384,)) == {}
    assert rules.pow2_sliced_dims(loop, "x", (384, 128), {"sl": 128}) == {0, 1}
    assert rules.pow2_sliced_dims(loop, "x", (384, 128), {"sl": 96}) == {1}


def test_triton_judges_block_dims_by_the_bodys_slices():
    """E711 stays off a dim the body only slices by powers of two, and for a `sliced: true` block."""
    section = ("  triton:\n    params: {bs: 12}\n    body: |\n"
               "      o_ref[pl.ds(0, 8)] = x_ref[pl.ds(0, 8)] * 2\n      o_ref[pl.ds(8, 4)] = x_ref[pl.ds(8, 4)] * 2\n")
    assert rules._triton(inst(section, "triton")) == []  # slices of 8 and 4 of a block of 12
    assert [d.code for d in rules._triton(inst(section.replace("pl.ds(0, 8)", "pl.ds(0, 12)"), "triton"))] == [
        "E711", "E711"]
    whole = "  triton:\n    params: {bs: 12}\n    blocks:\n"
    whole += "".join(f'      {n}: {{block_shape: [bs], index_map: "i -> (i,)", sliced: true}}\n' for n in "xo")
    assert rules._triton(inst(whole, "triton")) == []


def test_backend_auto_checks_the_slice_sizes_of_a_sliced_dim():
    from kspec.codegen.backends import requirements

    spec = build_spec(VALID_SPEC.replace("  o_ref[...] = x_ref[...] * 2\n", "  o_ref[pl.ds(0, bs)] = x_ref[pl.ds(0, sl)]\n")
                      .replace("  bs: 8\n", "  bs: 8\n  sl: 8\n") + "backends:\n  triton:\n")
    reqs = requirements._triton(spec, spec.variants["triton"])
    assert [r.condition for r in reqs] == ["_runtime.is_pow2(sl)", "_runtime.is_pow2(bs)"]
    assert reqs[0].reason == ("'x block ' + str((bs,)) + ' or its slices (' + _runtime.shown(['sl'], (sl,)) + ')' + "
                              "' is not all powers of two, which Triton needs'")
