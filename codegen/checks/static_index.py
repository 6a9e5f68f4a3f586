"""E511: a constant index past the end of a ref's axis, found in the body for each case.

A body indexes its refs (`x_ref[0]`, `b_ref.at[0]`, `sem_ref.at[1]`) with constants as well as with
program ids. Where the constant lies past the axis, nothing below kspec says so: a compiled kernel reads
or writes past the buffer (a TMA copy of a view that starts past its array reads whatever follows it, and
keeps the values right often enough for a test to pass), and interpret modes clamp or raise only where
they run. The ref's shape is known for each case: an operand's block with its squeezed dims dropped (its
whole array without blocks, and in mesh kernels), or a scratch entry's shape. Each ref is followed through
a chain of subscripts and `.at[...]`: a constant drops its axis, a full slice `:` keeps the axis's size, any
other index keeps the axis at an unknown size. A name the body binds itself (an argument of a nested
function, an assignment) is not taken for the ref of that name. The code is parsed, never run.
"""

from __future__ import annotations

import ast

from kspec.codegen.diagnostics import Diagnostic

from .names import _bound


def check(inst) -> list:
    """E511 for each constant index of the body past its ref's axis, for this instance's case."""
    code = inst.variant.body
    try:
        tree = ast.parse(code.source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []  # E600 reports it
    shapes = {f"{name}_ref": tuple(d for d in block if d is not None)
              for name, block in inst.block_shapes.items() if block is not None}
    shapes.update({f"{name}_ref": shape for name, shape in inst.scratch_shapes.items()
                   if shape and all(isinstance(d, int) for d in shape)})
    for name in _bound(tree):
        shapes.pop(name, None)
    out = []

    def shape_of(node: ast.AST):
        """The shape of a ref expression (None for a dim of unknown size), or None where it is no ref."""
        if isinstance(node, ast.Name):
            return shapes.get(node.id)
        if isinstance(node, ast.Subscript):
            shape = shape_of(_chained(node))
            return None if shape is None else indexed(node, shape)
        return None

    def indexed(node: ast.Subscript, shape: tuple):
        items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if any(isinstance(i, ast.Starred) or (isinstance(i, ast.Constant) and i.value is None) for i in items):
            return None  # unpacked indices, or a new axis: the axes are not known from here
        dots = [k for k, i in enumerate(items) if isinstance(i, ast.Constant) and i.value is Ellipsis]
        if len(dots) > 1 or len(items) - len(dots) > len(shape):
            return None
        gap = len(shape) - (len(items) - len(dots))
        axes = [k if not dots or k <= dots[0] else k - 1 + gap for k in range(len(items))]
        kept = []
        for item, axis in zip(items, axes):
            if isinstance(item, ast.Constant) and item.value is Ellipsis:
                kept += [shape[a] for a in range(axis, axis + gap)]
                continue
            n = shape[axis]
            value = _int(item)
            if value is not None:
                if n is not None and not -n <= value < n:
                    where = ast.get_source_segment(code.source, node) or "the ref"
                    out.append(Diagnostic(
                        "E511", f"case `{inst.case.name}`: `{where}` takes index {value} of an axis of {n} "
                        f"(valid 0..{n - 1})", code.loc_of(item.lineno, item.col_offset),
                        f"axis {axis} of the ref has {n} element{'s' if n != 1 else ''} in this case"))
                continue
            full = isinstance(item, ast.Slice) and item.lower is None and item.upper is None and item.step is None
            kept.append(n if full else None)
        if not dots:
            kept += shape[len(items):]  # the axes the subscript leaves out
        return tuple(kept)

    subscripts = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript)]
    # a chain (`b_ref.at[0].at[cols]`) is walked once, from its outermost subscript
    inner = {id(_chained(n)) for n in subscripts}
    for node in subscripts:
        if id(node) not in inner:
            shape_of(node)
    return out


def _chained(node: ast.Subscript) -> ast.AST:
    """What a subscript indexes, through `.at`: the next link of a chain."""
    value = node.value
    return value.value if isinstance(value, ast.Attribute) and value.attr == "at" else value


def _int(node: ast.AST):
    """The value of an integer constant (or its negation), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _int(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None
