"""A spec's variant evaluated for one case: the `Instance` the per-case checks, the
backend hardware rules, tune and verify read, with the bounds and coverage walk of its
index maps. Nothing here traces JAX or runs spec code.
"""

from __future__ import annotations

import dataclasses
import itertools

from kspec.codegen.checks import mesh as _mesh
from kspec.codegen.diagnostics import Diagnostic
from kspec.codegen.spec.expr import Expr, ExprError, NotEvaluable, Slice
from kspec.codegen.spec.model import BLOCKED, BOUNDED, ELEMENT, SQUEEZED, Case, KernelSpec, Role, SpecKind, Variant

MAX_GRID_POINTS = 1 << 14  # a full grid walk per case x backend at most this long
MAX_SPEC_GRID_POINTS = 1 << 15  # index map evaluations by full walks, shared by all of a spec's cases
MAX_DTYPE_COMBINATIONS = 256  # dtype combinations one case may run
INT32_MAX = (1 << 31) - 1  # Pallas program ids are int32


@dataclasses.dataclass(frozen=True)
class Instance:
    """One variant of a spec with every expression evaluated for one case."""

    spec: KernelSpec
    variant: Variant
    case: Case
    env: dict  # dims and params
    shapes: dict  # operand -> tuple of ints
    dtypes: dict  # operand -> dtype name
    grid: tuple
    block_shapes: dict  # operand -> tuple of int | None (squeezed)
    scratch_shapes: dict  # scratch name -> tuple of ints
    mesh: dict = dataclasses.field(default_factory=dict)  # mesh kernels: mesh axis -> size
    pipes: dict = dataclasses.field(default_factory=dict)  # mesh kernels: pipeline -> mesh.PipeInstance


def _dtype_choices(spec: KernelSpec, case: Case) -> list:
    """[(input, the dtypes the case runs it with)] for each input with a dtype of its own."""
    choices = []
    for op in (o for o in spec.inputs if o.follows is None):
        if isinstance(case.dtype, dict) and op.name in case.dtype:
            choices.append((op.name, (case.dtype[op.name],)))
        elif isinstance(case.dtype, str) and case.dtype in op.dtypes:
            choices.append((op.name, (case.dtype,)))
        else:
            choices.append((op.name, tuple(op.dtypes)))
    return choices


def dtype_combinations(spec: KernelSpec, case: Case) -> int:
    """How many dtype combinations the case runs (without listing them)."""
    total = 1
    for _, options in _dtype_choices(spec, case):
        total *= len(options)
    return total


def completed(spec: KernelSpec, assign: dict) -> dict:
    """`assign` (the dtypes of the inputs with a choice) with every other operand's dtype added."""
    assign = dict(assign)
    for op in spec.operands + spec.kernel_only:  # kernel operands: a fixed dtype or an input's
        if op.follows is not None:
            assign[op.name] = assign[op.follows]
        elif op.dtype_map is not None:
            assign[op.name] = op.dtype_map.of(assign[op.dtype_map.source])
        elif op.role == Role.OUTPUT or op.kernel:
            assign[op.name] = op.dtypes[0]
    return assign


class DtypeAssignments:
    """Every operand's dtype, for each dtype combination the case runs: a lazy sequence
    (len, indexing and iteration build one assignment at a time, never the whole list)."""

    def __init__(self, spec: KernelSpec, case: Case):
        self.spec = spec
        self.choices = _dtype_choices(spec, case)
        self.count = 1
        for _, options in self.choices:
            self.count *= len(options)

    def _assign(self, combo) -> dict:
        return completed(self.spec, dict(zip((name for name, _ in self.choices), combo)))

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self):
        if self.count > MAX_DTYPE_COMBINATIONS:  # check() reports E507 first: callers only see checked specs
            raise ValueError(f"{self.count} dtype combinations; at most {MAX_DTYPE_COMBINATIONS} are run (E507)")
        return map(self._assign, itertools.product(*(options for _, options in self.choices)))

    def __getitem__(self, index: int) -> dict:
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError("dtype assignment index out of range")
        combo = []
        for _, options in reversed(self.choices):  # the last input varies fastest, as in product()
            index, k = divmod(index, len(options))
            combo.append(options[k])
        return self._assign(reversed(combo))


def dtype_assignments(spec: KernelSpec, case: Case) -> DtypeAssignments:
    """Every operand's dtype, for each dtype combination the case runs (lazily; see E507)."""
    return DtypeAssignments(spec, case)


