"""Mesh kernels (`kind: mesh`): checks, codegen, TPU interpret runs, Mosaic GPU lowering."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, invoke_kspec, mutate
from jax.experimental.pallas import tpu as pltpu
from test_diagnostics import MESH

from kspec.codegen.checks import instances
from kspec.codegen import project as pipeline
from kspec.codegen import tune


def _spec(name: str):
    compiled = pipeline.compile_spec(REPO / "specs" / f"{name}.yaml")
    assert compiled.ok, compiled.diagnostics
    return compiled.spec


def _tpu(cores: int = 2):
    return pltpu.InterpretParams(detect_races=True, num_cores_or_threads=cores, uninitialized_memory="nan")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tpu_core_mesh_kernel_matches_reference_on_two_simulated_cores(dtype):
    module = importlib.import_module("generated.rms_norm_cores.mosaic_tpu")
    reference = importlib.import_module("generated.rms_norm_cores.reference")
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (256, 256), jnp.float32).astype(dtype)
    w = jax.random.normal(keys[1], (1, 256), jnp.float32).astype(dtype)
    got = module.rms_norm_cores(x, w, interpret=_tpu())
    want = reference.rms_norm_cores_reference(x, w)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
    one_core = module.rms_norm_cores(x, w, cores=1, interpret=_tpu(1))
    assert np.array_equal(np.asarray(one_core, np.float32), np.asarray(got, np.float32))


def test_tpu_core_mesh_kernel_lowers_for_tpu_on_a_cpu():
    module = importlib.import_module("generated.rms_norm_cores.mosaic_tpu")
    shapes = [jax.ShapeDtypeStruct((512, 256), jnp.float32), jax.ShapeDtypeStruct((1, 256), jnp.float32)]
    text = jax.jit(module.rms_norm_cores).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text


def test_persistent_mosaic_gpu_matmul_lowers_for_cuda_on_a_cpu():
    module = importlib.import_module("generated.matmul_persistent.mosaic_gpu")
    shapes = [jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16)]
    text = jax.jit(module.matmul_persistent).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


# The row-streaming kernels' (1, N) row inputs after x: gamma and beta, gamma, none.
ROW_INPUTS = {"layer_norm_tma": 2, "rms_norm_tma": 1, "softmax_tma": 0}


def _gpu_interpret():
    """Mosaic GPU interpret mode (jax's simulation of CTAs, shared memory, barriers and TMA on
    the CPU); jax exports no public name for it yet."""
    params = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
    return params.force_gpu_interpret_mode(params.InterpretGPUParams())


@pytest.mark.parametrize("name, M, N, dtype, params", [
    ("layer_norm_tma", 600, 256, "float32", {}),  # 264 CTAs (2 per SM) walk 2-3 rows each: the ring wraps
    ("layer_norm_tma", 600, 256, "float32", {"slots": 2, "ctas": 1}),  # 4-5 rows through 2 slots
    ("layer_norm_tma", 64, 512, "bfloat16", {}),  # fewer rows than CTAs: most have none
    ("rms_norm_tma", 600, 256, "float32", {"slots": 4, "ctas": 1}),
    ("softmax_tma", 600, 256, "float32", {}),
])
def test_row_streaming_kernels_match_reference_in_mosaic_gpu_interpret_mode(name, M, N, dtype, params):
    """The row ring of layer_norm_tma / rms_norm_tma / softmax_tma (TMA bulk copies in, compute
    in place, TMA store out, refill slots - 1 rows ahead) runs on the CPU in Mosaic GPU interpret mode."""
    module = importlib.import_module(f"generated.{name}.mosaic_gpu")
    reference = importlib.import_module(f"generated.{name}.reference")
    keys = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(keys[0], (M, N), jnp.float32).astype(dtype)
    affine = [jax.random.normal(k, (1, N), jnp.float32).astype(dtype) for k in keys[1:]]
    args = (x, *affine[: ROW_INPUTS[name]])
    with _gpu_interpret():
        got = getattr(module, name)(*args, **params)
    want = getattr(reference, f"{name}_reference")(*args)
    assert got.dtype == x.dtype
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["layer_norm_tma", "softmax_tma"])
def test_row_streaming_kernels_differentiate_through_the_backward_specs(name):
    """jax.vjp of layer_norm_tma / softmax_tma runs layer_norm's / softmax's backward kernels (on a
    GPU their Triton forms; here, without one, their interpret forms) after the forward kernel,
    which runs in Mosaic GPU interpret mode; the gradients match the reference's."""
    vjp = importlib.import_module(f"generated.{name}._vjp")
    reference = getattr(importlib.import_module(f"generated.{name}.reference"), f"{name}_reference")
    keys = jax.random.split(jax.random.key(5), 4)
    args = [jax.random.normal(keys[0], (300, 256))] + [jax.random.normal(k, (1, 256)) for k in keys[1:1 + ROW_INPUTS[name]]]
    cotangent = jax.random.normal(keys[3], (300, 256))
    with _gpu_interpret():
        _, pullback = jax.vjp(vjp.differentiable("mosaic_gpu"), *args)
    got = pullback(cotangent)  # traced outside the GPU interpreter: the backward kernels are pallas_calls
    want = jax.vjp(reference, *args)[1](cotangent)
    assert len(got) == 1 + ROW_INPUTS[name]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(ROW_INPUTS))
