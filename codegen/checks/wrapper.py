"""E440 to E443 and the kernel operands' dtypes and shapes: the code around the kernel (`prologue:`,
`epilogue:`), the kernel's own operands (`kernel:`) and the optional inputs the prologue takes
(`optional: true`, a case's `absent:`). The code is parsed, never run; its syntax and imports are
checked with the other code (E600, E601), the names it reads by names.py (E602).
"""

from __future__ import annotations

import ast

from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.spec.model import Code, KernelSpec


def check(spec: KernelSpec) -> list:
    out = _optional(spec)
    w = spec.wrapper
    if w is None:
        return out
    pairs = (("prologue", w.prologue, "inputs", w.inputs), ("epilogue", w.epilogue, "outputs", w.outputs))
    for what, code, role, operands in pairs:
        if code is None and operands:
            out.append(Diagnostic(
                "E440", f"kernel.{role} are declared but no {what} {'makes' if role == 'inputs' else 'reads'} them",
                operands[0].loc, f"add `{what}:`, which {'returns' if role == 'inputs' else 'takes'} "
                f"{', '.join(o.name for o in operands)}, or drop kernel.{role}"))
        elif code is not None and not operands:
            out.append(Diagnostic(
                "E440", f"`{what}:` needs kernel.{role}: the kernel's {role} it "
                f"{'returns' if role == 'inputs' else 'combines'}", code.loc_of(1, 0),
                f"declare them under kernel.{role}, with their shapes and dtypes"))
    if spec.sharding is not None:
        out.append(Diagnostic("E440", "`sharding:` does not take a prologue or epilogue", w.loc,
                              "shard the kernel without them, or drop `sharding:`"))
    out += _residual_kernel_outputs(spec)
    if w.prologue is not None and w.inputs:
        out += _returns(w.prologue, "prologue", [o.name for o in w.inputs], "kernel.inputs")
    if w.epilogue is not None and w.outputs:
        out += _returns(w.epilogue, "epilogue", [o.name for o in spec.outputs], "outputs")
    return out + _operands(spec)


def _residual_kernel_outputs(spec: KernelSpec) -> list:
    """E443: `residual: true` on a kernel operand marks a kernel output that the call writes only
    when asked for the residual outputs (residuals=True): a kernel input is always read, and in a
    spec with no residual output nothing ever asks."""
    out = []
    saved = [o.name for o in spec.outputs if o.residual]
    for op in spec.wrapper.inputs:
        if op.residual:
            out.append(Diagnostic("E443", f"kernel input `{op.name}` is `residual: true`, which only a kernel output can be",
                                  op.residual_loc, "drop `residual: true`: the kernel reads every input it is given"))
    for op in spec.wrapper.outputs:
        if op.residual and not saved:
            out.append(Diagnostic("E443", f"kernel output `{op.name}` is `residual: true` but no output of {spec.name} "
                                  "is: no call would ask for it, so it would never be written",
                                  op.residual_loc, "mark the output it becomes `residual: true` (saved for the "
                                  "backward pass), or drop `residual: true` here"))
    return out


def _optional(spec: KernelSpec) -> list:
    """E442: an optional input (`optional: true`) is given to a prologue, which makes the kernel's inputs
    either way; it comes after the required inputs, binds no dim alone, and no operand shares its dtype.
    A case's `absent` names optional inputs."""
    out = []
    optional = [o for o in spec.inputs if o.optional]
    required_dims = {e.source for o in spec.inputs if not o.optional for e in o.shape}
    for op in optional:
        problems = []
        if spec.wrapper is None or spec.wrapper.prologue is None or not spec.wrapper.inputs:
            problems.append(("needs a prologue and kernel.inputs: the kernel never takes None, the prologue makes "
                             "its inputs either way", "add a prologue that handles None, e.g. zeros in its place"))
        later = [o.name for o in spec.inputs[spec.inputs.index(op) + 1:] if not o.optional]
        if later:
            problems.append((f"comes before required input `{later[0]}`", "declare the optional inputs last"))
        alone = [d for d in spec.dims if d in {e.source for e in op.shape} and d not in required_dims]
        if alone:
            problems.append((f"binds dim `{alone[0]}`, which no required input has", "use dims of the required inputs"))
        if op.prefetch:
            problems.append(("is a scalar-prefetch input", "prefetch a required input"))
        followers = [o.name for o in spec.operands + spec.kernel_only if o.follows == op.name]
        if followers:
            problems.append((f"gives its dtype to `{followers[0]}`, which would have none without it",
                             f"give {followers[0]} a dtype of its own"))
        out += [Diagnostic("E442", f"optional input `{op.name}` {p}", op.loc, hint) for p, hint in problems]
    names = {o.name for o in optional}
    for case in spec.cases + spec.bench + spec.sweep:
        for name in case.absent:
            if name not in names:
                out.append(Diagnostic("E442", f"case `{case.name}`: absent `{name}` is not an optional input", case.loc,
                                      did_you_mean(name, sorted(names)) or "mark the input `optional: true`"))
    return out


