"""The spec's small expression language: parsed with `ast`, evaluated over a whitelist.

Shapes, grids, block shapes, constraints and index maps are expressions over dims,
params and grid indices. Nothing here calls eval(): a tree is accepted only if
every node is on the whitelist, and it is evaluated by walking it.

    names, ints (and float/bool constants), + - * // %, unary -,
    comparisons, and/or/not, min(...), max(...), cdiv(a, b), next_pow2(n)
    resource estimates only (a backend's `shared_memory`): itemsize(x), the bytes per element of
    operand or scratch buffer x in the call
    index maps only: ref[expr, ...] where ref is a scalar-prefetch operand (one index per dim),
    ds(start, size), the slice a bounded_slice block dim takes (pl.ds), and the
    conditionals select(c, a, b) and `a if c else b` (jnp.where: both sides are
    computed, so the checks evaluate both too)
"""

from __future__ import annotations

import ast
import dataclasses
import io
import operator
import tokenize
from typing import Any, Mapping

from kspec.codegen.diagnostics import Location

MAX_SOURCE = 1000
MAX_DEPTH = 256  # nesting of an expression's tree: rendering walks it recursively (past ~350, Python's stack runs out)
MAX_MAGNITUDE = 1 << 62

_BINOPS = {
    ast.Add: (operator.add, "+"),
    ast.Sub: (operator.sub, "-"),
    ast.Mult: (operator.mul, "*"),
    ast.FloorDiv: (operator.floordiv, "//"),
    ast.Mod: (operator.mod, "%"),
}
_CMPOPS = {
    ast.Eq: (operator.eq, "=="),
    ast.NotEq: (operator.ne, "!="),
    ast.Lt: (operator.lt, "<"),
    ast.LtE: (operator.le, "<="),
    ast.Gt: (operator.gt, ">"),
    ast.GtE: (operator.ge, ">="),
}


def _cdiv(a, b):
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Slice:
    """What `ds(start, size)` evaluates to: the elements [start, start + size)."""

    start: int
    size: int


def _next_pow2(n):
    """The least power of two >= n (1 for n <= 1), as pl.next_power_of_2 computes it."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


FUNCTIONS = {"min": min, "max": max, "cdiv": _cdiv, "next_pow2": _next_pow2}


def _select(c, a, b):
    """select(c, a, b): a where c holds, else b (jnp.where in generated code)."""
    return a if c else b


INDEX_MAP_FUNCTIONS = {"ds": Slice, "select": _select}
# How each whitelisted function is spelled in generated code.
RENDERED_FUNCTIONS = {"min": "min", "max": "max", "cdiv": "pl.cdiv", "next_pow2": "pl.next_power_of_2", "ds": "pl.ds",
                      "select": "jnp.where"}
ARITY = {"cdiv": 2, "ds": 2, "next_pow2": 1, "select": 3, "itemsize": 1}  # min and max take two or more
# itemsize(x) reads the call's dtypes, which an expression's env holds under this key ({name: bytes});
# generated code reads them from the dict `_itemsize`.
ITEMSIZES = "itemsize()"


class ExprError(Exception):
    """A problem with an expression; col is a 0-based offset into its source."""

    def __init__(self, code: str, message: str, col: int = 0, line: int = 0):
        super().__init__(message)
        self.code, self.message, self.col, self.line = code, message, col, line


@dataclasses.dataclass(frozen=True)
class Expr:
    source: str
    tree: ast.expr = dataclasses.field(compare=False, repr=False)
    names: frozenset = dataclasses.field(compare=False)
    loc: Location | None = dataclasses.field(default=None, compare=False)
    sized: frozenset = dataclasses.field(default=frozenset(), compare=False)  # the operands itemsize() reads

    def eval(self, env: Mapping[str, Any]) -> Any:
        return _eval(self.tree, env)

    def render(self, traced: bool = False) -> str:
        """Python source for generated code (names stay as locals)."""
        return _render(self.tree, traced)

    @property
    def shown(self) -> str:
        """The expression re-printed from its checked tree (`cdiv(N, bs)`), for generated
        docstrings: never the raw text of the spec."""
        return ast.unparse(self.tree)

    @property
    def constant(self) -> Any:
        return self.tree.value if isinstance(self.tree, ast.Constant) else None


@dataclasses.dataclass(frozen=True)
class IndexMap:
    source: str
    args: tuple  # grid index names (plus scalar-prefetch refs, by position)
    results: tuple  # of Expr
    loc: Location | None = dataclasses.field(default=None, compare=False)

    @property
    def names(self) -> frozenset:
        return frozenset().union(*(r.names for r in self.results)) - set(self.args)

    def eval(self, env: Mapping[str, Any]) -> tuple:
        return tuple(r.eval(env) for r in self.results)

    def render(self) -> str:
        body = ", ".join(r.render(traced=True) for r in self.results)
        if len(self.results) == 1:
            body += ","
        return f"lambda {', '.join(self.args)}: ({body})"


def parse_expr(value: Any, *, subscripts: bool = False, sizes: bool = False) -> Expr:
    """An int/bool/float literal from YAML, or an expression string; `sizes`: it may call itemsize(x)."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        tree = ast.Constant(value, lineno=1, col_offset=0, end_lineno=1, end_col_offset=len(repr(value)))
        return Expr(repr(value), tree, frozenset())
    if not isinstance(value, str):
        raise ExprError("E300", f"expected an expression, got {type(value).__name__}")
    if len(value) > MAX_SOURCE:
        raise ExprError("E300", f"expression longer than {MAX_SOURCE} characters")
    source = value.strip()
    lead = len(value) - len(value.lstrip())
    _refuse_hidden_text(source, lead)
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as e:
        raise ExprError(
            "E300", f"invalid expression: {e.msg}", lead + max((e.offset or 1) - 1, 0)
        ) from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError("E300", "expression too complex") from None
    if _depth(tree) > MAX_DEPTH:
        raise ExprError("E300", f"expression nested more than {MAX_DEPTH} deep")
    names: set = set()
    _check(tree, names, subscripts, lead, sizes=sizes)
    sized = {n.args[0].id for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func.id == "itemsize"}
    return Expr(source, tree, frozenset(names), sized=frozenset(sized))