def test_row_streaming_kernels_lower_for_cuda_with_bulk_copies(name):
    """Rows of 8192 float32 lower: whole contiguous rows go by TMA bulk copy, which has no
    256-element box limit (a tiled TMA copy of the same row would not lower)."""
    module = importlib.import_module(f"generated.{name}.mosaic_gpu")
    shapes = [jax.ShapeDtypeStruct((16384, 8192), jnp.float32)] + [jax.ShapeDtypeStruct((1, 8192), jnp.float32)] * ROW_INPUTS[name]
    text = jax.jit(getattr(module, name)).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def _without_cluster(spec: str, name: str, *edits: tuple) -> str:
    """specs/<spec>.yaml renamed `name` for Mosaic GPU interpret mode, which has no clusters: no
    `mesh.cluster`, a grid of `ctas` CTAs (a param, 3 by default) and no multicast. `edits` then
    let one CTA take both row tiles of a cluster tile in turn."""
    text, grids = re.subn(r'grid: \{sm: "[^"]*"\}', "grid: {sm: ctas}", (REPO / "specs" / f"{spec}.yaml").read_text())
    assert grids == 1, grids
    return mutate(text, (f"name: {spec}", f"name: {name}"), ("params:\n", "params:\n  ctas: {default: 3}\n"),
                  ("  cluster: {cta: 2}\n", ""), (", collective_axes: [cta]", ""), *edits)


def _run_interpreted(tmp_path: Path, name: str, text: str, script: str) -> list:
    """Generates spec `name` from `text` into tmp_path and runs `script` against it in a
    subprocess; returns its output lines, split. A barrier that never completes hangs a kernel in
    Mosaic GPU interpret mode, so the subprocess gets 120 s and a timeout fails the test."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    try:
        proc = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in 120 s: its barriers see more or fewer arrivals than waits")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line.split() for line in proc.stdout.splitlines()]


# Runs generated/mm_flow (the spec below) in Mosaic GPU interpret mode and prints the largest error.
FLOW_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax._src.pallas.mosaic_gpu.interpret import params
from generated.mm_flow.mosaic_gpu import mm_flow
a = jax.random.normal(jax.random.key(4), (512, 512), jnp.float32).astype(jnp.bfloat16)
b = jax.random.normal(jax.random.key(5), (512, 512), jnp.float32).astype(jnp.bfloat16)
want = np.asarray(jnp.dot(a, b, preferred_element_type=jnp.float32))
# 8 tiles on 3 CTAs: 3, 3 and 2 tiles (START, STEADY, STOP); on 5 CTAs three have one tile.
for ctas, steps in ((3, 4), (5, 2)):
    with params.force_gpu_interpret_mode(params.InterpretGPUParams()):
        got = mm_flow(a, b, ctas=ctas, steps=steps)
    print(ctas, steps, float(np.max(np.abs(np.asarray(got, np.float32) - want))))
"""


def test_persistent_matmul_pipeline_flows_from_tile_to_tile_in_mosaic_gpu_interpret_mode(tmp_path):
    """matmul_persistent's tile loop runs on the CPU in Mosaic GPU interpret mode: the pipeline
    flows from tile to tile (pipeline_state START, STEADY, STOP), each step's buffers are released
    one step late through the consumed barriers, and a CTA with one tile runs a pipeline of its
    own. The interpreter has no clusters, so here one CTA takes both row tiles of a cluster tile
    in turn and B is not multicast. A release too few or too many leaves a barrier waiting
    forever: the kernel runs in a subprocess, so that fails this test instead of hanging it."""
    pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
    text = _without_cluster(
        "matmul_persistent", "mm_flow",
        ("@plgpu.nd_loop((m_tiles * n_tiles,), ", "@plgpu.nd_loop((m_tiles * n_tiles * 2,), "),
        ("(t,) = info.index", "(t2,) = info.index\n          t, cta = t2 // 2, t2 % 2"),
    )
    errors = _run_interpreted(tmp_path, "mm_flow", text, FLOW_SCRIPT)
    assert [(ctas, steps) for ctas, steps, _ in errors] == [("3", "4"), ("5", "2")]
    assert all(float(err) <= 0.5 for *_, err in errors), errors  # bf16 rounding of sums around +-60