def _returns(code: Code, what: str, names: list, where: str) -> list:
    """E441: the code returns, and each `return` of a tuple display returns one value per name."""
    try:
        tree = ast.parse(code.source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return []  # E600 reports it
    returns = [node for node in own_nodes(tree) if isinstance(node, ast.Return)]
    shown = ", ".join(names)
    if not returns:
        return [Diagnostic("E441", f"{what}: returns nothing; it must return {_count(names)} ({shown})",
                           code.loc_of(1, 0), f"end it with `return {shown}`")]
    out = []
    for node in returns:
        value = node.value
        # a tuple display has a known length; any other value may be a tuple of any length
        count = 0 if value is None else len(value.elts) if isinstance(value, ast.Tuple) else None
        if count is not None and count != len(names):
            out.append(Diagnostic(
                "E441", f"{what}: returns {count} value{'s' if count != 1 else ''} but {where} has {_count(names)} ({shown})",
                code.loc_of(node.lineno, node.col_offset), f"return one value per name of {where}, in order: `return {shown}`"))
    return out


def own_nodes(tree: ast.AST):
    """The nodes of the function body itself, not of the functions and classes it defines."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _same_dtype(kernel_input, input) -> bool:
    """Whether a kernel input has the dtype of the input whose name it takes, whatever the case."""
    if kernel_input.follows is not None:
        return kernel_input.follows in (input.name, input.follows)
    return input.follows is None and tuple(input.dtypes) == tuple(kernel_input.dtypes)


def _count(names: list) -> str:
    return f"{len(names)} value{'s' if len(names) != 1 else ''}"


def _operands(spec: KernelSpec) -> list:
    """E401 and E407 for the kernel's own operands: a known dtype or an input with a dtype of its own;
    E408 for the function's operands the kernel does not take: a shape over the dims and params."""
    out = []
    own = {o.name for o in spec.inputs if o.follows is None} | {o.name for o in spec.wrapper.inputs if o.follows is None}
    scope = set(spec.dims) | {p.name for v in spec.variants.values() for p in v.params}
    by_name = {o.name: o for o in spec.inputs}
    for op in spec.kernel_only:
        same = by_name.get(op.name) if op.role == "input" else None
        if same is not None and not _same_dtype(op, same):  # it takes the input's place: and its dtype
            out.append(Diagnostic("E407", f"kernel input {op.name} takes the name of input `{op.name}` but not its dtype",
                                  op.dtype_loc, f"write `dtype: {same.follows or op.name}`, or give the kernel input "
                                  "a name of its own"))
        elif op.follows is not None and op.follows not in own:
            out.append(Diagnostic("E407", f"{op.name}: dtype refers to input `{op.follows}`, which has no dtype of its own",
                                  op.dtype_loc, "an operand can only share the dtype of an input that has a dtype of its own"))
        elif op.follows is None and op.dtypes[0] not in dt.DTYPES:
            inputs = [o.name for o in spec.inputs + spec.wrapper.inputs]
            out.append(Diagnostic("E401", f"{op.name}: unknown dtype `{op.dtypes[0]}`", op.dtype_loc,
                                  did_you_mean(op.dtypes[0], list(dt.DTYPES) + inputs)))
    kernel = spec.kernel_view.operands  # semantic._structure checks these
    for op in (o for o in spec.operands if o not in kernel):
        for e in op.shape:
            for name in sorted(e.names - scope):
                out.append(Diagnostic("E408", f"{op.name}: `{name}` is not a dim bound by an input shape, nor a param",
                                      e.loc, "use it alone as a dim of some input's shape, or declare it under params"))
    return out
