"""Mesh kernels (`kind: mesh`): checks of the mesh, the refs and the emit_pipeline stages.

A mesh kernel runs its body once per point of a mesh over whole refs: on Mosaic GPU
`plgpu.kernel` (a grid of CTAs, optional clusters, warpgroup threads), on Mosaic TPU
`pl.kernel` over a TensorCore mesh. Its blocks live in declared `pipelines:`, which
the body calls (`k_loop(step)(a_ref.at[rows], b_ref)`); each pipeline block is checked
like a BlockSpec is: rank, index-map arity, bounds and coverage over its view, and the
backend's tiling, TMA and memory-budget rules. Nothing here traces JAX.
"""

from __future__ import annotations

import dataclasses
import itertools

from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.backends import BACKENDS
from kspec.codegen.backends.rules import CHECKED_NUM_SMS, NUM_SMS
from kspec.codegen.spec.model import MeshRole, PipeRole, Role, SpecKind

MESH_BACKENDS = tuple(name for name, b in BACKENDS.items() if b.mesh_roles)  # those that run mesh kernels


@dataclasses.dataclass(frozen=True)
class PipeInstance:
    """A pipeline with its sizes evaluated for one case."""

    grid: tuple
    views: dict  # operand -> view shape
    blocks: dict  # operand -> block shape
    buffers: int


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def structure(spec, v, unknown) -> list:
    """Case-independent checks of one variant (E430 to E432, E402 to E404, E301).

    `unknown(expr, scope, what)` is checks._unknown (unknown names in an expression)."""
    if spec.kind != SpecKind.MESH:
        if v.mesh or v.pipelines or v.refs:
            return [Diagnostic("E430", f"{v.backend}: `mesh`, `pipelines` and `refs` belong to mesh kernels",
                               v.mesh_loc or v.loc, "add `kind: mesh` at the top of the spec, or remove them")]
        return []
    out = []
    where = v.backend
    if v.grid or v.blocks:
        out.append(Diagnostic("E430", f"{where}: a mesh kernel has no grid or blocks: its body gets whole refs",
                              v.loc, "declare the mesh under `mesh:` and per-step blocks under `pipelines:`"))
    if v.backend not in MESH_BACKENDS:
        return out + [Diagnostic("E431", f"{where}: mesh kernels run on {' and '.join(MESH_BACKENDS)}, "
                                 f"not {v.backend}", v.loc,
                                 f"declare the kernel for {' or '.join(MESH_BACKENDS)} under `backends:`")]
    roles = BACKENDS[v.backend].mesh_roles
    if not v.mesh:
        return out + [Diagnostic("E431", f"{where}: a mesh kernel needs a `mesh:` for this backend", v.loc,
                                 "e.g. `mesh: {grid: {sm: num_sms}}` (mosaic_gpu) or `mesh: {cores: {core: 2}}` (mosaic_tpu)")]
    for axis in v.mesh:
        if axis.role not in roles:
            out.append(Diagnostic("E431", f"{where}: mesh `{axis.role}` is not a {v.backend} mesh axis",
                                  axis.loc, f"{v.backend} meshes take {', '.join(roles)}"))
    if v.backend == "mosaic_gpu":
        grid, cluster = v.mesh_axes(MeshRole.GRID), v.mesh_axes(MeshRole.CLUSTER)
        if not grid:
            out.append(Diagnostic("E431", f"{where}: the mesh needs a `grid`", v.mesh_loc or v.loc,
                                  "e.g. `grid: {sm: num_sms}` for a persistent kernel"))
        if len(cluster) > len(grid):
            out.append(Diagnostic("E431", f"{where}: the cluster has {len(cluster)} axes but the grid {len(grid)}",
                                  cluster[0].loc, "give one cluster axis per leading grid axis"))
    params = {p.name for p in v.params}
    scope = params | set(spec.dims)
    for axis in v.mesh:
        extra = {NUM_SMS} if axis.role == MeshRole.GRID else set()
        out += unknown(axis.size, scope | extra, f"mesh {axis.role} {axis.name}")
    operands = {o.name: o for o in spec.operands}
    for name, space in v.refs.items():
        if name not in operands:
            out.append(Diagnostic("E432", f"{where}: refs names `{name}`, which is not an operand", v.loc,
                                  did_you_mean(name, operands)))
        elif space not in BACKENDS[v.backend].ref_spaces:
            out.append(Diagnostic("E432", f"{where}: ref {name} in {space}: {v.backend} takes "
                                  f"{' or '.join(BACKENDS[v.backend].ref_spaces)}", v.loc))
    for pipe in v.pipelines:
        out += _pipeline_structure(spec, v, pipe, scope, operands, unknown)
    return out


