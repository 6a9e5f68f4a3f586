"""How generated code spells things: literals, tuples, lambdas, dtypes, block dims and the
layouts of Mosaic GPU blocks. Every piece of Python source the templates receive is built
from these."""

from __future__ import annotations

import ast
import math

from kspec.codegen.spec.model import DimKind, KernelSpec, Variant


def literal(value) -> str:
    """A value from the spec as a Python literal: its repr, except that an infinite float is
    spelled `float('inf')` (its repr is the bare name `inf`, which generated code does not have)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, tuple):
        return tuple_src(map(literal, value))
    return repr(value)


def jnp_dtype(name: str) -> str:
    return "jnp.bool_" if name == "bool" else f"jnp.{name}"


def tuple_src(items) -> str:
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def dtype_src(spec: KernelSpec, op) -> str:
    if op.dtype_map is not None:
        return f"(jnp.dtype(out_dtype) if out_dtype is not None else {mapped_dtype(op.dtype_map)})"
    return f"{op.follows}.dtype" if op.follows else jnp_dtype(op.dtypes[0])


def mapped_dtype(m) -> str:
    """`{'int8': jnp.int32, ...}[jnp.dtype(x.dtype).name]`: a dtype map looked up in a call."""
    table = "{" + ", ".join(f"{k!r}: {jnp_dtype(v)}" for k, v in m.table) + "}"
    return f"{table}[jnp.dtype({m.source}.dtype).name]"


def out_dtype_outputs(spec: KernelSpec) -> list:
    """The outputs whose dtype is a map: the ones the generated function's out_dtype sets."""
    return [o.name for o in spec.outputs if o.dtype_map is not None]


def gpu_layout(block) -> str:
    """plgpu.BlockSpec keywords for a block's shared-memory layout; "" when it sets none."""
    transforms = [f"plgpu.TilingTransform({tuple_src(map(str, block.tiling))})"] if block.tiling else []
    transforms += [f"plgpu.SwizzleTransform({block.swizzle})"] if block.swizzle else []
    kwargs = [f"transforms={tuple_src(transforms)}"] if transforms else []
    kwargs += [f"delay_release={block.delay_release}"] if getattr(block, "delay_release", 0) else []
    axes = getattr(block, "collective_axes", ())
    kwargs += [f"collective_axes={tuple_src(repr(a) for a in axes)}"] if axes else []
    return ", ".join(kwargs)


def block_dim(block, d: int) -> str:
    """One block_shape entry as Pallas spells it."""
    kind, size = block.kind(d), block.block_shape[d]
    if kind == DimKind.SQUEEZED:
        return "pl.squeezed"
    if kind == DimKind.ELEMENT:
        return f"pl.Element({size.render()}, {tuple_src(map(str, block.padding[d]))})"
    if kind == DimKind.BOUNDED:
        return f"pl.BoundedSlice({size.render()})"
    return size.render()


def grid_indices(variant: Variant) -> dict:
    """{name: axis} of the named grid axes the body mentions: the body receives these
    indices as keyword arguments (a list grid has no names, so none)."""
    used = variant.body.names
    return {name: axis for axis, name in enumerate(variant.grid_names) if name in used}


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.names.get(node.id, node.id), node.ctx)


def pipelined(imap, names: list, sequential: list) -> str:
    """An index map as plgpu.emit_pipeline calls it, on the sequential grid indices only.

    Its arguments are renamed to the grid's names, so the parallel indices resolve to
    the kernel's, which the generated code binds under those names."""
    rename = _Rename(dict(zip(imap.args, names)))
    results = [ast.unparse(rename.visit(ast.parse(r.render(traced=True), mode="eval").body)) for r in imap.results]
    body = ", ".join(results) + ("," if len(results) == 1 else "")
    return lambda_src([names[n] for n in sequential], f"({body})")


def lambda_src(args: list, body: str) -> str:
    return f"lambda {', '.join(args)}: {body}" if args else f"lambda: {body}"
