"""What each backend needs of a call's dims and params, as code for the generated dispatcher.

The rules in rules.py check a spec's cases before anything runs. A user calls a kernel at
other shapes, so the generated `_dispatch.py` evaluates the same limits per call, before
tracing, and backend="auto" passes over a backend that cannot run the call:

  Triton: every block dim a power of two (unless the block is `masked` or `sliced`: the body
    loads and stores it through masks over a power-of-two range, or in power-of-two slices;
    a dim the body only slices needs its slice sizes to be powers of two instead), and the
    variant's own `shared_memory` estimate, where it declares one, within the GPU's limit per
    block (_runtime.shared_memory_limit: by compute capability);
  Mosaic GPU: a TMA copy moves at most 256 elements along each dim of the (tiled) block, and
    blocks x pipeline depth + shared-memory scratch fit 227 KiB;
  Mosaic TPU: the last two dims of a VMEM block tile by (8 x packing, 128) or are whole (a
    1-D block: the whole dim, a multiple of 1024, or a power of two of at least 128 x packing);
  every backend: the spec's constraints that read params, and the backend's own.

Each requirement is a condition and the reason it gives when it fails, both Python source
over the dims, the params (resolved for the call) and `_itemsize` (operand or scratch name ->
bytes per element). Every piece of a spec in them is a re-printed expression tree or a
literal: nothing of the spec's text is pasted.
"""

from __future__ import annotations

import dataclasses

from kspec.codegen.backends import rules
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.spec.model import KernelSpec, MemorySpace, Role, ScratchKind, SpecKind, Variant


@dataclasses.dataclass(frozen=True)
class Requirement:
    condition: str  # Python source: true when the backend can run the call
    reason: str  # Python source of a str: what fails, with the call's values


def _lit(text: str) -> str:
    return repr(text)


def _block_exprs(spec: KernelSpec, variant: Variant, op) -> tuple | None:
    """(size Expr or None per dim) of the operand's block; None when the body gets the whole
    array unblocked (memory_space without block_shape)."""
    block = variant.blocks.get(op.name)
    if block is None:
        return tuple(op.shape)
    if block.block_shape is None:
        return None
    return tuple(block.block_shape)


def _tuple_src(exprs) -> str:
    parts = [("1" if e is None else e.render()) for e in exprs]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _with_values(c) -> str:
    """The constraint's message (or its re-printed expression), then the values it read."""
    names = sorted(c.expr.names)
    values = f" + ' (' + _runtime.shown({names!r}, ({', '.join(names)}{',' if len(names) == 1 else ''})) + ')'" if names else ""
    return _lit(c.message or f"`{c.expr.shown}` must hold") + values


def constraints(spec: KernelSpec, variant: Variant) -> list:
    """The spec's constraints that read params, then the backend's own."""
    out = []
    dims = set(spec.dims)
    for c in spec.constraints:
        if c.expr.names <= dims:
            continue  # over dims only: the call itself is refused (see dims_constraints)
        out.append(Requirement(f"({c.expr.render()})", _with_values(c)))
    for c in variant.constraints:
        out.append(Requirement(f"({c.expr.render()})", _with_values(c)))
    return out


def dims_constraints(spec: KernelSpec) -> list:
    """(condition, message) of the spec's constraints over dims only."""
    dims = set(spec.dims)
    return [
        Requirement(f"({c.expr.render()})", _lit(c.message or f"`{c.expr.shown}` must hold"))
        for c in spec.constraints if c.expr.names <= dims
    ]


def _triton(spec: KernelSpec, variant: Variant) -> list:
    out = []
    for op in spec.operands:
        block = variant.blocks.get(op.name)
        if block is not None and (block.masked or block.sliced):
            continue
        exprs = _block_exprs(spec, variant, op)
        if exprs is None:
            continue
        dims, slices = _triton_pow2_checks(spec, variant, op, exprs)
        if not dims and not slices:
            continue  # constant blocks: kspec check rules on them (E711)
        cond = " and ".join(f"_runtime.is_pow2({e})" for e in dims + slices)
        shown = ""
        if slices:
            values = f"({', '.join(slices)}{',' if len(slices) == 1 else ''})"
            shown = f" + {_lit(' or its slices (')} + _runtime.shown({slices!r}, {values}) + {_lit(')')}"
        out.append(Requirement(
            cond, f"{_lit(op.name + ' block ')} + str({_tuple_src(exprs)}){shown} + "
                  f"{_lit(' is not all powers of two, which Triton needs')}"))
    smem = shared_memory(variant)
    if smem is not None:
        out.append(smem)
    return out