def _pipeline_structure(spec, v, pipe, scope, operands, unknown) -> list:
    out = []
    where = f"{v.backend}: pipeline {pipe.name}"
    if not pipe.grid or not all(a.name for a in pipe.grid):
        out.append(Diagnostic("E432", f"{where}: the grid must map axis names to sizes", pipe.loc, "e.g. `grid: {k: K // bk}`"))
    for axis in pipe.grid:
        out += unknown(axis.size, scope, f"pipeline {pipe.name} grid")
    if pipe.buffers is not None:
        out += unknown(pipe.buffers, scope, f"pipeline {pipe.name} buffers")
    if v.backend == "mosaic_tpu":
        gpu_only = [w for w, present in (("buffers", pipe.buffers is not None), ("warp_specialized", pipe.compute_wgs))
                    if present]
        gpu_only += [f"{b.operand} transforms" for b in pipe.blocks if b.block.tiling or b.block.swizzle]
        gpu_only += [f"{b.operand} delay_release" for b in pipe.blocks if b.block.delay_release]
        gpu_only += [f"{b.operand} collective_axes" for b in pipe.blocks if b.block.collective_axes]
        for what in gpu_only:
            out.append(Diagnostic("E432", f"{where}: {what} is Mosaic GPU only", pipe.loc,
                                  "Mosaic TPU pipelines double-buffer every block"))
    if pipe.compute_wgs and not v.mesh_axes(MeshRole.THREADS):
        out.append(Diagnostic("E432", f"{where}: a warp-specialized pipeline needs `threads` in the mesh", pipe.loc,
                              f"add `threads: {{wg: {pipe.compute_wgs + 1}}}` (the compute warpgroups and one that copies)"))
    clusters = {a.name for a in v.mesh_axes(MeshRole.CLUSTER)}
    for pb in pipe.blocks:
        for axis in pb.block.collective_axes:
            problem = (
                "only inputs are multicast" if pb.role == PipeRole.OUT
                else "only a warp-specialized pipeline multicasts" if not pipe.compute_wgs
                else f"`{axis}` is not a cluster axis of the mesh" if axis not in clusters
                else None
            )
            if problem:
                out.append(Diagnostic("E432", f"{where}: {pb.operand} collective_axes [{axis}]: {problem}", pb.block.loc,
                                      "multicast an input of a warp_specialized pipeline along a `mesh.cluster` axis"))
    for pb in pipe.blocks:
        op = operands.get(pb.operand)
        label = f"{pipe.name}.{pb.role}.{pb.operand}"
        if op is None:
            out.append(Diagnostic("E432", f"{where}: block for unknown operand `{pb.operand}`", pb.block.loc,
                                  did_you_mean(pb.operand, operands)))
            continue
        want = Role.INPUT if pb.role == PipeRole.IN else Role.OUTPUT
        if op.role != want:
            out.append(Diagnostic("E432", f"{where}: {pb.operand} is an {op.role}, listed under `{pb.role}`", pb.block.loc,
                                  "list inputs under `in` and outputs under `out`"))
        rank = len(pb.view) if pb.view is not None else op.rank
        for e in pb.view or ():
            out += unknown(e, scope, f"{label}.view")
        for e in pb.block.block_shape:
            out += unknown(e, scope, f"{label}.block_shape")
        if len(pb.block.block_shape) != rank:
            out.append(Diagnostic("E402", f"{label}: block_shape has {len(pb.block.block_shape)} dims but the view has rank {rank}",
                                  pb.block.shape_loc, "give one entry per dim of the view"))
        imap = pb.block.index_map
        if len(imap.args) != len(pipe.grid):
            names = ", ".join(a.name or "i" for a in pipe.grid)
            out.append(Diagnostic("E403", f"{label}: index_map takes {_count(len(imap.args), 'index', 'indices')} "
                                  f"but pipeline {pipe.name} has {_count(len(pipe.grid), 'axis', 'axes')}",
                                  imap.loc, f"write one name per pipeline axis, e.g. `{names} -> ...`"))
        if len(imap.results) != len(pb.block.block_shape):
            out.append(Diagnostic("E404", f"{label}: index_map returns {_count(len(imap.results), 'block index', 'block indices')} "
                                  f"but the block has {_count(len(pb.block.block_shape), 'dim', 'dims')}",
                                  imap.loc, "return one block index per dim of block_shape"))
        allowed = scope | set(imap.args)
        out += [Diagnostic("E301", f"{label}.index_map: unknown name `{n}`", imap.loc, did_you_mean(n, allowed))
                for n in sorted(imap.names - allowed)]
    return out