# Runs generated/pp_flow (matmul_bias_gelu_pingpong without its cluster) in Mosaic GPU interpret
# mode and prints the largest error.
PINGPONG_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax._src.pallas.mosaic_gpu.interpret import params
from generated.pp_flow.mosaic_gpu import pp_flow
x = jax.random.normal(jax.random.key(4), (512, 512), jnp.float32).astype(jnp.bfloat16)
w = jax.random.normal(jax.random.key(5), (512, 512), jnp.float32).astype(jnp.bfloat16)
b = jax.random.normal(jax.random.key(6), (1, 512), jnp.float32).astype(jnp.bfloat16)
want = np.asarray(jax.nn.gelu(jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)))
# 16 tiles, 8 K steps each: on 3 CTAs (6, 5 and 5 tiles, the ring of 6 slots wrapping inside and
# across tiles) and on 5 CTAs with 5 slots (4, 3, 3, 3, 3 tiles).
for ctas, slots in ((3, 6), (5, 5)):
    with params.force_gpu_interpret_mode(params.InterpretGPUParams()):
        got = pp_flow(x, w, b, ctas=ctas, slots=slots)
    print(ctas, slots, float(np.max(np.abs(np.asarray(got, np.float32) - want))))
"""


def test_pingpong_matmul_takes_tiles_in_turn_in_mosaic_gpu_interpret_mode(tmp_path):
    """matmul_bias_gelu_pingpong's warpgroups run on the CPU in Mosaic GPU interpret mode: the
    copier fills one ring of slots in tile order, each compute warpgroup waits only on its own
    "full" barriers and takes every other tile of its CTA, and the copier waits out the last
    releases. As in the test above, the cluster is taken out (one CTA takes both row tiles of a
    cluster tile in turn, and w is not multicast), and a barrier that never completes fails the
    test after 120 s instead of hanging it."""
    pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
    text = _without_cluster(
        "matmul_bias_gelu_pingpong", "pp_flow",
        (',\n                                      collective_axes="cta")', ")"),
        ("def tile(t):\n", "def tile(t2):\n      t, cta = t2 // 2, t2 % 2\n"),
    ).replace("nd_loop((m_tiles * n_tiles,)", "nd_loop((m_tiles * n_tiles * 2,)")
    assert text.count("nd_loop((m_tiles * n_tiles * 2,)") == 2
    errors = _run_interpreted(tmp_path, "pp_flow", text, PINGPONG_SCRIPT)
    assert [(ctas, slots) for ctas, slots, _ in errors] == [("3", "6"), ("5", "5")]
    assert all(float(err) <= 0.5 for *_, err in errors), errors  # bf16 rounding of values up to ~60


@pytest.mark.parametrize("name", ["matmul_pingpong", "matmul_bias_gelu_pingpong"])
def test_pingpong_matmuls_lower_for_cuda_on_a_cpu(name):
    """The ping-pong kernels, cluster barrier and multicast included, lower for CUDA, with a
    CTA that has one tile (512^2) and CTAs that have several (4096 x 2048)."""
    module = importlib.import_module(f"generated.{name}.mosaic_gpu")
    for m, n, k in ((512, 512, 512), (4096, 2048, 512)):
        shapes = [jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16)]
        shapes += [jax.ShapeDtypeStruct((1, n), jnp.bfloat16)] if "gelu" in name else []
        text = jax.jit(getattr(module, name)).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text
    gen = (REPO / "generated" / name / "mosaic_gpu.py").read_text()
    assert "plgpu.ClusterBarrier(collective_axes=('cta',), num_arrivals=1, num_barriers=slots)," in gen
    assert "plgpu.Barrier(num_arrivals=2, num_barriers=2 * slots)," in gen


def test_a_scratch_barrier_spans_a_cluster_axis_only(tmp_path):
    cluster = ("  grid: {sm: 2}", "  grid: {sm: 2}\n  cluster: {c: 2}")
    scratch = ("body: |", "scratch:\n  bar: {shape: [2], kind: barrier, collective_axes: [c]}\nbody: |")
    assert _check(mutate(MESH, cluster, scratch), tmp_path).rc == 0
    r = _check(mutate(MESH, scratch), tmp_path)
    assert r.rc == 2
    assert "error[E432]: mosaic_gpu: scratch bar collective_axes [c]: `c` is not a cluster axis of the mesh" in r.out
    array = "scratch:\n  buf: {shape: [2], dtype: float32, memory_space: smem, collective_axes: [c]}\nbody: |"
    r = _check(mutate(MESH, cluster, ("body: |", array)), tmp_path)
    assert r.rc == 2
    assert "error[E432]: mosaic_gpu: scratch buf collective_axes [c]: only a barrier spans a cluster" in r.out


def test_fused_persistent_matmul_lowers_for_cuda_on_a_cpu():
    """matmul_bias_gelu_persistent: the bias TMA, its barrier and the GELU (approx_math) lower."""
    module = importlib.import_module("generated.matmul_bias_gelu_persistent.mosaic_gpu")
    shapes = [jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16),
              jax.ShapeDtypeStruct((1, 1024), jnp.bfloat16)]
    text = jax.jit(module.matmul_bias_gelu_persistent).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
    gen = (REPO / "generated" / "matmul_bias_gelu_persistent" / "mosaic_gpu.py").read_text()
    assert "plgpu.Barrier(num_arrivals=1, num_barriers=2)" in gen
    assert "approx_math=True" in gen


def test_generated_mesh_modules_spell_the_mesh_and_pipelines():
    gpu = (REPO / "generated" / "matmul_persistent" / "mosaic_gpu.py").read_text()
    for line in (
        "return plgpu.emit_pipeline_warp_specialized(",
        "grid=((2 * pl.cdiv(M // (2 * tm) * (N // (2 * tn)), pl.cdiv(M // (2 * tm) * (N // (2 * tn)), num_sms // 2))) // (2),),",
        'grid_names=("sm",),',
        "cluster=(2,),",
        'cluster_names=("cta",),',
        "plgpu.SwizzleTransform(128)), collective_axes=('cta',)),",
        "pipeline_state=state, **manual)(",
        "num_threads=3,",
        'thread_name="wg",',
        "max_concurrent_steps=steps,",
        'wg_axis="wg",',
        "plgpu.SMEM((2, tm, epi), jnp.bfloat16, transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))),",
        "compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),",
        'wg=lax.axis_index("wg"),',
    ):
        assert line in gpu, line
    tpu = (REPO / "generated" / "rms_norm_cores" / "mosaic_tpu.py").read_text()
    for line in (
        'mesh=pltpu.create_tensorcore_mesh("core", num_cores=cores),',
        "return pltpu.emit_pipeline(",
        "pl.BlockSpec((bm, N), lambda i: (i, 0)),",
        'core=lax.axis_index("core"),',
        "interpret=interpret,",
    ):
        assert line in tpu, line


def test_tune_prunes_mesh_configs_over_the_shared_memory_budget():
    spec = _spec("matmul_persistent")
    variant = spec.variants["mosaic_gpu"]
    case = spec.bench[0]
    dtypes = {"a": "bfloat16", "b": "bfloat16", "o": "bfloat16"}
    configs = [{"tm": 128, "tn": 128, "steps": s} for s in (4, 8, 3)]
    kept, pruned = tune.prune(spec, variant, case, dtypes, configs)
    assert kept == [{"tm": 128, "tn": 128, "steps": 4}]
    assert pruned == [
        (
            {"tm": 128, "tn": 128, "steps": 8},
            ("E721: case `b8192` (mosaic_gpu): shared memory estimate 416 KiB (pipeline blocks x buffers 384 KiB "
            "+ scratch) exceeds 227 KiB per block on Hopper"),
        ),
        (
            {"tm": 128, "tn": 128, "steps": 3},  # 128 K steps do not divide into 3 buffers
            ("E501: case `b8192` (K=8192, steps=3, tk=64): the K steps must be a multiple of the pipeline's buffers, "
             "so that one tile's pipeline flows into the next"),
        ),
    ]


def _check(text: str, tmp_path: Path):
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "bad.yaml").write_text(text)
    return invoke_kspec("check", "specs/bad.yaml", cwd=tmp_path)


def test_pipeline_blocks_are_checked_like_block_specs(tmp_path):
    r = _check(mutate(MESH, ('o: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i,)"}',
                             'o: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i + 1,)"}')), tmp_path)
    assert r.rc == 2
    assert (
        "specs/bad.yaml:18:59: error[E502]: case `c`: steps.o.index_map at step (3,) gives block index (4,); "
        "dim 0 is 4, valid 0..3" in r.out
    )
    r = _check(mutate(MESH, ('grid: {i: "N // 2 // bs"}', 'grid: {i: "N // 4 // bs"}')), tmp_path)
    assert r.rc == 2
    assert "error[E503]: case `c`: pipeline steps never writes block (2,) of its o view (512,)" in r.out
    r = _check(mutate(MESH, ('index_map: "i -> (i,)"}\n    out', 'index_map: "i, j -> (i,)"}\n    out')), tmp_path)
    assert "error[E403]: steps.in.x: index_map takes 2 indices but pipeline steps has 1 axis" in r.out
    r = _check(mutate(MESH, ("block_shape: [bs], index_map", "block_shape: [bs, 2], index_map")), tmp_path)
    assert "error[E402]: steps.in.x: block_shape has 2 dims but the view has rank 1" in r.out
    r = _check(mutate(MESH, ("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 2}"),
                      ('    grid: {i: "N // 2 // bs"}', '    grid: {i: "N // 2 // bs"}\n    warp_specialized: {num_compute_wgs: 2}')),
               tmp_path)
    assert "error[E723]: case `c` (mosaic_gpu): pipeline steps computes on 2 warpgroups and copies on one more, but the mesh has 2" in r.out


def test_verify_runs_mesh_kernels_and_catches_cores_that_overlap(tmp_path):
    (tmp_path / "specs").mkdir()
    good = (REPO / "specs" / "rms_norm_cores.yaml").read_text()
    (tmp_path / "specs" / "rms_norm_cores.yaml").write_text(good)
    # Both cores take the first half of the rows: the second half is never written.
    bad = mutate(good, ("name: rms_norm_cores", "name: rms_norm_overlap"),
                 ("mine = pl.ds(core * share, share)", "mine = pl.ds(0, share)"))
    (tmp_path / "specs" / "rms_norm_overlap.yaml").write_text(bad)
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    report = tmp_path / "verify.json"
    r = invoke_kspec("verify", "--case", "wide", "--json", str(report), cwd=tmp_path, timeout=300)
    assert r.rc == 1, r.both
    rows = {(x["kernel"], x["status"]) for x in json.loads(report.read_text())["results"]}
    assert rows == {("rms_norm_cores", "pass"), ("rms_norm_overlap", "fail")}


def test_mesh_instance_evaluates_mesh_and_pipelines():
    spec = _spec("matmul_persistent")
    inst, diags = instances.instantiate(spec, spec.variants["mosaic_gpu"], spec.bench[0], {"a": "bfloat16", "b": "bfloat16", "o": "bfloat16"})
    assert diags == []
    # 1024 cluster tiles take 16 waves of the 66 clusters (num_sms = 132), and so 64 clusters
    assert inst.mesh == {"sm": 128, "cta": 2, "wg": 3}
    pipe = inst.pipes["k_loop"]
    assert dataclasses.astuple(pipe) == ((128,), {"a": (128, 8192), "b": (8192, 256)}, {"a": (128, 64), "b": (64, 256)}, 4)
    dtypes = {"a": "bfloat16", "b": "bfloat16", "o": "bfloat16"}
    small = instances.instantiate(spec, spec.variants["mosaic_gpu"], spec.cases[0], dtypes)[0]  # 512^3: 4 cluster tiles
    assert small.mesh["sm"] == 8
    mlp = instances.instantiate(spec, spec.variants["mosaic_gpu"], spec.bench[2], dtypes)[0]  # 2048 tiles: 32 waves
    assert (spec.bench[2].name, mlp.mesh["sm"]) == ("mlp4096", 128)


def test_multicast_needs_an_input_of_a_warp_specialized_pipeline_and_a_cluster_axis(tmp_path):
    multicast = ('x: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i,)"}',
                 'x: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i,)", collective_axes: [c]}')
    r = _check(mutate(MESH, multicast), tmp_path)
    assert r.rc == 2
    assert "error[E432]: mosaic_gpu: pipeline steps: x collective_axes [c]: only a warp-specialized pipeline multicasts" in r.out
    r = _check(mutate(MESH, multicast, ("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 3}"),
                      ('    grid: {i: "N // 2 // bs"}', '    grid: {i: "N // 2 // bs"}\n    warp_specialized: {num_compute_wgs: 2}')),
               tmp_path)
    assert "error[E432]: mosaic_gpu: pipeline steps: x collective_axes [c]: `c` is not a cluster axis of the mesh" in r.out
