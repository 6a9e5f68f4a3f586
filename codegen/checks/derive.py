"""Cases derived from a spec: the edge-case shapes its declared cases may lack.

A spec splits a dim into steps: a grid axis of `cdiv(M, bm)` or `M // bm` programs, a mesh
pipeline over `K // tk` steps, a body's `lax.fori_loop(0, K // bk, ...)` or `range(pl.cdiv(S, bk))`.
A kernel is most often wrong at the edges of such a split: a ragged last step, exactly one, two or
three steps (a software pipeline's prologue and drain meet there). Each split found in the spec's
expressions or in the source of its bodies (parsed, never run) gives properties a case can have on
a backend; a case is derived for each property, from a declared case by changing one dim, named
`derived:<property>_<dim>` (`derived:ragged_M`, `derived:steps2_K`). A persistent kernel (a mesh
grid sized from `num_sms`) also gets `derived:persistent`: more tiles than programs, the last
program's share of them short.

A candidate is kept only when it binds the spec's dims, meets the spec's constraints and every
backend's hardware rules (the `fits` callback, codegen/checks/semantic.py); the per-case proofs
(bounds, coverage) are what a derived case is checked against, not a filter. Derivation is
deterministic: the same spec gives the same cases. Nothing here runs spec code.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator

from kspec.codegen.backends.rules import CHECKED_NUM_SMS, NUM_SMS
from kspec.codegen.checks.instances import dtype_assignments, unmet
from kspec.codegen.spec.expr import FUNCTIONS, Expr, ExprError, NotEvaluable
from kspec.codegen.spec.model import Case, KernelSpec, Variant

PREFIX = "derived:"
STEPS = (1, 2, 3)  # step counts every split is run with
MAX_FITS = 8  # candidates checked against the spec's rules per property before giving up on it
MAX_SPLITS = 32  # splits a spec's derivation looks at (the first found): the work stays bounded
MAX_CHECKED = 96  # candidates checked against the spec's rules per spec, all properties together
SCAN = 256  # values of a dim tried for a property that no closed-form value gives (persistent grids)
GPU_BACKENDS = ("triton", "mosaic_gpu")  # the backends a derived persistent case runs on: it is sized for a GPU


@dataclasses.dataclass(frozen=True)
class Split:
    """A dim split into steps: `cdiv(num, den)` or `num // den`, in a grid, a pipeline or a body."""

    num: Expr
    den: Expr
    where: str  # "grid axis i", "pipeline k_loop", "body"

    @property
    def persistent(self) -> bool:
        """A persistent grid's tiles per program: its denominator reads the device's SM count."""
        return NUM_SMS in self.den.names


@dataclasses.dataclass(frozen=True)
class Derived:
    """A derived case, the declared case it was made from and what it adds."""

    case: Case
    base: str  # the declared case's name
    dim: str  # the dim changed
    prop: str  # ragged | steps1 | steps2 | steps3 | smallest (less than one step) | persistent

    @property
    def note(self) -> str:
        """How a report says where the case comes from: `case square with M = 200`."""
        return f"case `{self.base}` with {self.dim} = {self.case.dims[self.dim]}"


def _expr(node: ast.expr) -> Expr:
    return Expr(ast.unparse(node), node, frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name)))


def cdiv_parts(size: Expr) -> tuple | None:
    """(numerator, denominator) as Exprs when `size` is `cdiv(n, b)`, else None."""
    tree = size.tree
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "cdiv"):
        return None
    return tuple(_expr(a) for a in tree.args)


def _plain(node: ast.AST, scope: set) -> bool:
    """Whether a node from a body is an integer expression that Expr.eval takes, over `scope` only."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            if n.id not in scope and n.id not in FUNCTIONS:
                return False
        elif isinstance(n, ast.Call):
            if not (isinstance(n.func, ast.Name) and n.func.id in FUNCTIONS and not n.keywords):
                return False
        elif isinstance(n, ast.Constant):
            if isinstance(n.value, bool) or not isinstance(n.value, int):
                return False
        elif not isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Load, ast.operator, ast.USub, ast.UAdd)):
            return False
        if isinstance(n, ast.BinOp) and type(n.op) not in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod):
            return False
    return True


