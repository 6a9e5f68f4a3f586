"""Backend hardware rules, checked per case on evaluated instances before anything is traced.

Each rule names the operand and the rule, and suggests a fix. The numbers are the
documented limits of each compiler:
  Mosaic TPU: (8 x packing, 128) tiling of the last two block dims; `parallel` grid
    axes may not revisit an output block; blocks x buffering + scratch fit scoped VMEM.
  Triton: block dims are powers of two (or the body takes only power-of-two slices of
    them); dot operands have every dim >= 16.
  Mosaic GPU: blocks x pipeline depth + SMEM scratch fit shared memory (227 KiB on Hopper);
    a TMA copy moves at most 256 elements along each dim of the (tiled) block.
"""

from __future__ import annotations

import ast
import itertools
import math

from kspec.codegen.spec import dtypes as dt
from kspec.codegen.diagnostics import Diagnostic
from kspec.codegen.spec.expr import ITEMSIZES, ExprError, NotEvaluable
from kspec.codegen.spec.model import DimKind, MemorySpace, MeshRole, ScratchKind, SpecKind
from kspec.templates import runtime as _runtime

# Mosaic TPU blocks in these memory spaces are not pipelined through VMEM: no tiling rule, no VMEM copies
OUTSIDE_VMEM = (MemorySpace.ANY, MemorySpace.HBM, MemorySpace.SMEM)
TPU_DEFAULT_VMEM_LIMIT = 16 * 1024 * 1024  # Mosaic's default scoped VMEM limit (v4/v5e)
TPU_BUFFERS = 2  # BlockSpec inputs and outputs are double-buffered unless pipeline_mode says otherwise
TPU_LOWERED_BUFFERS = (1, 2)  # what Mosaic TPU's pallas_call pipeline lowers (jax 0.10.2)
HOPPER_SMEM_LIMIT = _runtime.SHARED_MEMORY_PER_BLOCK["9.0"]  # what the generated dispatchers hold Hopper to
TMA_MAX_BLOCK_DIM = 256
TRITON_MIN_DOT = 16
DOT_FUNCTIONS = {"dot", "matmul", "dot_general"}
NUM_SMS = "num_sms"  # in a Mosaic GPU mesh grid: the device's SM count
CHECKED_NUM_SMS = 132  # H100 SXM and H200: what the checks assume for num_sms
WARPGROUP = 128  # CUDA threads per Mosaic GPU thread (a warpgroup)
MAX_CTA_THREADS = 1024  # CUDA threads per CTA
MAX_CLUSTER = 8  # CTAs per cluster that every Hopper launch accepts (portable size)


def check(inst) -> list:
    if inst.spec.kind == SpecKind.MESH:
        return _mesh(inst)
    rules = {"mosaic_tpu": _mosaic_tpu, "triton": _triton, "mosaic_gpu": _mosaic_gpu}
    rule = rules.get(inst.variant.backend)
    return rule(inst) if rule else []


def compiler_param(inst, key: str, default=None):
    """A compiler param's value for this instance (expressions evaluated over its params)."""
    value = inst.variant.compiler_params.get(key, default)
    return value.eval(inst.env) if hasattr(value, "eval") else value


def where(inst) -> str:
    return f"case `{inst.case.name}` ({inst.variant.backend})"


def _loc(inst, name: str):
    block = inst.variant.blocks.get(name)
    return block.loc if block is not None else inst.spec.operand(name).loc


def _semantics_length(inst, key: str, want: int, one: str, many: str) -> list:
    values = inst.variant.compiler_params.get(key)
    if values is None or len(values) == want:
        return []
    return [
        Diagnostic(
            "E704",
            f"{inst.variant.backend}: {key} has {len(values)} entries but the kernel has {want} "
            f"{one if want == 1 else many}",
            inst.variant.loc,
            f"give one entry per {one}",
        )
    ]


# -- Mosaic TPU -------------------------------------------------------------------


