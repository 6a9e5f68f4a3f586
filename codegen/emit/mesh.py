"""Kernels that are not one pallas_call: a mesh kernel (plgpu.kernel, or pl.kernel over a
TensorCore mesh) with its emit_pipeline stages, and Mosaic GPU's plgpu.kernel + emit_pipeline
form of a gridded spec."""

from __future__ import annotations

from kspec.codegen.emit import blocks
from kspec.codegen.emit.source import gpu_layout, lambda_src, tuple_src
from kspec.codegen.spec.expr import Expr
from kspec.codegen.spec.model import KernelSpec, MeshRole, Variant


def mesh(spec: KernelSpec, variant: Variant) -> dict:
    """A mesh kernel: plgpu.kernel or pl.kernel over a TensorCore mesh, its pipelines as
    factories the body calls, and the mesh axis indices the body mentions."""
    gpu = variant.backend == "mosaic_gpu"
    used = variant.body.names
    grid, cluster = variant.mesh_axes(MeshRole.GRID), variant.mesh_axes(MeshRole.CLUSTER)
    threads, cores = variant.mesh_axes(MeshRole.THREADS), variant.mesh_axes(MeshRole.CORES)
    kernel_grid = []
    for n, axis in enumerate(grid):
        size = axis.size.render()
        kernel_grid.append(f"({size}) // ({cluster[n].size.render()})" if n < len(cluster) else size)
    mesh = {}
    if gpu:
        mesh["grid"] = tuple_src(kernel_grid)
        mesh["grid_names"] = tuple_src(f'"{a.name}"' for a in grid)
        if cluster:
            mesh["cluster"] = tuple_src(a.size.render() for a in cluster)
            mesh["cluster_names"] = tuple_src(f'"{a.name}"' for a in cluster)
        if threads:
            mesh["num_threads"] = threads[0].size.render()
            mesh["thread_name"] = f'"{threads[0].name}"'
    else:
        core = cores[0]
        mesh["mesh"] = f'pltpu.create_tensorcore_mesh("{core.name}", num_cores={core.size.render()})'
    pipelines = [_mesh_pipeline(spec, variant, p) for p in variant.pipelines]
    return {
        "grid_indices": {a.name: a.name for a in variant.mesh if a.name in used},
        "kernel_kwargs": [p.name for p in variant.pipelines] + [p.name for p in variant.params] + list(spec.dims),
        "mesh_args": [f"{k}={v}" for k, v in mesh.items()],
        "pipelines": pipelines,
        "num_sms": any("num_sms" in a.size.names for a in grid),
        "refs": {o.name: variant.refs.get(o.name) for o in spec.operands if variant.refs.get(o.name)},
    }


def _mesh_pipeline(spec: KernelSpec, variant: Variant, pipe) -> dict:
    """One pipeline of a mesh kernel: the emit_pipeline call the body's factory makes."""
    gpu = variant.backend == "mosaic_gpu"
    names = [a.name for a in pipe.grid]
    specs = {"in": [], "out": []}
    for pb in pipe.blocks:
        block = pb.block
        shape = tuple_src(e.render() for e in block.block_shape)
        index_map = lambda_src(names, tuple_src(r.render(traced=True) for r in block.index_map.results))
        extra = [kw for kw in [gpu_layout(block)] if kw] if gpu else []
        cls = "plgpu.BlockSpec" if extra else "pl.BlockSpec"
        specs[pb.role].append(f"{cls}({', '.join([shape, index_map] + extra)})")
    options = []
    if gpu and pipe.compute_wgs:
        thread = variant.mesh_axes(MeshRole.THREADS)[0].name
        options += [f'wg_axis="{thread}"', f"num_compute_wgs={pipe.compute_wgs}", f"memory_registers={pipe.memory_registers}"]
    if gpu:
        options.append(f"max_concurrent_steps={pipe.buffers.render() if pipe.buffers is not None else 2}")
    views = [f"{pb.operand} [{', '.join(e.shown for e in (pb.view or spec.operand(pb.operand).shape))}]"
             for pb in pipe.blocks]
    function = ("plgpu.emit_pipeline_warp_specialized" if pipe.compute_wgs else "plgpu.emit_pipeline") if gpu \
        else "pltpu.emit_pipeline"
    return {
        "name": pipe.name,
        "function": function,
        "grid": tuple_src(a.size.render() for a in pipe.grid),
        "in_specs": specs["in"],
        "out_specs": specs["out"],
        "options": options,
        "views": ", ".join(views),
        "step_args": ("(indices, " if gpu else "(") + ", ".join(f"{pb.operand}_block" for pb in pipe.blocks) + ")",
    }


def gpu_pipeline(spec: KernelSpec, variant: Variant) -> dict:
    """plgpu.kernel + plgpu.emit_pipeline: the parallel grid axes are the kernel's grid
    (read with lax.axis_index), the sequential ones the pipeline's (its `indices`)."""
    params = dict(variant.compiler_params)
    semantics = params.pop("dimension_semantics", None) or ["parallel"] * len(variant.grid)
    depth = params.pop("max_concurrent_steps", 1)
    names = [a.name or f"_{n}" for n, a in enumerate(variant.grid)]
    parallel = [n for n, s in enumerate(semantics) if s == "parallel"]
    sequential = [n for n, s in enumerate(semantics) if s != "parallel"]
    specs = {o.name: blocks.block_spec(spec, variant, o, (names, sequential)) for o in spec.operands}
    return {
        "kernel_grid": tuple_src(variant.grid[n].size.render() for n in parallel),
        "kernel_grid_names": tuple_src(f'"{names[n]}"' for n in parallel),
        "operand_refs": [f"{o.name}_ref" for o in spec.operands],
        "parallel_indices": [names[n] for n in parallel],
        "pipeline_grid": tuple_src(variant.grid[n].size.render() for n in sequential),
        "pipeline_indices": [names[n] for n in sequential],
        "pipeline_in_specs": [specs[o.name] for o in spec.inputs],
        "pipeline_out_specs": [specs[o.name] for o in spec.outputs],
        "max_concurrent_steps": depth.render() if isinstance(depth, Expr) else depth,
        "compiler_params": blocks.compiler_params(variant.backend, params),
    }
