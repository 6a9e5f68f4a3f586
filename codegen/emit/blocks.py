"""The pieces of a pallas_call a spec's blocks, scratch and options become: BlockSpecs,
scratch shapes, compiler params, aliases, the cost estimate, and the padding to whole blocks
that Pallas Triton needs."""

from __future__ import annotations

from kspec.codegen.backends import BACKENDS
from kspec.codegen.emit.source import block_dim, dtype_src, gpu_layout, jnp_dtype, lambda_src, literal, mapped_dtype, pipelined, tuple_src
from kspec.codegen.spec.expr import Expr
from kspec.codegen.spec.model import DimKind, KernelSpec, MemorySpace, Role, ScratchKind, SpecKind, Variant


def block_spec(spec: KernelSpec, variant: Variant, op, pipeline: tuple | None = None) -> str:
    """The operand's BlockSpec; with `pipeline` (grid names, sequential axes), as
    plgpu.emit_pipeline takes it: its index map gets the sequential indices only."""
    block = variant.blocks.get(op.name)
    if pipeline is not None:
        names, sequential = pipeline
        grid_args = [names[n] for n in sequential]
    else:
        grid_args = [f"_{i}" for i in range(len(variant.grid))] + [f"_{o.name}" for o in spec.prefetched]
    if block is None:
        zeros = tuple_src("0" for _ in op.shape)
        return f"pl.BlockSpec({tuple_src(e.render() for e in op.shape)}, {lambda_src(grid_args, zeros)})"
    spaces = BACKENDS[variant.backend].memory_spaces
    extra = [f"pipeline_mode=pl.Buffered({block.buffers})"] if block.buffers else []
    extra += [f"memory_space={spaces[block.memory_space]}"] if block.memory_space else []
    if block.block_shape is None:  # the whole array, in its memory space
        return f"pl.BlockSpec({', '.join(extra)})"
    shape = tuple_src(block_dim(block, d) for d in range(len(block.block_shape)))
    index_map = block.index_map.render() if pipeline is None else pipelined(block.index_map, *pipeline)
    layout = [kw for kw in [gpu_layout(block)] if kw] + extra
    if variant.backend == "mosaic_gpu" and layout:
        return f"plgpu.BlockSpec({shape}, {index_map}, {', '.join(layout)})"
    return f"pl.BlockSpec({', '.join([shape, index_map] + extra)})"


def scratch_shape(spec: KernelSpec, variant: Variant, s) -> str:
    """One scratch entry as the backend's scratch_shapes take it."""
    shape = tuple_src(e.render() for e in s.shape)
    if s.kind == ScratchKind.DMA_SEMAPHORE:
        return f"pltpu.SemaphoreType.DMA({shape})"
    if s.kind == ScratchKind.SEMAPHORE:
        return f"pltpu.SemaphoreType.REGULAR({shape})"
    if s.kind == ScratchKind.BARRIER:
        count = s.shape[0].render() if s.shape else "1"
        if s.collective_axes:
            axes = tuple_src(repr(a) for a in s.collective_axes)
            return f"plgpu.ClusterBarrier(collective_axes={axes}, num_arrivals={s.num_arrivals}, num_barriers={count})"
        return f"plgpu.Barrier(num_arrivals={s.num_arrivals}, num_barriers={count})"
    if s.kind == ScratchKind.ACCUMULATOR:
        return f"plgpu.ACC({shape}, {_scratch_dtype(spec, s) if s.dtype else 'jnp.float32'})"
    if variant.backend == "mosaic_gpu":
        layout = gpu_layout(s)
        return f"plgpu.SMEM({shape}, {_scratch_dtype(spec, s)}{', ' + layout if layout else ''})"
    space = "SMEM" if s.memory_space == MemorySpace.SMEM else "VMEM"
    return f"pltpu.{space}({shape}, {_scratch_dtype(spec, s)})"


def _scratch_dtype(spec: KernelSpec, s) -> str:
    """A dtype name, or an input's name: that input's dtype at call time (`x.dtype`)."""
    if s.dtype_map is not None:
        return mapped_dtype(s.dtype_map)
    inputs = {o.name for o in spec.inputs + spec.facade}  # facade: the function's, in scope too
    return f"{s.dtype}.dtype" if s.dtype in inputs else jnp_dtype(s.dtype)


def compiler_params(backend: str, params: dict) -> str | None:
    """The backend's CompilerParams(...) call with `params`; None for a backend without one."""
    cls = BACKENDS[backend].compiler_params_class
    if cls is None or not params:
        return f"{cls}()" if cls else None
    args = []
    for key, value in params.items():
        if key == "lowering_semantics":
            value_src = f"plgpu.LoweringSemantics.{value.capitalize()}"
        elif isinstance(value, Expr):
            value_src = value.render()
        elif isinstance(value, list):
            value_src = tuple_src(literal(v) for v in value)
        else:
            value_src = literal(value)
        args.append(f"{key}={value_src}")
    return f"{cls}({', '.join(args)})"