def _depth(tree: ast.AST) -> int:
    """How deep the tree nests, found without recursion (a hostile tree may be deeper than the stack)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _refuse_hidden_text(source: str, lead: int) -> None:
    """An expression is one line of code and nothing else: a comment or a line break could
    carry text that the parsed tree does not show (and that a reader of the spec takes for
    part of the expression), so both are refused where they start."""
    for i, ch in enumerate(source):
        if ch in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029":
            raise ExprError("E300", "a line break is not allowed in an expression", lead + i)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        return  # ast.parse reports it
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            raise ExprError("E300", "a comment (`#`) is not allowed in an expression", lead + tok.start[1])


def parse_index_map(value: Any, *, subscripts: bool = False) -> IndexMap:
    """`i, j -> (i, 0)`: grid indices before the arrow, block indices after."""
    if not isinstance(value, str):
        raise ExprError("E302", "an index_map is a string such as `i, j -> (i, j)`")
    if value.count("->") != 1:
        raise ExprError(
            "E302", "an index_map needs exactly one `->`, as in `i, j -> (i, j)`"
        )
    lhs, rhs = value.split("->")
    args = tuple(a.strip() for a in lhs.split(",")) if lhs.strip() else ()
    for a in args:
        if not a.isidentifier() or a in FUNCTIONS:
            raise ExprError("E302", f"index_map argument `{a}` is not a plain name")
    if len(set(args)) != len(args):
        raise ExprError("E302", "index_map arguments must be distinct")
    offset = len(lhs) + 2
    try:
        body = parse_expr(rhs, subscripts=subscripts)
    except ExprError as e:
        raise ExprError(e.code, e.message, e.col + offset) from None
    tree = body.tree
    parts = tree.elts if isinstance(tree, ast.Tuple) else [tree]
    results = tuple(
        Expr(ast.unparse(p), p, frozenset(_names(p))) for p in parts
    )
    return IndexMap(value.strip(), args, results)


def _names(tree: ast.AST) -> set:
    """Names read by an expression (not the whitelisted functions it calls)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def _check(node: ast.AST, names: set, subscripts: bool, lead: int, top: bool = True, sizes: bool = False) -> None:
    def bad(what: str) -> ExprError:
        col = getattr(node, "col_offset", 0) + lead
        return ExprError("E300", f"{what} is not allowed in an expression", col)

    rec = lambda n: _check(n, names, subscripts, lead, top=False, sizes=sizes)  # noqa: E731
    if isinstance(node, ast.Name):
        names.add(node.id)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, (str, bytes, complex)) or node.value is None or node.value is ...:
            raise bad(f"the constant {node.value!r}")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise bad(f"operator `{type(node.op).__name__}`")
        rec(node.left)
        rec(node.right)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise bad(f"operator `{type(node.op).__name__}`")
        rec(node.operand)
    elif isinstance(node, ast.Compare):
        if any(type(op) not in _CMPOPS for op in node.ops):
            raise bad("this comparison")
        rec(node.left)
        for c in node.comparators:
            rec(c)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            rec(v)
    elif isinstance(node, ast.Call):
        allowed = FUNCTIONS.keys() | (INDEX_MAP_FUNCTIONS.keys() if subscripts else set()) | (
            {"itemsize"} if sizes else set())
        if not isinstance(node.func, ast.Name) or node.func.id not in allowed:
            raise bad("calling anything but min, max, cdiv, next_pow2, ds or select" if subscripts
                      else "calling anything but min, max, cdiv, next_pow2 or itemsize" if sizes
                      else "calling anything but min, max, cdiv or next_pow2")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise bad("keyword or starred arguments")
        # min/max of one int would iterate over it; cdiv, ds and next_pow2 take exactly their arity
        arity = ARITY.get(node.func.id)
        if (len(node.args) != arity) if arity else len(node.args) < 2:
            raise bad(f"`{node.func.id}` with {len(node.args)} arguments")
        if node.func.id == "itemsize":  # its argument names an operand, not a value
            if not isinstance(node.args[0], ast.Name):
                raise bad("`itemsize` of anything but an operand's name")
            return
        for a in node.args:
            rec(a)
    elif isinstance(node, ast.Tuple) and top:
        for e in node.elts:
            if isinstance(e, ast.Starred):
                raise ExprError("E300", "a starred element is not allowed in an expression", e.col_offset + lead)
            rec(e)
    elif isinstance(node, ast.IfExp):
        if not subscripts:
            raise bad("a conditional (`a if c else b`) outside an index map")
        rec(node.test)
        rec(node.body)
        rec(node.orelse)
    elif isinstance(node, ast.Subscript) and subscripts:
        indices = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if not isinstance(node.value, ast.Name) or not indices or any(
                isinstance(i, (ast.Slice, ast.Starred, ast.Tuple)) for i in indices):
            raise bad("this subscript")
        names.add(node.value.id)
        for i in indices:
            rec(i)
    else:
        raise bad(f"`{type(node).__name__}`")