class _Cdiv(ast.NodeTransformer):
    """`pl.cdiv(a, b)` -> `cdiv(a, b)`, as the spec's expressions spell it."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cdiv":
            return ast.copy_location(ast.Call(ast.Name("cdiv", ast.Load()), node.args, node.keywords), node)
        return node


def _splits_in(node: ast.AST, dims: set, scope: set, where: str) -> Iterator[Split]:
    """Every `cdiv(n, b)` and `n // b` in a tree whose n reads a dim, over `scope` names only."""
    for n in ast.walk(node):
        parts = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "cdiv" and len(n.args) == 2:
            parts = n.args
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv):
            parts = (n.left, n.right)
        if parts is None or not all(_plain(p, scope) for p in parts):
            continue
        num, den = (_expr(p) for p in parts)
        if num.names & dims:
            yield Split(num, den, where)


def splits(spec: KernelSpec, v: Variant) -> list:
    """The splits of one backend's kernel: its grid, its mesh, its pipelines and its body, in that order."""
    dims = set(spec.dims)
    scope = dims | {p.name for p in v.params} | {NUM_SMS}
    found: list = []
    sized = [(a.size, f"grid axis {a.name or i}") for i, a in enumerate(v.grid)]
    sized += [(a.size, f"mesh {a.role} {a.name}") for a in v.mesh]
    sized += [(a.size, f"pipeline {p.name}") for p in v.pipelines for a in p.grid]
    for size, where in sized:
        found += _splits_in(size.tree, dims, scope, where)
    try:
        tree = _Cdiv().visit(ast.parse(v.body.source))
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        found += _splits_in(tree, dims, scope, "body")
    return list({(s.num.source, s.den.source): s for s in found}.values())


def runs(spec: KernelSpec, v: Variant, case: Case) -> bool:
    """Whether verify runs the case on this backend (a dtype it takes; its constraints met and, by
    `unmet`, the backend among the case's `backends`)."""
    return any(v.supports(d) for d in dtype_assignments(spec, case)) and unmet(v, case) is None


def env(v: Variant, case: Case) -> dict | None:
    """The dims and params a case runs this backend with (as instances.instantiate binds them),
    with the checked SM count for a mesh grid."""
    try:
        out = {p.name: p.default_at(case.dims) for p in v.params}
    except (ExprError, NotEvaluable, KeyError):
        return None
    out.update(case.dims)
    out.update({k: val for k, val in case.params.items() if k in {p.name for p in v.params}})
    out[NUM_SMS] = CHECKED_NUM_SMS
    return out


def ratio(v: Variant, case: Case, num: Expr, den: Expr) -> tuple | None:
    """(n, b) of a split for one case, or None when they do not evaluate to positive ints."""
    at = env(v, case)
    if at is None:
        return None
    try:
        a, b = num.eval(at), den.eval(at)
    except (ExprError, NotEvaluable):
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)) or b < 1 or a < 1:
        return None
    return a, b