def aliases(spec: KernelSpec) -> str | None:
    """pallas_call's input_output_aliases: {input position in the call: output position}."""
    if not spec.aliases:
        return None
    ins = [o.name for o in spec.call_order]
    outs = [o.name for o in spec.outputs]
    pairs = sorted((ins.index(i), outs.index(o)) for o, i in spec.aliases.items())
    return "{" + ", ".join(f"{i}: {o}" for i, o in pairs) + "}"


def cost(spec: KernelSpec) -> str | None:
    """pl.CostEstimate(...) of the spec's cost_estimate; None without one."""
    cost = spec.cost
    if cost is None:
        return None
    if cost.bytes_accessed is not None:
        nbytes = cost.bytes_accessed.render()
    else:
        terms = [f"{o.name}.size * {o.name}.dtype.itemsize" for o in spec.inputs]
        terms += [
            f"math.prod({tuple_src(e.render() for e in o.shape)}) * jnp.dtype({dtype_src(spec, o)}).itemsize"
            for o in spec.outputs
        ]
        nbytes = " + ".join(terms)
    flops = cost.flops.render() if cost.flops is not None else "0"
    trans = cost.transcendentals.render() if cost.transcendentals is not None else "0"
    return f"pl.CostEstimate(flops={flops}, transcendentals={trans}, bytes_accessed={nbytes})"


def whole_blocks(spec: KernelSpec, variant: Variant) -> tuple:
    """Pallas Triton neither masks nor clips a ragged last block: the program reads and
    writes past the array (into whatever lies next in device memory). So on triton every
    blocked dim is padded to whole blocks: ([(input, blocks tuple)], {output: padded shape},
    the outputs' true shapes to crop to, or None when no output is blocked)."""
    if not BACKENDS[variant.backend].pads_ragged_blocks:
        return [], {}, None
    inputs, outputs = [], {}
    for op in spec.operands:
        block = variant.blocks.get(op.name)
        if block is None or block.block_shape is None:
            continue
        sizes = [e.render() if block.kind(d) == DimKind.BLOCKED and e.source != op.shape[d].source else None
                 for d, e in enumerate(block.block_shape)]
        if not any(sizes):
            continue
        if op.role == Role.INPUT:
            inputs.append((op.name, tuple_src(b or "None" for b in sizes)))
        else:
            outputs[op.name] = tuple_src(
                f"_signature.whole({e.render()}, {b})" if b else e.render() for e, b in zip(op.shape, sizes)
            )
    if not outputs:
        return inputs, outputs, None
    shapes = [tuple_src(e.render() for e in o.shape) for o in spec.outputs]
    return inputs, outputs, shapes[0] if len(shapes) == 1 else tuple_src(shapes)


def unwritten(spec: KernelSpec, variant: Variant) -> list:
    """[(output position, source of its _runtime.Unwritten)]: the residual outputs of a pallas_call
    (the spec's own, or its kernel's `kernel.outputs` marked residual) that the call writes only
    with residuals=True. Without it they are left out of the call and the body's ref for each
    takes its stores and drops them. A mesh kernel leaves out those whose ref its body compares
    with None (`lse_ref is not None`): the body gets None for each, and skips its copies. Other
    Mosaic GPU kernels, other mesh kernels' outputs, and calls that alias outputs to inputs
    (whose positions would shift), write every output."""
    if spec.aliases:
        return []
    if spec.kind == SpecKind.MESH:
        return [(n, "None") for n, o in enumerate(spec.outputs) if variant.leaves_out(o)]
    if variant.backend == "mosaic_gpu":
        return []
    out = []
    for n, o in enumerate(spec.outputs):
        if not o.residual:
            continue
        block = variant.blocks.get(o.name)
        dims = o.shape if block is None or block.block_shape is None else \
            [e for e in block.block_shape if e is not None]
        out.append((n, f'_runtime.Unwritten("{spec.name}", "{o.name}", {dtype_src(spec, o)}, '
                       f'{tuple_src(e.render() for e in dims)})'))
    return out


def keep(spec: KernelSpec) -> str | None:
    """What a backend function returns of its kernel's outputs `out`, for a spec with residual
    outputs: all of them with residuals=True, else the others; None without residual outputs."""
    outputs = spec.outputs
    kept = [n for n, o in enumerate(outputs) if not o.residual]
    if len(kept) == len(outputs):
        return None
    returned = f"out[{kept[0]}]" if len(kept) == 1 else tuple_src(f"out[{n}]" for n in kept)
    return f"out if residuals else {returned}"