class NotEvaluable(Exception):
    """An expression reads something only known at run time (e.g. prefetched data)."""


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return _bounded(node.value, node)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError("E301", f"unknown name `{node.id}`", node.col_offset)
        if env[node.id] is None:  # a param whose default is null
            raise ExprError("E303", f"`{node.id}` is None here: an expression cannot use it", node.col_offset)
        return _bounded(env[node.id], node)  # a param may hold any int YAML can spell
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        fn, sym = _BINOPS[type(node.op)]
        if sym in ("//", "%") and right == 0:
            raise ExprError("E303", f"division by zero in `{ast.unparse(node)}`", node.col_offset)
        return _bounded(fn(left, right), node)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)][0](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Call) and node.func.id == "itemsize":
        sizes, name = env.get(ITEMSIZES), node.args[0].id
        if sizes is None:
            raise NotEvaluable(ast.unparse(node))  # no dtypes here: only a call knows them
        if name not in sizes:
            raise ExprError("E301", f"`itemsize({name})`: `{name}` is not an operand or scratch buffer", node.col_offset)
        return sizes[name]
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        if node.func.id == "cdiv" and args[1] == 0:
            raise ExprError("E303", f"division by zero in `{ast.unparse(node)}`", node.col_offset)
        return {**FUNCTIONS, **INDEX_MAP_FUNCTIONS}[node.func.id](*args)
    if isinstance(node, ast.IfExp):
        return _select(*(_eval(n, env) for n in (node.test, node.body, node.orelse)))  # both sides, as jnp.where
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.Subscript):
        value = node.value  # a scalar-prefetch ref: its values, or None where only the run knows them
        array = env[value.id] if isinstance(value, ast.Name) and value.id in env else _eval(value, env)
        return _read(node, array, env)
    raise ExprError("E300", f"cannot evaluate `{ast.unparse(node)}`")