def unmet(variant: Variant, case: Case) -> str | None:
    """Why the backend's own constraints rule this case out (None: they hold, or cannot be
    evaluated here; instantiate reports what is wrong with the case itself); or that the case
    runs only on other backends (its `backends`)."""
    if case.backends and variant.backend not in case.backends:
        return f"case `{case.name}` runs only on {', '.join(case.backends)}"
    env = dict(case.dims)
    try:
        env.update({p.name: p.default_at(case.dims) for p in variant.params})
    except (ExprError, NotEvaluable):
        return None
    env.update({k: val for k, val in case.params.items() if k in env})
    for c in variant.constraints:
        try:
            ok = c.expr.eval(env)
        except (ExprError, NotEvaluable):
            continue
        if ok is False:
            values = ", ".join(f"{n}={env[n]}" for n in sorted(c.expr.names) if n in env)
            return f"{variant.backend} needs {c.message or '`' + c.expr.shown + '`'} ({values})"
    return None


def instantiate(spec: KernelSpec, v: Variant, case: Case, dtypes: dict, budget: list | None = None) -> tuple:
    """Evaluate a variant for one case: (Instance or None, diagnostics). `budget`, a
    one-item list, is the number of index map evaluations full grid walks may still spend
    (shared across calls; see MAX_SPEC_GRID_POINTS); None: no limit but MAX_GRID_POINTS."""
    env = dict(v.param_defaults)
    env.update(case.dims)
    env.update(spec.mesh_sizes)  # a mesh-only spec's output shapes may read its mesh axis sizes
    out: list = []
    for p in v.params:  # expression defaults: over the case's dims
        if p.name not in env and p.name not in case.params:
            try:
                env[p.name] = p.default_at(case.dims)
            except ExprError as err:
                out.append(Diagnostic(err.code, f"case `{case.name}`: default of param `{p.name}`: {err.message}",
                                      p.default.loc))
    env.update({k: val for k, val in case.params.items() if k in {p.name for p in v.params}})
    if out:
        return None, out

    def ev(e: Expr, what: str, scope: dict | None = None):
        try:
            return e.eval(env if scope is None else scope)
        except ExprError as err:
            out.append(Diagnostic(err.code, f"case `{case.name}`: {what}: {err.message}", e.loc))
        except NotEvaluable:
            return None
        return None

    def size(e: Expr, what: str, scope: dict | None = None):
        """A grid, block or scratch size: it must evaluate to an int."""
        value = ev(e, what, scope)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            out.append(
                Diagnostic("E303", f"case `{case.name}`: {what}: `{e.source}` is {value!r}, not an integer", e.loc)
            )
            return None
        return value

    for c in spec.constraints:
        ok = ev(c.expr, "constraint")
        if ok is False:
            shown = c.message or f"`{c.expr.source}` does not hold"
            values = ", ".join(f"{n}={env[n]}" for n in sorted(c.expr.names) if n in env)
            out.append(Diagnostic("E501", f"case `{case.name}` ({values}): {shown}", case.loc, f"constraint at line {c.loc.line}"))
    shapes = {}
    for op in spec.operands:
        shape = tuple(ev(e, f"{op.name}.shape") for e in op.shape)
        if any(not isinstance(s, int) or isinstance(s, bool) for s in shape):
            if not out:
                out.append(Diagnostic("E506", f"case `{case.name}`: {op.name} shape is not all integers: {shape}", op.loc))
            continue
        if any(s < 1 for s in shape):
            out.append(Diagnostic("E506", f"case `{case.name}`: {op.name} has shape {shape}", op.loc, "every dim must be at least 1"))
        shapes[op.name] = shape
    # a grid extent read from a prefetched scalar is proved at its bound, the most it can be
    scalars = {name: ev(bound, f"{name}.max") for name, bound in spec.grid_scalars.items()}
    grid = tuple(size(a.size, "grid", dict(env, **scalars)) for a in v.grid)
    for i, (axis, n) in enumerate(zip(v.grid, grid)):
        if isinstance(n, int) and n < 1:
            label = axis.name or f"axis {i}"
            out.append(Diagnostic("E505", f"case `{case.name}`: grid {label} has size {n}", axis.size.loc))
        elif isinstance(n, int) and n > INT32_MAX:
            label = axis.name or f"axis {i}"
            out.append(
                Diagnostic(
                    "E508",
                    f"case `{case.name}`: grid {label} has size {n}, more than int32 holds ({INT32_MAX})",
                    axis.size.loc,
                    "Pallas program ids are int32: use bigger blocks or split the axis into several",
                )
            )
    blocks = {}
    for op in spec.operands:
        b = v.blocks.get(op.name)
        if b is None or b.block_shape is None:
            blocks[op.name] = shapes.get(op.name)
            continue
        blocks[op.name] = tuple(None if e is None else size(e, f"{op.name}.block_shape") for e in b.block_shape)
        for e, n in zip(b.block_shape, blocks[op.name]):
            if e is not None and isinstance(n, int) and n < 1:
                out.append(Diagnostic("E506", f"case `{case.name}`: {op.name} block dim is {n}", e.loc))
    scratch = {s.name: tuple(size(e, f"scratch {s.name}") for e in s.shape) for s in v.scratch}
    mesh, pipes = {}, {}
    if spec.kind == SpecKind.MESH:
        mesh, pipes = _mesh.instantiate(spec, v, case, env, size)
        for name, n in mesh.items():
            axis = next(a for a in v.mesh if a.name == name)
            if isinstance(n, int) and n < 1:
                out.append(Diagnostic("E505", f"case `{case.name}`: mesh {axis.role} {name} has size {n}", axis.size.loc))
        evaluated = list(mesh.values()) + [x for p in pipes.values() for x in (*p.grid, p.buffers)]
        evaluated += [x for p in pipes.values() for shapes in (p.views, p.blocks) for t in shapes.values() for x in t]
        if None in evaluated:
            return None, out
    if out:
        return None, out
    inst = Instance(spec, v, case, env, shapes, dtypes, grid, blocks, scratch, mesh, pipes)
    if spec.kind == SpecKind.MESH:
        return inst, _mesh.bounds_and_coverage(inst, lambda g: grid_points(g, budget), walk_block)
    return inst, _bounds_and_coverage(inst, budget)