def shared_memory(variant: Variant) -> Requirement | None:
    """The variant's declared shared-memory estimate held to the GPU's limit per block (None: it
    declares none)."""
    e = variant.shared_memory
    if e is None:
        return None
    total = f"({e.render()})"
    return Requirement(
        f"{total} <= _runtime.shared_memory_limit()",
        f"'shared memory estimate ' + str({total} // 1024) + ' KiB (' + {_lit(e.shown)} + ') exceeds ' + "
        f"str(_runtime.shared_memory_limit() // 1024) + ' KiB per block on this GPU'")


def _triton_pow2_checks(spec: KernelSpec, variant: Variant, op, exprs: tuple) -> tuple:
    """(varying block dims, slice sizes): source of each value that must be a power of two
    for Triton to lower the operand's block. A dim the body takes only static slices of (see
    rules.slice_sizes) needs the params or dims that size those slices to be, not itself."""
    known = {p.name for p in variant.params} | set(spec.dims)
    sliced = rules.slice_sizes(variant.body.source, op.name, exprs)
    dims, slices = [], []
    for d, e in enumerate(exprs):
        sizes = sliced.get(d, ())
        if e is None:
            continue
        if sizes and all(s in known if isinstance(s, str) else rules.is_pow2(s) for s in sizes):
            slices += [s for s in sizes if isinstance(s, str) and s not in slices]
        elif not isinstance(e.constant, int):
            dims.append(e.render())
    return dims, slices


def _itemsize_src(name: str) -> str:
    return f"_itemsize[{name!r}]"


def _mosaic_gpu(spec: KernelSpec, variant: Variant) -> list:
    out = []
    if spec.kind != SpecKind.MESH:
        for op in spec.operands:
            block = variant.blocks.get(op.name)
            exprs = _block_exprs(spec, variant, op)
            if exprs is None:
                continue
            kept = [e for e in exprs if e is not None]
            tiling = block.tiling if block is not None else ()
            lead, tail = kept[: len(kept) - len(tiling)], kept[len(kept) - len(tiling):] if tiling else []
            checks = [e.render() for e in lead] if tiling else [e.render() for e in kept]
            checks += [f"_runtime.cdiv({e.render()}, {t})" for e, t in zip(tail, tiling)]
            varying = [c for c in checks if not c.isdigit()]
            if not varying:
                continue
            cond = " and ".join(f"{c} <= {rules.TMA_MAX_BLOCK_DIM}" for c in varying)
            out.append(Requirement(
                cond, f"{_lit(op.name + ' block ')} + str({_tuple_src(exprs)}) + "
                      f"{_lit(f' is too large for TMA, which copies at most {rules.TMA_MAX_BLOCK_DIM} elements per dim')}"))
        depth = variant.compiler_params.get("max_concurrent_steps", 1)
        depth_src = depth.render() if hasattr(depth, "render") else repr(depth)
        reduction = variant.compiler_params.get("reduction_scratch_bytes", 2048)
        blocks = [
            f"math.prod({_tuple_src(_block_exprs(spec, variant, op))}) * {_itemsize_src(op.name)}"
            for op in spec.operands if _block_exprs(spec, variant, op) is not None
        ]
        total = f"({' + '.join(blocks) or '0'}) * max({depth_src}, 1) + {_scratch_src(variant)} + {reduction!r}"
    else:
        total = _scratch_src(variant)
    if total.strip() == "0":
        return out
    out.append(Requirement(
        f"{total} <= {rules.HOPPER_SMEM_LIMIT}",
        f"'shared memory estimate ' + str(({total}) // 1024) + "
        f"{_lit(f' KiB exceeds {rules.HOPPER_SMEM_LIMIT // 1024} KiB per block on Hopper')}"))
    return out


def _scratch_src(variant: Variant) -> str:
    parts = [
        f"math.prod({_tuple_src(s.shape)}) * {_itemsize_src(s.name)}"
        for s in variant.scratch
        if s.kind == ScratchKind.ARRAY and s.memory_space in (MemorySpace.SMEM, MemorySpace.VMEM)
    ]
    return " + ".join(parts) or "0"