def _read(node: ast.Subscript, array, env: Mapping[str, Any]) -> int:
    """`ref[i, j]`: one entry of a scalar-prefetch array (anything with a shape, or a list),
    every index checked against its dim."""
    if array is None:
        raise NotEvaluable(ast.unparse(node))
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    index = tuple(_eval(p, env) for p in parts)
    shape = tuple(getattr(array, "shape", (len(array),)))
    if len(index) != len(shape):
        raise ExprError("E303", f"`{ast.unparse(node)}` gives {len(index)} "
                        f"{'index' if len(index) == 1 else 'indices'} to an array of rank {len(shape)}", node.col_offset)
    for d, (i, n) in enumerate(zip(index, shape)):
        if not 0 <= i < n:
            along = f" along dim {d}" if len(shape) > 1 else ""
            raise ExprError("E303", f"`{ast.unparse(node)}` reads index {i} of {n}{along}", node.col_offset)
    return int(array[index if len(index) > 1 else index[0]])


def _bounded(value, node):
    if isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        raise ExprError("E303", f"`{ast.unparse(node)}` is too large", node.col_offset)
    return value


def _render(node: ast.AST, traced: bool = False) -> str:
    """Python source for generated code.

    `traced`: the expression runs on traced grid indices (an index map), so
    min/max become jnp.minimum/jnp.maximum, nested pairwise, `a if c else b` and
    select(c, a, b) jnp.where(c, a, b), and/or/not and chained comparisons
    jnp.logical_and/or/not. Untraced, select(c, a, b) is `a if c else b`.
    """
    node = _Renamer(traced).visit(_copy(node))
    return ast.unparse(node)


def _copy(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Constant):
        return ast.Constant(node.value)
    return ast.parse(ast.unparse(node), mode="eval").body


def _attr(spelled: str) -> ast.expr:
    mod, attr = spelled.split(".")
    return ast.Attribute(ast.Name(mod, ast.Load()), attr, ast.Load())


class _Renamer(ast.NodeTransformer):
    TRACED = {"min": "jnp.minimum", "max": "jnp.maximum"}

    def __init__(self, traced: bool):
        self.traced = traced

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        if not self.traced:
            return node
        return ast.Call(_attr("jnp.where"), [node.test, node.body, node.orelse], [])

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if not self.traced:
            return node
        fn = "jnp.logical_and" if isinstance(node.op, ast.And) else "jnp.logical_or"
        out = node.values[0]
        for value in node.values[1:]:
            out = ast.Call(_attr(fn), [out, value], [])
        return out

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if self.traced and isinstance(node.op, ast.Not):
            return ast.Call(_attr("jnp.logical_not"), [node.operand], [])
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if not self.traced or len(node.ops) == 1:
            return node
        sides = [node.left, *node.comparators]  # a < b < c: (a < b) and (b < c)
        pairs = [ast.Compare(sides[k], [op], [sides[k + 1]]) for k, op in enumerate(node.ops)]
        out = pairs[0]
        for pair in pairs[1:]:
            out = ast.Call(_attr("jnp.logical_and"), [out, pair], [])
        return out

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = node.func.id
        if name == "itemsize":  # the call's dict of bytes per element
            return ast.Subscript(ast.Name("_itemsize", ast.Load()), ast.Constant(node.args[0].id), ast.Load())
        self.generic_visit(node)
        if name == "select" and not self.traced:
            return ast.IfExp(*node.args)
        if self.traced and name in self.TRACED:
            out = node.args[0]
            for arg in node.args[1:]:
                out = ast.Call(_attr(self.TRACED[name]), [out, arg], [])
            return out
        spelled = RENDERED_FUNCTIONS[name]
        if "." in spelled:
            node.func = _attr(spelled)
        return node