def _has(prop: str, n: int, b: int) -> bool:
    """Whether a split of n into steps of b has the property."""
    steps = -(-n // b)
    if prop == "ragged":
        return n % b != 0
    if prop == "persistent":
        return b >= 2 and n % b != 0  # b tiles per program: more tiles than programs, a short last share
    if prop == "smallest":
        return n < b  # less than one step: a lone partial block
    return steps == int(prop.removeprefix("steps"))


def _props(split: Split, exhaustive: bool) -> tuple:
    if split.persistent:
        return ("persistent",)
    return ("ragged",) + tuple(f"steps{s}" for s in STEPS) + (("smallest",) if exhaustive else ())


def _values(prop: str, split: Split, dim: str, n0: int, b: int, d0: int) -> list:
    """Values of `dim` to try for a property, nearest the closed form first. `n0`, `b`: the split
    at the base case, whose `dim` is `d0`."""
    if isinstance(split.num.tree, ast.Name) and split.num.tree.id == dim:
        half = max(b // 2, 1)
        wanted = {
            "ragged": [b + half, half, 2 * b + half, b + 1],
            "smallest": [1, 2, half],
            "persistent": [],
        }.get(prop) or [int(prop.removeprefix("steps")) * b]
        return [x for x in dict.fromkeys(wanted) if x >= 1]
    step = max(d0 // max(n0 // b, 1), 1) if prop != "persistent" else d0
    return [step * k for k in range(1, SCAN + 1)]


def _covered(spec: KernelSpec, v: Variant, split: Split, prop: str, cases: list) -> bool:
    for c in cases:
        if runs(spec, v, c):
            r = ratio(v, c, split.num, split.den)
            if r is not None and _has(prop, *r):
                return True
    return False


def derive(spec: KernelSpec, fits: Callable[[Case], bool], exhaustive: bool = False) -> list:
    """The derived cases of a spec, in a fixed order. By default only those that add a property no
    declared case (nor an earlier derived one) has on a backend that splits the same way;
    `exhaustive`: one per split and property where one can be made (unless an earlier derived
    case has it), whatever the declared cases cover, and the smallest extent of each split too. `fits(case)`: whether the case meets the spec's
    constraints and hardware rules (a candidate that does not is dropped)."""
    if not spec.cases or spec.kind not in ("pallas_call", "mesh"):
        return []
    bases = sorted(spec.cases, key=lambda c: c.size)  # the smallest declared case first: derived cases stay small
    users: dict = {}  # (numerator, denominator) -> [(variant, split)], the backends that split so
    for v in spec.variants.values():
        for split in splits(spec, v):
            users.setdefault((split.num.source, split.den.source), []).append((v, split))
    out: list = []
    seen: dict = {}  # dims -> Derived
    left = [MAX_CHECKED]
    for group in list(users.values())[:MAX_SPLITS]:
        for prop in _props(group[0][1], exhaustive):
            shared = True  # the property's first case runs on every backend; one more for a backend it misses, there only
            for v, split in group:
                made = [d.case for d in out]
                known = made if exhaustive else list(spec.cases) + made
                if _covered(spec, v, split, prop, known):
                    shared = False
                    continue
                found = _make(spec, v, split, prop, bases, fits, seen, left)
                if found is None:
                    continue
                if not shared:
                    found = dataclasses.replace(found, case=dataclasses.replace(found.case, backends=(v.backend,)))
                shared = False
                seen[tuple(sorted(found.case.dims.items()))] = found
                out.append(found)
    return out


def _make(spec: KernelSpec, v: Variant, split: Split, prop: str, bases: list, fits, seen: dict,
          left: list) -> Derived | None:
    """A case with the property on this backend, made from the first base case that gives one, or
    None. `left`, a one-item list: the candidates the spec may still check (shared)."""
    tries = 0
    for base in (c for c in bases if runs(spec, v, c)):
        r = ratio(v, base, split.num, split.den)
        if r is None:
            continue
        for dim in sorted(d for d in spec.dims if d in split.num.names):
            for value in _values(prop, split, dim, r[0], r[1], base.dims[dim]):
                if value == base.dims[dim]:
                    continue
                dims = {**base.dims, dim: value}
                if tuple(sorted(dims.items())) in seen:
                    continue
                candidate = dataclasses.replace(base, dims=dims)
                got = ratio(v, candidate, split.num, split.den)
                if got is None or not _has(prop, *got) or not runs(spec, v, candidate):
                    continue
                if left[0] <= 0:
                    return None
                tries += 1
                left[0] -= 1
                if fits(candidate):
                    name = _name(spec, prop, dim, seen)
                    backends = candidate.backends
                    if prop == "persistent":
                        backends = tuple(b for b in backends or spec.backends if b in GPU_BACKENDS)
                    return Derived(dataclasses.replace(candidate, name=name, backends=backends), base.name, dim, prop)
                if tries >= MAX_FITS:
                    return None
    return None


def _name(spec: KernelSpec, prop: str, dim: str, seen: dict) -> str:
    taken = {c.name for c in spec.cases} | {d.case.name for d in seen.values()}
    name = PREFIX + (prop if prop == "persistent" else f"{prop}_{dim}")
    if name not in taken:
        return name
    return next(f"{name}_{k}" for k in range(2, len(taken) + 3) if f"{name}_{k}" not in taken)