def tpu_sublane_tile(dtype: str) -> int:
    """Second-minor tile: 8 rows of 32-bit words, times the packing of narrower types."""
    return 8 * max(1, 4 // dt.itemsize(dtype))


TPU_LANES, TPU_SUBLANES = 128, 8  # a vreg's lanes and sublanes, the same on every TPU generation
TPU_1D_CHUNK = TPU_SUBLANES * TPU_LANES  # 1024


def tpu_packing(dtype: str) -> int:
    """Elements per 32-bit word as Mosaic TPU stores them, 32 // bits as jax 0.10.2 computes it
    (bool is stored as int32; 0 for 64-bit types)."""
    bits = 32 if dtype == "bool" else 4 if dtype == "int4" else 8 * dt.itemsize(dtype)
    return 32 // bits


def tpu_1d_block_ok(block: int, dim: int, dtype: str) -> bool:
    """jax 0.10.2's rule for a rank-1 VMEM block (jax/_src/pallas/mosaic/lowering.py): the whole
    array dim, a multiple of 8 x 128 = 1024, or a power of two of at least 128 x packing."""
    return block == dim or block % TPU_1D_CHUNK == 0 or (
        block >= TPU_LANES * tpu_packing(dtype) and block & (block - 1) == 0
    )


def _tpu_1d_near(block: int, dtype: str) -> list:
    """The rank-1 block sizes the rule takes nearest to `block`: the largest below (if any), the
    smallest above."""
    least = max(1, TPU_LANES * tpu_packing(dtype))
    pow2_up = max(least, 1 << (block - 1).bit_length())
    above = min(pow2_up, -(-block // TPU_1D_CHUNK) * TPU_1D_CHUNK)
    below = [b for b in (1 << (block.bit_length() - 1), block // TPU_1D_CHUNK * TPU_1D_CHUNK) if least <= b < block]
    return ([max(below)] if below else []) + [above]


def _mosaic_tpu(inst) -> list:
    out = _semantics_length(inst, "dimension_semantics", len(inst.grid), "grid axis", "grid axes")
    out += _semantics_length(inst, "allow_input_fusion", len(inst.spec.inputs), "input", "inputs")
    for op in inst.spec.operands:
        spec = inst.variant.blocks.get(op.name)
        if spec is None or spec.block_shape is None or spec.memory_space in OUTSIDE_VMEM:
            continue  # a whole array, or one outside VMEM, always satisfies the tiling rule
        out += tpu_tiling(where(inst), op.name, inst.shapes[op.name], inst.block_shapes[op.name], inst.dtypes[op.name],
                          _loc(inst, op.name))
    out += _tpu_parallel_revisits(inst)
    out += _tpu_vmem(inst)
    return out + _tpu_block_specs(inst)


def tpu_tiling(where: str, name: str, shape: tuple, block: tuple, dtype: str, loc) -> list:
    """E701 for one block of `shape`: its last two dims tile by (8 x packing, 128) or are whole;
    a rank-1 block follows jax's own rule for them (tpu_1d_block_ok)."""
    if len(shape) == 1:
        return _tpu_tiling_1d(where, name, shape[0], block[0], dtype, loc)
    out = []
    tiles = [tpu_sublane_tile(dtype), 128][-min(2, len(shape)) :]
    for d, tile in zip(range(len(shape) - len(tiles), len(shape)), tiles):
        b = 1 if block[d] is None else block[d]  # a squeezed dim is a block of 1 to Mosaic
        if b == shape[d] or b % tile == 0:
            continue
        which = "last" if d == len(shape) - 1 else "second-to-last"
        shown = "squeezed (1)" if block[d] is None else b
        out.append(
            Diagnostic(
                "E701",
                f"{where}: {name} block dim {d} is {shown}; on TPU the {which} block dim must be "
                f"divisible by {tile} for {dtype} or equal the array dim ({shape[d]})",
                loc,
                f"use a multiple of {tile} (e.g. {max(tile, b // tile * tile)}) or the full dim"
                + ("; squeeze a leading dim instead" if block[d] is None else ""),
            )
        )
    return out


def _tpu_tiling_1d(where: str, name: str, dim: int, block, dtype: str, loc) -> list:
    b = 1 if block is None else block  # a squeezed dim is a block of 1 to Mosaic
    if tpu_1d_block_ok(b, dim, dtype):
        return []
    shown = "squeezed (1)" if block is None else b
    least = TPU_LANES * tpu_packing(dtype)
    pow2 = f"a power of two of at least {least} for {dtype}" if least > 1 else f"a power of two for {dtype}"
    return [
        Diagnostic(
            "E701",
            f"{where}: {name} block dim 0 is {shown}; on TPU a 1-D block must be the whole array dim ({dim}), "
            f"a multiple of {TPU_1D_CHUNK}, or {pow2}",
            loc,
            f"use {' or '.join(map(str, _tpu_1d_near(b, dtype)))}, or the full dim "
            "(jax 0.10.2's Mosaic TPU rule for 1-D blocks)",
        )
    ]


def _tpu_block_specs(inst) -> list:
    """E705: block specs Mosaic TPU does not lower: mixed Element and other dims, more than 2 buffers."""
    out = []
    for name, block in inst.variant.blocks.items():
        if block.block_shape is not None:
            kinds = {block.kind(d) for d in range(len(block.block_shape))}
            if DimKind.ELEMENT in kinds and kinds != {DimKind.ELEMENT}:
                out.append(
                    Diagnostic(
                        "E705",
                        f"{where(inst)}: {name} mixes element dims with {', '.join(sorted(kinds - {'element'}))} dims; "
                        "Mosaic TPU takes all element dims or none",
                        block.shape_loc,
                        "write the other dims as {element: <size>} too (the index map then gives their element offsets)",
                    )
                )
        if block.buffers is not None and block.buffers not in TPU_LOWERED_BUFFERS:
            out.append(
                Diagnostic(
                    "E705",
                    f"{where(inst)}: {name} asks for {block.buffers} buffers; Mosaic TPU lowers 1 or 2",
                    block.loc,
                    "use pipeline_mode: {buffered: 1} or {buffered: 2}",
                )
            )
    return out


def _tpu_parallel_revisits(inst) -> list:
    semantics = inst.variant.compiler_params.get("dimension_semantics") or []
    parallel = [a for a, s in enumerate(semantics) if s in ("parallel", "core_parallel") and a < len(inst.grid)]
    out = []
    for op in inst.spec.outputs:
        block = inst.variant.blocks.get(op.name)
        for axis in parallel:
            if inst.grid[axis] < 2:
                continue
            point = _revisit(inst, block, axis)
            if point is None:
                continue
            label = inst.variant.grid[axis].name or f"axis {axis}"
            out.append(
                Diagnostic(
                    "E702",
                    f"{where(inst)}: output {op.name} is written by several steps of parallel grid "
                    f"{label} (grid points {point[0]} and {point[1]} write the same block)",
                    _loc(inst, op.name),
                    f"mark grid {label} `arbitrary` in dimension_semantics, or index {op.name}'s blocks by it",
                )
            )
    return out


def _revisit(inst, block, axis: int):
    """Two grid points differing only along `axis` that map to the same output block."""
    if block is not None and block.index_map is None and block.memory_space in (MemorySpace.ANY, MemorySpace.HBM):
        return None  # the body writes it with its own copies
    if block is None or block.index_map is None:
        a = [0] * len(inst.grid)
        b = list(a)
        b[axis] = 1
        return tuple(a), tuple(b)
    others = [range(n) if i != axis else [0] for i, n in enumerate(inst.grid)]
    for base in itertools.islice(itertools.product(*others), 256):
        seen = {}
        for k in range(min(inst.grid[axis], 64)):
            point = list(base)
            point[axis] = k
            env = dict(inst.env, **dict(zip(block.index_map.args, point)))
            try:
                idx = block.index_map.eval(env)
            except Exception:  # noqa: BLE001 - unevaluable maps (prefetch) cannot be judged here
                return None
            if idx in seen:
                return seen[idx], tuple(point)
            seen[idx] = tuple(point)
    return None


def _block_bytes(inst, name: str) -> int:
    block = inst.block_shapes[name]
    return math.prod(1 if b is None else b for b in block) * dt.itemsize(inst.dtypes[name])


def scratch_bytes(inst, spaces: tuple) -> int:
    total = 0
    for s in inst.variant.scratch:
        if s.kind == ScratchKind.ARRAY and s.memory_space in spaces:
            total += math.prod(inst.scratch_shapes[s.name]) * dt.itemsize(s.dtype_in(inst.dtypes))
    return total


def _bytes(n: int) -> str:
    """1536 -> "1.5 KiB": small budgets must not print as 0.0 MiB."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def tpu_buffers(inst, op) -> int:
    """How many VMEM copies of the operand's block the pipeline keeps (0: not in VMEM)."""
    block = inst.variant.blocks.get(op.name)
    if op.prefetch or (block is not None and block.memory_space in OUTSIDE_VMEM):
        return 0
    if block is not None and block.block_shape is None:
        return 1  # a whole array in VMEM is copied in once
    return block.buffers if block is not None and block.buffers else TPU_BUFFERS


def _tpu_vmem(inst) -> list:
    limit = compiler_param(inst, "vmem_limit_bytes") or TPU_DEFAULT_VMEM_LIMIT
    counts = {o.name: tpu_buffers(inst, o) for o in inst.spec.operands}
    blocks = sum(_block_bytes(inst, name) * n for name, n in counts.items())
    total = blocks + scratch_bytes(inst, (MemorySpace.VMEM,))
    if total <= limit:
        return []
    used = {n for n in counts.values() if n}
    buffers = f"{used.pop()} buffers" if len(used) == 1 else "their buffer counts"
    return [
        Diagnostic(
            "E703",
            f"{where(inst)}: VMEM estimate {_bytes(total)} (blocks x {buffers} "
            f"{_bytes(blocks)} + scratch) exceeds the limit of {_bytes(limit)}",
            inst.variant.loc,
            "use smaller blocks, or raise compiler_params.vmem_limit_bytes",
        )
    ]


# -- Triton -------------------------------------------------------------------------


TRITON_WARPS = (1, 2, 4, 8, 16, 32)


def _triton(inst) -> list:
    out = []
    warps = compiler_param(inst, "num_warps")
    if warps is not None and warps not in TRITON_WARPS:
        out.append(
            Diagnostic(
                "E713",
                f"{where(inst)}: num_warps is {warps}; Triton runs 1, 2, 4, 8, 16 or 32 warps per program",
                inst.variant.loc,
                "give num_warps (or the param it names) a power of two up to 32",
            )
        )
    for op in inst.spec.operands:
        block = inst.variant.blocks.get(op.name)
        if block is not None and (block.block_shape is None or block.masked or block.sliced):
            continue  # memory_space any (the body indexes the array), or loaded only through masks or slices
        sliced = pow2_sliced_dims(inst.variant.body.source, op.name, inst.block_shapes[op.name], inst.env)
        for d, b in enumerate(inst.block_shapes[op.name]):
            if b is not None and b & (b - 1) and d not in sliced:
                out.append(
                    Diagnostic(
                        "E711",
                        f"{where(inst)}: {op.name} block dim {d} is {b}; Triton block dims must be powers of two",
                        _loc(inst, op.name),
                        f"use {1 << (b - 1).bit_length()} (padding covers the ragged edge) or {1 << (b.bit_length() - 1)}",
                    )
                )
    for name in sorted(dot_operands(inst.variant.body.source)):
        block = inst.block_shapes.get(name.removesuffix("_ref"))
        if block is None:
            continue
        small = [b for b in block if b is not None and b < TRITON_MIN_DOT]
        if small:
            op = name.removesuffix("_ref")
            out.append(
                Diagnostic(
                    "E712",
                    f"{where(inst)}: {op} is a dot operand with block {tuple(block)}; "
                    f"Triton dots need every dim >= {TRITON_MIN_DOT}",
                    _loc(inst, op),
                    f"make each block dim of {op} at least {TRITON_MIN_DOT}",
                )
            )
    out += _declared_smem(inst)
    return out


def itemsizes(inst) -> dict:
    """Bytes per element of each operand and array scratch buffer of the instance."""
    sizes = {name: dt.itemsize(d) for name, d in inst.dtypes.items()}
    for s in inst.variant.scratch:
        d = s.dtype_in(inst.dtypes) if s.kind == ScratchKind.ARRAY else None
        if d in dt.DTYPES:
            sizes[s.name] = dt.itemsize(d)
    return sizes


def declared_smem(inst):
    """The variant's own estimate of a program's shared memory (`shared_memory`) for the
    instance, in bytes (None where it has none); raises ExprError where it cannot be evaluated
    for this case, NotEvaluable where only a call knows a value it reads."""
    e = inst.variant.shared_memory
    return None if e is None else e.eval({**inst.env, ITEMSIZES: itemsizes(inst)})


def _declared_smem(inst) -> list:
    """E714: the shared memory the backend's `shared_memory` estimates for a program is past what one
    block may use on Hopper (E303: the estimate is not an integer for the case)."""
    e = inst.variant.shared_memory
    try:
        total = declared_smem(inst)
    except NotEvaluable:
        return []
    except ExprError as err:
        return [Diagnostic(err.code, f"{where(inst)}: shared_memory: {err.message}", e.loc)]
    if total is None:
        return []
    if isinstance(total, bool) or not isinstance(total, int):
        return [Diagnostic("E303", f"{where(inst)}: shared_memory: `{e.shown}` is {total!r}, not an integer", e.loc)]
    if total <= HOPPER_SMEM_LIMIT:
        return []
    return [Diagnostic(
        "E714",
        f"{where(inst)}: shared memory estimate {total // 1024} KiB (`{e.shown}`) "
        f"exceeds {HOPPER_SMEM_LIMIT // 1024} KiB per block on Hopper",
        e.loc,
        "use smaller blocks or fewer pipelining stages for this case")]


def slice_sizes(source: str, operand: str, block: tuple) -> dict:
    """{dim: [size, ...]}: the dims of the operand's block that every access of `<operand>_ref`
    in the body takes a static slice of, `x_ref[pl.ds(start, size)]` (or `.at[...]`, any start)
    or `x_ref[a:b]` with constant bounds, with each slice's size (an int, or the name of a param
    or dim the body receives). A dim read whole anywhere, or a ref used any other way than
    these and its .dtype, .shape and .ndim (passed on, read whole), is left out. `block` is the block shape, None for a squeezed dim (not in
    the kernel's view)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    ref = f"{operand}_ref"
    view = [d for d, b in enumerate(block) if b is not None]
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    assigned |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                 for a in n.posonlyargs + n.args + n.kwonlyargs}
    indexed = set()  # ids of the Name nodes that an access indexes
    sizes = {d: [] for d in view}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript):
            continue
        base = node.value
        if isinstance(base, ast.Attribute) and base.attr == "at":
            base = base.value
        if not (isinstance(base, ast.Name) and base.id == ref):
            continue
        indexed.add(id(base))
        parts = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        ellipses = [i for i, p in enumerate(parts) if isinstance(p, ast.Constant) and p.value is Ellipsis]
        if len(ellipses) > 1:
            return {}
        if ellipses:
            e = ellipses[0]
            parts = parts[:e] + [None] * (len(view) - len(parts) + 1) + parts[e + 1:]
        parts += [None] * (len(view) - len(parts))
        for d, part in zip(view, parts):
            size = _static_slice_size(part, assigned)
            if size is None:
                sizes.pop(d, None)
            elif d in sizes:
                sizes[d].append(size)
    for node in ast.walk(tree):  # x_ref.dtype, .shape, .ndim read no data
        if isinstance(node, ast.Attribute) and node.attr in ("dtype", "shape", "ndim") and isinstance(node.value, ast.Name):
            indexed.add(id(node.value))
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == ref]
    if not indexed or any(id(n) not in indexed for n in uses):
        return {}  # never accessed, or the ref itself goes elsewhere
    return sizes


def _static_slice_size(part, assigned: set):
    """The size of a static slice index (`pl.ds(start, size)`, `a:b`), else None."""
    if isinstance(part, ast.Slice):
        lo, hi = part.lower, part.upper
        if part.step is None and all(isinstance(b, ast.Constant) and type(b.value) is int for b in (lo, hi)):
            return hi.value - lo.value
        return None
    if not isinstance(part, ast.Call):
        return None
    fn = part.func
    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
    if name not in ("ds", "dslice") or isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") != "pl":
        return None
    size = part.args[1] if len(part.args) == 2 else next((k.value for k in part.keywords if k.arg == "size"), None)
    if isinstance(size, ast.Constant) and type(size.value) is int:
        return size.value
    if isinstance(size, ast.Name) and size.id not in assigned:
        return size.id
    return None


def pow2_sliced_dims(source: str, operand: str, block: tuple, env: dict) -> set:
    """The block dims the body only takes power-of-two static slices of (see slice_sizes),
    its sizes evaluated over the case's params and dims: Triton lowers those whatever the
    block dim is."""
    out = set()
    for d, sizes in slice_sizes(source, operand, block).items():
        values = [env.get(s) if isinstance(s, str) else s for s in sizes]
        if values and all(is_pow2(v) for v in values):
            out.add(d)
    return out


def is_pow2(n) -> bool:
    return type(n) is int and n > 0 and not n & (n - 1)


def dot_operands(source: str) -> set:
    """Ref names whose whole block feeds a dot in the body (`x_ref[...]` or via one variable)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    loads = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            ref = _whole_load(node.value)
            if ref:
                loads[node.targets[0].id] = ref
    found = set()
    for node in ast.walk(tree):
        args = []
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in DOT_FUNCTIONS:
                args = node.args[:2]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            args = [node.left, node.right]
        for a in args:
            ref = _whole_load(a) or (loads.get(a.id) if isinstance(a, ast.Name) else None)
            if ref:
                found.add(ref)
    return found


def _whole_load(node):
    """`x_ref[...]` or `x_ref[:]` or `x_ref[:, :]`, possibly `.astype(...)`'d: the ref's name."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "astype":
        node = node.func.value
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
        return None
    s = node.slice
    parts = s.elts if isinstance(s, ast.Tuple) else [s]
    whole = all(
        (isinstance(p, ast.Constant) and p.value is Ellipsis)
        or (isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
        for p in parts
    )
    return node.value.id if whole and node.value.id.endswith("_ref") else None


# -- Mosaic GPU -----------------------------------------------------------------------


def stores_in_flight(v) -> list:
    """E725 where a variant's Mosaic GPU body ends by letting TMA stores from shared memory stay pending: its last statement
    (or the last of a function it defines last, a `pl.when` or `pl.run_scoped` block, and so on inward) is
    `plgpu.wait_smem_to_gmem(n)` with a constant n > 0. A CTA that exits with a bulk copy still reading its shared
    memory hands that memory to the next CTA mid-copy; the wait at the end must be for all of them (0). A property
    of the body alone: checked once per variant, not per case."""
    if v.backend != "mosaic_gpu":
        return []
    code = v.body
    try:
        tree = ast.parse(code.source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []  # E600 reports it
    last = tree.body[-1] if tree.body else None
    while isinstance(last, (ast.FunctionDef, ast.AsyncFunctionDef)) and last.body:
        last = last.body[-1]
    call = last.value if isinstance(last, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "wait_smem_to_gmem"
            and call.args and isinstance(call.args[0], ast.Constant) and type(call.args[0].value) is int
            and call.args[0].value > 0):
        return []
    n = call.args[0].value
    return [Diagnostic("E725", f"mosaic_gpu: the body ends with `{ast.get_source_segment(code.source, call) or 'wait_smem_to_gmem'}`: "
                       f"up to {n} TMA store{'s' if n != 1 else ''} from shared memory may still be in flight when the kernel exits",
                       code.loc_of(call.args[0].lineno, call.args[0].col_offset),
                       "wait for every store before the end: plgpu.wait_smem_to_gmem(0)")]


def _mosaic_gpu(inst) -> list:
    out = _semantics_length(inst, "dimension_semantics", len(inst.grid), "grid axis", "grid axes")
    params = inst.variant.compiler_params
    depth = compiler_param(inst, "max_concurrent_steps", 1)
    blocked = [o.name for o in inst.spec.operands]
    blocks = sum(_block_bytes(inst, n) for n in blocked) * max(depth, 1)
    total = (blocks + scratch_bytes(inst, (MemorySpace.SMEM, MemorySpace.VMEM))
             + params.get("reduction_scratch_bytes", 2048))
    if total > HOPPER_SMEM_LIMIT:
        out.append(
            Diagnostic(
                "E721",
                f"{where(inst)}: shared memory estimate {total // 1024} KiB (blocks x {depth} steps "
                f"{blocks // 1024} KiB + scratch) exceeds {HOPPER_SMEM_LIMIT // 1024} KiB per block on Hopper",
                inst.variant.loc,
                "use smaller blocks or fewer max_concurrent_steps",
            )
        )
    return out + _tma_block_dims(inst)


def _tma_block_dims(inst) -> list:
    out = []
    for op in inst.spec.operands:
        block = inst.variant.blocks.get(op.name)
        shape = tuple(b for b in inst.block_shapes[op.name] if b is not None)
        out += tma_box_limit(where(inst), op.name, shape, block.tiling if block is not None else (), _loc(inst, op.name),
                             "use smaller blocks and cover the rest with the grid")
    return out


def tma_box_limit(where: str, name: str, shape: tuple, tiling: tuple, loc, fix: str) -> list:
    """E722 for one block: what one TMA copy moves has at most 256 elements along each dim."""
    box = _tma_box(shape, tiling)
    if max(box, default=0) <= TMA_MAX_BLOCK_DIM:
        return []
    tiled = f" (tiled by {tiling} it is copied as {box})" if tiling else ""
    return [
        Diagnostic(
            "E722",
            f"{where}: {name} block {shape}{tiled} is too large for TMA, which copies "
            f"at most {TMA_MAX_BLOCK_DIM} elements along each dim",
            loc,
            fix,
        )
    ]


def _tma_box(shape: tuple, tiling: tuple) -> tuple:
    """What one TMA copy moves: the block, or with a tiling (tiles per dim..., *tiling)."""
    if not tiling:
        return shape
    lead, tail = shape[: -len(tiling)], shape[-len(tiling) :]
    return (*lead, *(-(-b // t) for b, t in zip(tail, tiling)), *tiling)


# -- mesh kernels (kind: mesh): their pipelines' blocks, warpgroups and clusters ------------


def _mesh(inst) -> list:
    """The backend rules for a mesh kernel's instance."""
    return _mesh_gpu(inst) if inst.variant.backend == "mosaic_gpu" else _mesh_tpu(inst)


def _pipe_bytes(inst, pipe) -> int:
    pi = inst.pipes[pipe.name]
    return sum(math.prod(pi.blocks[pb.operand]) * dt.itemsize(inst.dtypes[pb.operand]) for pb in pipe.blocks)


def _mesh_gpu(inst) -> list:
    out = []
    v, at = inst.variant, where(inst)
    threads = v.mesh_axes(MeshRole.THREADS)
    wgs = inst.mesh[threads[0].name] if threads else 1
    if wgs * WARPGROUP > MAX_CTA_THREADS or wgs < 1:
        out.append(Diagnostic("E723", f"{at}: {wgs} warpgroups per CTA are {wgs * WARPGROUP} CUDA threads; "
                              f"a CTA has 1 to {MAX_CTA_THREADS} ({MAX_CTA_THREADS // WARPGROUP} warpgroups)",
                              threads[0].loc, f"use at most {MAX_CTA_THREADS // WARPGROUP} warpgroups"))
    for pipe in v.pipelines:
        if pipe.compute_wgs and threads and wgs != pipe.compute_wgs + 1:
            out.append(Diagnostic("E723", f"{at}: pipeline {pipe.name} computes on {pipe.compute_wgs} warpgroups and copies "
                                  f"on one more, but the mesh has {wgs}", threads[0].loc,
                                  f"set threads to {pipe.compute_wgs + 1}"))
    grid = v.mesh_axes(MeshRole.GRID)
    cluster = v.mesh_axes(MeshRole.CLUSTER)
    ctas = 1
    for g, c in zip(grid, cluster):
        n, k = inst.mesh[g.name], inst.mesh[c.name]
        ctas *= k
        if k < 1 or n % k:
            sms = f" ({NUM_SMS} = {CHECKED_NUM_SMS})" if NUM_SMS in g.size.names else ""
            out.append(Diagnostic("E724", f"{at}: cluster {c.name} of {k} does not divide grid {g.name} of {n}{sms}",
                                  c.loc, "choose a cluster size that divides the grid axis"))
    if ctas > MAX_CLUSTER:
        out.append(Diagnostic("E724", f"{at}: a cluster of {ctas} CTAs is above the portable limit of {MAX_CLUSTER}",
                              cluster[0].loc, f"use at most {MAX_CLUSTER} CTAs per cluster"))
    pipes = 0
    for pipe in v.pipelines:
        pipes += _pipe_bytes(inst, pipe) * inst.pipes[pipe.name].buffers
        for pb in pipe.blocks:
            out += tma_box_limit(at, f"pipeline {pipe.name} block of {pb.operand}",
                                        inst.pipes[pipe.name].blocks[pb.operand], pb.block.tiling, pb.block.loc,
                                        "use smaller blocks and cover the rest with the pipeline grid")
    total = pipes + scratch_bytes(inst, (MemorySpace.SMEM, MemorySpace.VMEM))
    if total > HOPPER_SMEM_LIMIT:
        out.append(Diagnostic("E721", f"{at}: shared memory estimate {total // 1024} KiB (pipeline blocks x buffers "
                              f"{pipes // 1024} KiB + scratch) exceeds {HOPPER_SMEM_LIMIT // 1024} KiB per block on Hopper",
                              v.loc, "use smaller blocks, fewer pipeline buffers or less scratch"))
    return out


def _mesh_tpu(inst) -> list:
    out = []
    v, at = inst.variant, where(inst)
    blocks = 0
    for pipe in v.pipelines:
        pi = inst.pipes[pipe.name]
        blocks += _pipe_bytes(inst, pipe) * TPU_BUFFERS
        for pb in pipe.blocks:
            out += tpu_tiling(at, f"pipeline {pipe.name} block of {pb.operand}", pi.views[pb.operand],
                                     pi.blocks[pb.operand], inst.dtypes[pb.operand], pb.block.shape_loc)
    limit = compiler_param(inst, "vmem_limit_bytes") or TPU_DEFAULT_VMEM_LIMIT
    total = blocks + scratch_bytes(inst, (MemorySpace.VMEM,))
    if total > limit:
        out.append(Diagnostic("E703", f"{at}: VMEM estimate {total / 2**20:.1f} MiB (pipeline blocks x 2 buffers "
                              f"{blocks / 2**20:.1f} MiB + scratch) exceeds the limit of {limit / 2**20:.1f} MiB",
                              v.loc, "use smaller pipeline blocks, or raise compiler_params.vmem_limit_bytes"))
    return out