def instantiate(spec, v, case, env: dict, size) -> tuple:
    """(mesh sizes, {pipeline: PipeInstance}) for one case; `size(expr, what, env)` evaluates
    a size (reporting through instances.instantiate). None entries where a size did not evaluate."""
    menv = dict(env, **{NUM_SMS: CHECKED_NUM_SMS})
    sizes = {a.name: size(a.size, f"mesh {a.role} {a.name}", menv) for a in v.mesh}
    pipes = {}
    for pipe in v.pipelines:
        grid = tuple(size(a.size, f"pipeline {pipe.name} grid", env) for a in pipe.grid)
        views, blocks = {}, {}
        for pb in pipe.blocks:
            op = spec.operand(pb.operand)
            exprs = pb.view if pb.view is not None else op.shape
            views[pb.operand] = tuple(size(e, f"{pipe.name}.{pb.operand}.view", env) for e in exprs)
            blocks[pb.operand] = tuple(size(e, f"{pipe.name}.{pb.operand}.block_shape", env) for e in pb.block.block_shape)
        buffers = size(pipe.buffers, f"pipeline {pipe.name} buffers", env) if pipe.buffers is not None else 2
        pipes[pipe.name] = PipeInstance(grid, views, blocks, buffers)
    return sizes, pipes


def bounds_and_coverage(inst, grid_points, walk) -> list:
    """E505/E506 on sizes, E502 for pipeline index maps leaving their view, E503 for output
    views the pipeline leaves unwritten; `walk` is instances.walk_block, the pallas_call grid walk."""
    out = []
    case = inst.case
    for pipe in inst.variant.pipelines:
        pi = inst.pipes[pipe.name]
        for axis, n in zip(pipe.grid, pi.grid):
            if n < 1:
                out.append(Diagnostic("E505", f"case `{case.name}`: pipeline {pipe.name} axis {axis.name} has size {n}", axis.size.loc))
        if pi.buffers < 1:
            out.append(Diagnostic("E505", f"case `{case.name}`: pipeline {pipe.name} buffers is {pi.buffers}", pipe.buffers.loc))
        if out:
            continue
        for pb in pipe.blocks:
            block, view, bshape = pb.block, pi.views[pb.operand], pi.blocks[pb.operand]
            if any(b < 1 for b in bshape) or any(n < 1 for n in view):
                out.append(Diagnostic("E506", f"case `{case.name}`: {pipe.name}.{pb.operand} has view {view} and block {bshape}",
                                      block.shape_loc))
                continue
            points, exhaustive = grid_points(pi.grid)
            found, visited, walked = walk(inst.env, case.name, f"{pipe.name}.{pb.operand}", block, view, bshape, points,
                                          [({}, "")], "step", f"the view of {pb.operand}")
            out += found
            reported, exhaustive = bool(found), exhaustive and walked
            if pb.role == PipeRole.OUT and exhaustive and not reported:
                counts = [-(-n // b) for n, b in zip(view, bshape)]
                missing = next((t for t in itertools.product(*(range(c) for c in counts)) if t not in visited), None)
                if missing is not None:
                    out.append(Diagnostic("E503", f"case `{case.name}`: pipeline {pipe.name} never writes block {missing} "
                                          f"of its {pb.operand} view {view}", block.loc,
                                          "make the pipeline grid and index_map reach every block of the view"))
    return out