def _mosaic_tpu(spec: KernelSpec, variant: Variant) -> list:
    out = []
    if spec.kind == SpecKind.MESH:
        return out
    for op in spec.operands:
        block = variant.blocks.get(op.name)
        if block is None or block.block_shape is None or block.memory_space in rules.OUTSIDE_VMEM or op.prefetch:
            continue
        n = len(op.shape)
        if n == 1:
            out += _tpu_1d(spec, op, block)
            continue
        conds = []
        for d in range(max(0, n - 2), n):
            b, a = block.block_shape[d], op.shape[d]
            tile = "128" if d == n - 1 else f"(8 * max(1, 4 // {_itemsize_src(op.name)}))"
            b_src = "1" if b is None else b.render()
            if b is not None and a is not None and b.shown == a.shown:
                continue  # the whole dim
            conds.append(f"({b_src} == {a.render()} or {b_src} % {tile} == 0)")
        if conds and not all(c.replace(" ", "").isdigit() for c in conds):
            out.append(Requirement(
                " and ".join(conds),
                f"{_lit(op.name + ' block ')} + str({_tuple_src(block.block_shape)}) + "
                f"{_lit(' does not tile by (8 x packing, 128) on TPU')}"))
    return out


def _dtype_src(spec: KernelSpec, op) -> str:
    """Python source of the operand's dtype in a call: an input's own, or a fixed dtype's name."""
    if op.role == Role.INPUT and op.follows is None and not op.kernel:  # a kernel input's is fixed
        return f"{op.name}.dtype"
    if op.follows is not None:  # a kernel operand's `dtype: x` is the function's input x
        return _dtype_src(spec, next((o for o in spec.facade if o.name == op.follows), None) or spec.operand(op.follows))
    if op.dtype_map is not None:
        return _mapped_src(op.dtype_map)
    return repr(op.dtypes[0])


def _mapped_src(m) -> str:
    """Python source of the dtype name a dtype map gives for its input's dtype in the call
    (without the call's out_dtype, which the dispatcher does not see)."""
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in m.table) + "}" + f"[jnp.dtype({m.source}.dtype).name]"


def _tpu_1d(spec: KernelSpec, op, block) -> list:
    """A rank-1 block: jax 0.10.2's rule (rules.tpu_1d_block_ok): the whole dim, a multiple of
    1024, or a power of two of at least 128 x packing."""
    b, a = block.block_shape[0], op.shape[0]
    if b is not None and a is not None and b.shown == a.shown:
        return []  # the whole dim
    b_src = "1" if b is None else b.render()
    least = f"{rules.TPU_LANES} * _runtime.tpu_packing({_dtype_src(spec, op)})"
    return [Requirement(
        f"({b_src} == {a.render()} or {b_src} % {rules.TPU_1D_CHUNK} == 0 or "
        f"({b_src} >= {least} and _runtime.is_pow2({b_src})))",
        f"{_lit(op.name + ' block ')} + str({_tuple_src(block.block_shape)}) + "
        f"{_lit(' is not the whole dim, a multiple of 1024 or a power of two of at least 128 x packing, as Mosaic TPU needs of a 1-D block')}")]


_BY_BACKEND = {"triton": _triton, "mosaic_gpu": _mosaic_gpu, "mosaic_tpu": _mosaic_tpu}


def requirements(spec: KernelSpec, variant: Variant) -> list:
    """Every requirement the backend has of a call, constraints first."""
    rule = _BY_BACKEND.get(variant.backend)
    return constraints(spec, variant) + (rule(spec, variant) if rule else [])


def itemsizes(spec: KernelSpec, variant: Variant) -> list:
    """(name, Python source of its itemsize) for every operand and array scratch, the inputs
    read from the call's arrays."""
    out = []
    by_name = {o.name: o for o in spec.operands + spec.facade}  # a kernel operand's `dtype: x` is the input x

    def of(o) -> str:
        if o.role == Role.INPUT and o.follows is None and not o.kernel:
            if o.optional:  # a call may leave it out (None): its first declared dtype then
                return f"(jnp.dtype({o.name}.dtype).itemsize if {o.name} is not None else {dt.itemsize(o.dtypes[0])!r})"
            return f"jnp.dtype({o.name}.dtype).itemsize"
        if o.follows is not None:
            return of(by_name[o.follows])
        if o.dtype_map is not None:
            return f"jnp.dtype({_mapped_src(o.dtype_map)}).itemsize"
        return repr(dt.itemsize(o.dtypes[0]))

    for o in spec.operands:
        out.append((o.name, of(o)))
    for s in variant.scratch:
        if s.kind == ScratchKind.ARRAY and s.dtype_map is not None:
            out.append((s.name, f"jnp.dtype({_mapped_src(s.dtype_map)}).itemsize"))
        elif s.kind == ScratchKind.ARRAY and s.dtype is not None:
            out.append((s.name, of(by_name[s.dtype]) if s.dtype in by_name else repr(dt.itemsize(s.dtype))))
    return out