def grid_points(grid: tuple, budget: list | None = None, cost: int = 1):
    """Every grid point, or a boundary sample per axis when there are too many, or when
    the full walk (`cost` evaluations per point) would overspend `budget` (see instantiate)."""
    total = 1
    for n in grid:
        total *= n
    if total <= MAX_GRID_POINTS and (budget is None or total * cost <= budget[0]):
        if budget is not None:
            budget[0] -= total * cost
        return itertools.product(*(range(n) for n in grid)), True
    sample = [sorted({x for x in (0, 1, n // 2, n - 2, n - 1) if 0 <= x < n}) for n in grid]
    return itertools.product(*sample), False


class _Filled:
    """A scalar-prefetch array as the bounds check sees it: every entry one value of its range."""

    def __init__(self, shape: tuple, value: int):
        self.shape, self.value = shape, value

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> int:
        return self.value


def _prefetch_fills(inst: Instance) -> list:
    """[(env additions, label)]: the prefetch refs all at the low end of their range, then all at the high end."""
    low, high = {}, {}
    for op in inst.spec.prefetched:
        init = op.init
        if init is None or init.kind != "index":
            return [({}, "")]  # E410 reported it; the refs stay unknown (NotEvaluable)
        try:  # a range that reads other inputs' values is known only when verify makes them
            bound = init.bound(inst.env, inst.shapes)
            least = init.low_expr.eval(inst.env) if init.low_expr is not None else 0
        except (ExprError, NotEvaluable, KeyError, IndexError):
            return [({}, "")]
        shape = inst.shapes[op.name]
        low[op.name], high[op.name] = _Filled(shape, least), _Filled(shape, max(bound - 1, least))
    if not low:
        return [({}, "")]
    shown = lambda fill: ", ".join(f"{k}[...] = {f.value}" for k, f in fill.items())
    return [(low, f" with {shown(low)}"), (high, f" with {shown(high)}")]


def _prefetch_args(inst: Instance, block) -> dict:
    """The index map's scalar-prefetch parameters, by position after the grid indices: {arg name: input}."""
    extra = block.index_map.args[len(inst.grid):]
    return dict(zip(extra, (o.name for o in inst.spec.prefetched)))


def _reads_prefetch(inst: Instance, block) -> bool:
    """Whether the index map's result depends on the scalar-prefetch refs: it reads one of the
    parameters they are passed as (or a prefetched input by name)."""
    imap = block.index_map
    read = frozenset().union(*(r.names for r in imap.results))
    return bool(read & set(_prefetch_args(inst, block)) or imap.names & {o.name for o in inst.spec.prefetched})


def _bind_fill(fill: dict, label: str, args: dict) -> tuple:
    """A fill keyed by the index map's own parameter names, and its label in those names."""
    bound = {arg: fill[name] for arg, name in args.items() if name in fill}
    if not bound:
        return fill, label
    return bound, " with " + ", ".join(f"{arg}[...] = {f.value}" for arg, f in bound.items())


def _bounds_and_coverage(inst: Instance, budget: list | None = None) -> list:
    out = []
    v, case = inst.variant, inst.case
    all_fills = _prefetch_fills(inst)
    for op in inst.spec.operands:
        block = v.blocks.get(op.name)
        if block is None or block.index_map is None:
            continue
        shape, bshape = inst.shapes[op.name], inst.block_shapes[op.name]
        # a map that reads the prefetch refs is evaluated at each fill, its parameters bound by
        # position; one that ignores them gives the same blocks whatever they hold
        reads = _reads_prefetch(inst, block)
        fills = [_bind_fill(fill, label, _prefetch_args(inst, block)) for fill, label in all_fills] if reads else [({}, "")]
        points, exhaustive = grid_points(inst.grid, budget, len(fills))
        exhaustive = exhaustive and not reads
        exhaustive_kinds = all(block.kind(d) in (BLOCKED, SQUEEZED) for d in range(len(bshape)))
        exhaustive = exhaustive and exhaustive_kinds
        found, visited, walked = walk_block(inst.env, case.name, op.name, block, shape, bshape, points, fills,
                                            "grid point", op.name)
        out += found
        reported = bool(found)
        exhaustive = exhaustive and walked
        if op.role == Role.OUTPUT and exhaustive and not reported:
            out += _coverage(inst, op, block, visited)
    return out


def walk_block(env: dict, case: str, name: str, block, shape: tuple, bshape: tuple, points, fills: list,
               point_word: str, owner: str) -> tuple:
    """Evaluate a block's index map at every point (x prefetch fill): (the first E502 or
    expression error, the block indices visited in bounds, whether every point evaluated)."""
    visited, out = set(), []
    exhaustive_kinds = all(block.kind(d) in (BLOCKED, SQUEEZED) for d in range(len(bshape)))
    for point, (fill, label) in itertools.product(points, fills):
        at = dict(env, **fill)
        at.update(zip(block.index_map.args, point))
        try:
            idx = block.index_map.eval(at)
        except NotEvaluable:
            return out, visited, False
        except ExprError as err:
            out.append(Diagnostic(err.code, f"case `{case}`: {name}.index_map: {err.message}", block.index_map.loc))
            return out, visited, False
        bad = _out_of_bounds(idx, shape, bshape, block)
        if bad is None:
            visited.add(idx)
        elif not out:
            d, what, hint = bad
            out.append(
                Diagnostic(
                    "E502",
                    f"case `{case}`: {name}.index_map at {point_word} {point}{label} gives "
                    f"{'block index ' if exhaustive_kinds else ''}{_shown(idx)}; dim {d} {what}",
                    block.index_map.loc,
                    f"{owner} dim {d} {hint}",
                )
            )
    return out, visited, True


def _shown(idx: tuple) -> str:
    parts = [f"ds({i.start}, {i.size})" if isinstance(i, Slice) else repr(i) for i in idx]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _out_of_bounds(idx, shape, bshape, block):
    """(dim, what is wrong, hint) for the first dim of an index map result out of bounds, or None."""
    for d, (i, n, b) in enumerate(zip(idx, shape, bshape)):
        kind = block.kind(d)
        if kind == BOUNDED:
            if not isinstance(i, Slice):
                return d, f"is {i!r}, not ds(start, size)", f"is a bounded_slice of at most {b}: return ds(start, size)"
            if i.start < 0 or not 1 <= i.size <= b or i.start + i.size > n:
                return d, f"is ds({i.start}, {i.size}), valid start >= 0, size 1..{b}, start + size <= {n}", f"has {n} elements in slices of at most {b}"
            continue
        if isinstance(i, bool) or not isinstance(i, int):
            return d, f"is {i!r}, not an integer", "takes an integer (ds(...) only for bounded_slice dims)"
        if kind == ELEMENT:
            lo, hi = block.padding[d]
            last = n + lo + hi - b
            if not 0 <= i <= last:
                pad = f" (+ padding {lo}, {hi})" if lo or hi else ""
                return d, f"is element offset {i}, valid 0..{last}", f"has {n} elements{pad} in windows of {b}"
            continue
        count = n if b is None else -(-n // b)
        if not 0 <= i < count:
            return d, f"is {i}, valid 0..{count - 1}", f"has {n} elements in blocks of {b or 1}"
    return None


def _coverage(inst: Instance, op, block, visited: set) -> list:
    shape, bshape = inst.shapes[op.name], inst.block_shapes[op.name]
    counts = [n if b is None else -(-n // b) for n, b in zip(shape, bshape)]
    needed = 1
    for c in counts:
        needed *= c
    if len(visited) >= needed:
        return []
    missing = next(t for t in itertools.product(*(range(c) for c in counts)) if t not in visited)
    ranges = ", ".join(
        f"{i}" if b is None else f"{i * b}:{min((i + 1) * b, n)}" for i, n, b in zip(missing, shape, bshape)
    )
    return [
        Diagnostic(
            "E503",
            f"case `{inst.case.name}`: output {op.name} is not fully written: "
            f"block {missing} (elements [{ranges}]) is never visited by the grid",
            block.loc,
            "make the grid and index_map reach every block of the output",
        )
    ]
