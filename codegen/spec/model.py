"""Stage 3: schema-valid data -> the kernel model, frozen dataclasses with locations.

Expressions are parsed here (never evaluated); a syntax error in any of them is a
located diagnostic, and all of them are reported together.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import itertools
import math
import textwrap
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kspec.codegen.spec import sharding as _sharding
from kspec.codegen.spec import tuning
from kspec.codegen.spec import vjp as _vjp
from kspec.codegen.diagnostics import Diagnostic, Location, SpecError
from kspec.codegen.spec.expr import Expr, ExprError, IndexMap, parse_expr, parse_index_map
from kspec.codegen.spec.loader import Document


# The closed sets of names a spec chooses from (schema/kspec.schema.json lists the same values).
# Each member is its YAML string: it compares equal to it and prints as it.


class SpecKind(enum.StrEnum):
    """What the spec builds (`kind:`): one pallas_call, or a kernel over a mesh of its own."""

    PALLAS_CALL = "pallas_call"
    MESH = "mesh"


class Role(enum.StrEnum):
    """Which side of the kernel an operand is on."""

    INPUT = "input"
    OUTPUT = "output"


class MemorySpace(enum.StrEnum):
    """Where a block or a scratch buffer lives (`memory_space:`)."""

    ANY = "any"
    HBM = "hbm"
    VMEM = "vmem"
    SMEM = "smem"
    GMEM = "gmem"


class ScratchKind(enum.StrEnum):
    """What a scratch entry is (`kind:`)."""

    ARRAY = "array"
    DMA_SEMAPHORE = "dma_semaphore"
    SEMAPHORE = "semaphore"
    BARRIER = "barrier"
    ACCUMULATOR = "accumulator"


class MeshRole(enum.StrEnum):
    """What a mesh kernel's mesh axis spans (`mesh:`), in the order the axes are built."""

    GRID = "grid"
    CLUSTER = "cluster"
    THREADS = "threads"
    CORES = "cores"


class PipeRole(enum.StrEnum):
    """Which side of an emit_pipeline stage an operand is on (`pipelines: {in, out}`)."""

    IN = "in"
    OUT = "out"


class DimKind(enum.StrEnum):
    """How a block_shape entry cuts its dim."""

    BLOCKED = "blocked"
    SQUEEZED = "squeezed"
    ELEMENT = "element"
    BOUNDED = "bounded_slice"


class InitKind(enum.StrEnum):
    """The data verify fills an input with (`init: {kind}`)."""

    NORMAL = "normal"
    UNIFORM = "uniform"
    POSITIVE = "positive"
    INDEX = "index"
    ONES = "ones"
    ZEROS = "zeros"


@dataclasses.dataclass(frozen=True)
class Code:
    """Python source from the spec, with where its first character sits in the YAML."""

    source: str
    origin: Location
    block_indent: int | None  # literal/folded block scalars: the content's indent

    def _tree(self) -> ast.Module | None:
        """The code parsed (never run); None when it does not parse, which check reports (E600)."""
        try:
            return ast.parse(self.source)
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            return None

    @property
    def names(self) -> frozenset:
        """The names the code reads or binds; none when it does not parse."""
        tree = self._tree()
        return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)) if tree else frozenset()

    @property
    def none_tested(self) -> frozenset:
        """The names the code compares with None (`x is None`, `x is not None`)."""
        tree = self._tree()
        return frozenset(
            n.left.id for n in ast.walk(tree)
            if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and len(n.ops) == 1
            and isinstance(n.ops[0], (ast.Is, ast.IsNot))
            and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value is None
        ) if tree else frozenset()

    @property
    def expression(self) -> bool:
        """Whether the code is one expression (which init code may be, for its value)."""
        tree = self._tree()
        return tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr)

    @property
    def returning(self) -> str:
        """The code as a function body: an expression returned, any other code as it is."""
        if not self.expression:
            return self.source
        text = self.source.strip()
        return f"return {text}" if "\n" not in text else "return (\n" + textwrap.indent(text, "    ") + "\n)"

    def loc_of(self, line: int, col: int) -> Location:
        """Location of 1-based `line`, 0-based `col` within the source."""
        if self.block_indent is not None:
            return Location(self.origin.path, self.origin.line + line, self.block_indent + col + 1)
        if line == 1:
            return Location(self.origin.path, self.origin.line, self.origin.col + col)
        return Location(self.origin.path, self.origin.line + line - 1, col + 1)


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    default: Any  # a number or bool, or an Expr over the dims (evaluated per call)
    choices: tuple | None
    doc: str
    loc: Location

    @property
    def resolved(self) -> bool:
        """Whether a call resolves it from its dims (tuned table, dims-aware default) rather than
        taking a constant default: it has choices to tune, or its default is an expression."""
        return bool(self.choices) or isinstance(self.default, Expr)

    def default_at(self, dims: Mapping):
        """The default for these dims (`dims`: name -> int; an expression default needs them all)."""
        return self.default.eval(dims) if isinstance(self.default, Expr) else self.default


@dataclasses.dataclass(frozen=True)
class Init:
    """How verify fills an input with test data (`init:`): a `kind` (`index` gives integers in
    [low, bound)), or `code` (plain JAX over `key`, the dims and params), or `same_as` (a copy of
    another input). `low` and `bound` of an index initialiser may read other inputs' values."""

    kind: InitKind | None  # None: `code` or `same_as` says what the data is
    low: float = 0.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0
    of: str | None = None  # index: the operand indexed into ...
    dim: int = 0  # ... along this dim
    bound_expr: Expr | None = None  # index: or this exclusive bound
    loc: Location | None = None
    low_expr: Expr | None = None  # index: the inclusive lower bound (default 0)
    code: Code | None = None  # the data, computed by this function body (or expression)
    same_as: str | None = None  # the data, that of this other input
    keys: tuple = ()  # the keys the spec writes, in its order

    def bound(self, env: Mapping[str, Any], shapes: Mapping[str, tuple]) -> int:
        """The exclusive upper bound of an `index` initialiser for one case."""
        if self.bound_expr is not None:
            return self.bound_expr.eval(env)
        return shapes[self.of][self.dim]

    @property
    def structured(self) -> bool:
        """Whether the data is made by code or copied from another input (not drawn by a kind)."""
        return self.code is not None or self.same_as is not None

    def reads(self, inputs: Collection[str], code: bool = True) -> tuple:
        """The inputs among `inputs` whose values this initialiser needs first, sorted; with
        `code=False`, only those it keeps a structure with (`same_as`, an index's `low` and `bound`),
        not those its code computes from."""
        names = {self.same_as} if self.same_as else set()
        for e in (self.low_expr, self.bound_expr):
            names |= set(e.names) if e is not None else set()
        if code and self.code is not None:
            names |= set(self.code.names)
        return tuple(sorted(names & set(inputs)))

    def code_args(self, scope: Sequence[str]) -> tuple:
        """The arguments of the `code` function after `key`: the names of `scope` (dims, then
        params) that the code reads, in that order."""
        read = self.code.names if self.code is not None else frozenset()
        return tuple(n for n in scope if n in read)


@dataclasses.dataclass(frozen=True)
class DtypeMap:
    """`dtype: {from: x, map: {int8: int32, bfloat16: float32}}`: the dtype of an output or a
    scratch buffer, looked up by the dtype input x has in a call (an int8 matmul's int32
    accumulator)."""

    source: str  # the input whose dtype is looked up
    table: tuple  # ((input dtype, dtype), ...), in the spec's order

    def of(self, dtype: str) -> str | None:
        """The dtype for input dtype `dtype`; None when the map has no entry for it."""
        return dict(self.table).get(dtype)

    @property
    def targets(self) -> tuple:
        """The dtypes the map can give, each once, in the spec's order."""
        return tuple(dict.fromkeys(to for _, to in self.table))


@dataclasses.dataclass(frozen=True)
class Operand:
    name: str
    role: Role
    shape: tuple  # of Expr
    dtypes: tuple | None  # allowed dtype names, or None when it follows another operand
    follows: str | None  # the input whose dtype this operand shares
    doc: str
    loc: Location
    dtype_loc: Location
    init: Init | None = None
    prefetch: bool = False  # scalar prefetch: passed first, whole, in SMEM
    kinds: tuple | None = None  # the input kinds verify may run it with (codegen/run/kinds.py); None: by its dtype
    kinds_loc: Location | None = None
    residual: bool = False  # an output written for the backward pass only: not returned, no gradient
    residual_loc: Location | None = None
    kernel: bool = False  # a kernel operand of `kernel:`, made by the prologue or read by the epilogue
    optional: bool = False  # an input the function may be called without (None)
    dtype_map: DtypeMap | None = None  # outputs: the dtype looked up from an input's (dtypes: its targets)
    max: Expr | None = None  # a scalar-prefetch grid extent: the static bound of its value

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def given_flag(self) -> str:
        """An optional input's static boolean in the body: whether the call gave it."""
        return f"has_{self.name}"


BLOCKED, SQUEEZED, ELEMENT, BOUNDED = DimKind.BLOCKED, DimKind.SQUEEZED, DimKind.ELEMENT, DimKind.BOUNDED


@dataclasses.dataclass(frozen=True)
class Block:
    operand: str
    block_shape: tuple | None  # of Expr (the size, whatever the kind), or None for a squeezed dim; None: whole array
    index_map: IndexMap | None  # None with block_shape None
    loc: Location
    shape_loc: Location
    # Mosaic GPU only: the block's shared-memory layout and release delay (plgpu.BlockSpec)
    tiling: tuple = ()  # of int; () for no TilingTransform
    swizzle: int | None = None
    delay_release: int = 0
    kinds: tuple = ()  # of DimKind, per dim
    padding: tuple = ()  # per dim: (low, high) of an ELEMENT dim, else (0, 0)
    memory_space: MemorySpace | None = None  # None: the backend's default
    buffers: int | None = None  # pipeline_mode: pl.Buffered(buffers)
    masked: bool = False  # the body loads and stores it masked: on triton its dims need not be powers of two
    sliced: bool = False  # the body takes only power-of-two slices of it: on triton its dims need not be powers of two
    collective_axes: tuple = ()  # Mosaic GPU pipeline inputs: the cluster axis a copy is multicast along

    def kind(self, d: int) -> DimKind:
        return self.kinds[d] if self.kinds else (SQUEEZED if self.block_shape[d] is None else BLOCKED)


@dataclasses.dataclass(frozen=True)
class GridAxis:
    """One grid axis. A named axis's index reaches the kernel body as a keyword argument."""

    name: str | None
    size: Expr
    loc: Location | None = None


@dataclasses.dataclass(frozen=True)
class Scratch:
    name: str
    shape: tuple  # of Expr
    dtype: str | None
    memory_space: MemorySpace
    kind: ScratchKind
    num_arrivals: int
    loc: Location
    tiling: tuple = ()  # Mosaic GPU SMEM arrays: plgpu.TilingTransform
    swizzle: int | None = None  # ... then plgpu.SwizzleTransform
    collective_axes: tuple = ()  # Mosaic GPU barriers: a cluster axis, for a plgpu.ClusterBarrier
    dtype_map: DtypeMap | None = None  # the dtype looked up from an input's (dtype is then None)
    init: int | float | bool | None = None  # smem arrays: every element set to it before the body runs

    def dtype_in(self, assign: Mapping) -> str | None:
        """The buffer's dtype in a call whose operands have the dtypes `assign` (name -> dtype)."""
        if self.dtype_map is not None:
            return self.dtype_map.of(assign.get(self.dtype_map.source))
        return assign.get(self.dtype, self.dtype)


@dataclasses.dataclass(frozen=True)
class MeshAxis:
    """One axis of a mesh kernel's mesh; its index reaches the body as `name`."""

    name: str
    role: MeshRole
    size: Expr
    loc: Location


@dataclasses.dataclass(frozen=True)
class PipeBlock:
    """One operand of an emit_pipeline stage: its view, block and index map."""

    operand: str
    role: PipeRole
    view: tuple | None  # of Expr; None: the operand's whole shape
    block: Block  # block_shape and index_map over the pipeline's grid


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """An emit_pipeline stage of a mesh kernel (`pipelines:`)."""

    name: str
    grid: tuple  # of GridAxis
    blocks: tuple  # of PipeBlock, inputs first
    buffers: Expr | None
    compute_wgs: int | None  # warp-specialized: warpgroups that compute
    memory_registers: int | None
    loc: Location


@dataclasses.dataclass(frozen=True)
class Constraint:
    expr: Expr
    message: str | None
    loc: Location


@dataclasses.dataclass(frozen=True)
class Cost:
    """pl.CostEstimate as expressions; bytes_accessed None means: derive from the operands."""

    flops: Expr | None
    transcendentals: Expr | None
    bytes_accessed: Expr | None


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """pallas_call's name, metadata and debug options (`pallas_call:`)."""

    name: str | None = None
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    debug: bool = False


@dataclasses.dataclass(frozen=True)
class Variant:
    """The kernel as one backend sees it, after that backend's overrides."""

    backend: str
    grid: tuple  # of GridAxis
    blocks: Mapping[str, Block]
    params: tuple  # of Param
    scratch: tuple  # of Scratch
    body: Code
    compiler_params: Mapping[str, Any]
    loc: Location
    dtypes: Mapping[str, tuple] = dataclasses.field(default_factory=dict)  # input -> allowed
    mesh: tuple = ()  # of MeshAxis (mesh kernels)
    pipelines: tuple = ()  # of Pipeline (mesh kernels)
    refs: Mapping[str, MemorySpace] = dataclasses.field(default_factory=dict)  # operand -> where (mesh kernels)
    mesh_loc: Location | None = None
    constraints: tuple = ()  # of Constraint: what this backend needs of dims and params
    # Bytes of shared memory a program needs (Triton), over dims, params and itemsize(x): the
    # author's estimate, which check, tune and the dispatcher hold to the GPU's limit.
    shared_memory: Expr | None = None

    def mesh_axes(self, role: MeshRole) -> tuple:
        return tuple(a for a in self.mesh if a.role == role)

    def leaves_out(self, output) -> bool:
        """Whether a mesh kernel's body is ready to find None for this residual output's ref (it
        compares the ref with None), so that a call without residuals=True leaves the output out."""
        return output.residual and f"{output.name}_ref" in self.body.none_tested

    def supports(self, assignment: Mapping[str, str]) -> bool:
        """Whether this backend takes a case's dtype assignment."""
        return all(assignment.get(name) in allowed for name, allowed in self.dtypes.items())

    @property
    def grid_names(self) -> tuple:
        """The names of the grid axes when the grid is a mapping; () when it is a list."""
        return tuple(a.name for a in self.grid) if all(a.name for a in self.grid) else ()

    @property
    def param_defaults(self) -> dict:
        """The constant defaults; a param whose default is an expression over dims is left out
        (see defaults_at)."""
        return {p.name: p.default for p in self.params if not isinstance(p.default, Expr)}

    def defaults_at(self, dims: Mapping) -> dict:
        """Every param's default for these dims (expression defaults evaluated over them)."""
        return {p.name: p.default_at(dims) for p in self.params}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    dims: Mapping[str, int]
    dtype: Any  # None, a dtype name, or {input: dtype}
    params: Mapping[str, Any]
    tolerance: Mapping[str, Mapping[str, float]]
    loc: Location
    min_speedup: Any = None  # bench: the least speedup to measure, or {device kind prefix: it}
    min_speedup_over: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # bench: {competitor: floor}
    min_speedup_over_locs: Mapping[str, Location] = dataclasses.field(default_factory=dict)  # competitor -> its key
    absent: tuple = ()  # the optional inputs this case leaves out (None)
    backends: tuple = ()  # the backends that run the case; () for all of the spec's

    @property
    def size(self) -> int:
        """The product of the case's dims (each at least 1): how large it is, to order or share out cases."""
        total = 1
        for n in self.dims.values():
            total *= max(int(n), 1)
        return total


MAX_FAMILY_SHAPES = 512  # shapes per family (E510): a sweep times each on every backend


@dataclasses.dataclass(frozen=True)
class Family:
    """A family of shapes (`families:`): what `kspec bench --sweep` and `tune --sweep` cover."""

    name: str
    doc: str
    cases: tuple  # of Case, one per shape (and dtype, when the family lists several)
    loc: Location


@dataclasses.dataclass(frozen=True)
class Competitor:
    """What a user would run instead of the kernel (`competitors:`): timed beside it by `kspec bench`."""

    name: str
    body: Code
    platforms: tuple  # jax platforms it runs on: cpu, gpu, tpu
    doc: str
    loc: Location
    requires: tuple = ()  # modules it needs that not every jax has: bench skips it where one is missing


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """Plain JAX around the kernel (`prologue:`, `epilogue:`) and the kernel's own operands
    (`kernel:`): the generated function runs prologue, pallas_call, epilogue."""

    prologue: Code | None
    epilogue: Code | None
    inputs: tuple  # of Operand: the pallas_call's inputs; () when they are the function's
    outputs: tuple  # of Operand: the pallas_call's outputs; () when they are the function's
    loc: Location


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    doc: str
    path: str
    sha256: str
    inputs: tuple  # of Operand
    outputs: tuple  # of Operand
    dims: tuple  # dim names, in order of first appearance in the inputs
    constraints: tuple
    reference: Code
    cases: tuple
    tolerance: Mapping[str, Mapping[str, float]]
    variants: Mapping[str, Variant]  # backend name -> variant, in the spec's order
    loc: Location
    bench: tuple = ()  # of Case: large shapes for bench and tune
    families: tuple = ()  # of Family: shape families for bench --sweep and tune --sweep
    cost: Cost | None = None
    kernel_sha: str = ""  # hash of what decides the generated code (see tuning.kernel_sha)
    reference_sha: str = ""  # hash of the reference (see tuning.reference_sha)
    sharding: _sharding.Sharding | None = None  # the `sharding:` section (codegen/spec/sharding.py)
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)  # output -> input it overwrites
    aliases_loc: Location | None = None
    call: CallOptions = CallOptions()
    kind: SpecKind = SpecKind.PALLAS_CALL
    kind_loc: Location | None = None
    vjp: _vjp.Vjp | None = None  # the `vjp:` section (codegen/spec/vjp.py)
    competitors: tuple = ()  # of Competitor
    reference_when_faster: bool = False  # dispatch.reference_when_faster
    wrapper: Wrapper | None = None  # prologue, epilogue and the kernel's own operands
    facade: tuple = ()  # kernel_view only: the function's inputs, whose dtypes kernel operands may share

    @property
    def kernel_view(self) -> KernelSpec:
        """The spec as its pallas_call sees it: the kernel's own inputs and outputs in place of the
        function's (dims and params stay the function's). The spec itself when it has no wrapper."""
        w = self.wrapper
        if w is None:
            return self
        return dataclasses.replace(self, inputs=w.inputs or self.inputs, outputs=w.outputs or self.outputs,
                                   wrapper=None, facade=self.inputs)

    @property
    def kernel_only(self) -> tuple:
        """The kernel operands that are not the function's own inputs or outputs."""
        return (self.wrapper.inputs + self.wrapper.outputs) if self.wrapper else ()

    @property
    def sweep(self) -> tuple:
        """Every case of every family, in order: what `--sweep` runs."""
        return tuple(c for f in self.families for c in f.cases)

    @property
    def mesh_sizes(self) -> dict:
        """{axis: size} of a mesh-only spec's sized mesh axes (`sharding:`): its output shapes,
        body and reference may read them, as the kernel runs per device."""
        sh = self.sharding
        if sh is None or not sh.mesh_only:
            return {}
        return {a.name: a.size for a in sh.mesh if a.size is not None}

    @property
    def grid_scalars(self) -> dict:
        """{name: bound Expr} of the scalar-prefetch inputs that a grid size may read (`max:`): the
        kernel's own, which a prologue makes, among them."""
        kernel_inputs = self.wrapper.inputs if self.wrapper is not None else ()
        return {o.name: o.max for o in self.inputs + kernel_inputs if o.prefetch and o.max is not None}

    @property
    def init_scope(self) -> tuple:
        """What an input's init code may read besides `key`, the other inputs and the imports of
        reference.py: the dims, the params of the spec's first backend (the reference's) and `dtype`,
        in that order."""
        return (*self.dims, *(p.name for p in next(iter(self.variants.values())).params), "dtype")

    def init_args(self, op) -> tuple:
        """The scope of input `op`'s init code after `key`: init_scope, then the other inputs."""
        return (*self.init_scope, *(o.name for o in self.inputs if o.name != op.name))

    @property
    def init_reads(self) -> dict:
        """{input: the inputs whose values its initialiser reads}, for the inputs that read any."""
        names = [o.name for o in self.inputs]
        return {o.name: read for o in self.inputs if o.init is not None and (read := o.init.reads(names))}

    @property
    def init_keeps(self) -> dict:
        """{input: the inputs its initialiser keeps a structure with}: those `same_as`, an index's `low`
        or `bound` read (not those init code computes from, which it computes again from any data)."""
        names = [o.name for o in self.inputs]
        return {o.name: kept for o in self.inputs if o.init is not None and (kept := o.init.reads(names, code=False))}

    @property
    def init_order(self) -> tuple:
        """The inputs in the order their data is made: each after the inputs its initialiser reads,
        else in declared order (the members of a cycle, which check refuses, come last)."""
        reads, done, order = self.init_reads, set(), []
        while len(order) < len(self.inputs):
            ready = [o for o in self.inputs if o.name not in done and set(reads.get(o.name, ())) <= done]
            ready = ready[:1] or [o for o in self.inputs if o.name not in done]
            order += ready
            done |= {o.name for o in ready}
        return tuple(order)

    @property
    def prefetched(self) -> tuple:
        """The scalar-prefetch inputs, in declared order."""
        return tuple(o for o in self.inputs if o.prefetch)

    @property
    def call_order(self) -> tuple:
        """Inputs as pallas_call takes them: scalar-prefetch inputs first."""
        return self.prefetched + tuple(o for o in self.inputs if not o.prefetch)

    @property
    def operands(self) -> tuple:
        return self.inputs + self.outputs

    @property
    def returned(self) -> tuple:
        """The outputs the package function and the reference return: all but the residual ones
        (`residual: true`), which the kernel writes for the backward pass only."""
        return tuple(o for o in self.outputs if not o.residual)

    def operand(self, name: str) -> Operand | None:
        return next((o for o in self.operands + self.facade if o.name == name), None)

    @property
    def backends(self) -> tuple:
        return tuple(self.variants)


# Compiler params that may be expressions over params (so `kspec tune` can search them).
# The backends of a spec that declares no `backends:` section.
DEFAULT_BACKENDS = ("interpret",)
EXPR_COMPILER_PARAMS = frozenset({"num_warps", "num_stages", "max_concurrent_steps", "vmem_limit_bytes"})


class _Parser:
    """What every part of the model is built with: the document, the diagnostics found so far
    (shared by all the builders of one document), and the parsing of its expressions, index maps,
    code and constraints."""

    def __init__(self, doc: Document, errors: list):
        self.doc = doc
        self.errors: list[Diagnostic] = errors

    def expr(self, value: Any, at: tuple, sizes: bool = False) -> Expr | None:
        """An expression (`sizes`: one that may also read itemsize(x), a resource estimate)."""
        try:
            e = parse_expr(value, sizes=sizes)
        except ExprError as err:
            self.errors.append(Diagnostic(err.code, err.message, self.doc.text_loc(at, 0, err.col)))
            return None
        return dataclasses.replace(e, loc=self.doc.loc(at))

    def condition(self, value: Any, at: tuple) -> Expr | None:
        return self.expr(value, at)

    def index_map(self, value: Any, at: tuple) -> IndexMap | None:
        try:
            m = parse_index_map(value, subscripts=True)
        except ExprError as err:
            self.errors.append(Diagnostic(err.code, err.message, self.doc.text_loc(at, 0, err.col)))
            return None
        results = tuple(dataclasses.replace(r, loc=self.doc.loc(at)) for r in m.results)
        return dataclasses.replace(m, results=results, loc=self.doc.loc(at))

    def code(self, at: tuple) -> Code:
        info = self.doc.info(at)
        value = self.doc.data
        for key in at:
            value = value[key]
        if info.style in ("|", ">"):
            first = self.doc.text_loc(at, 0, 0)
            return Code(value, Location(first.path, first.line - 1, first.col), first.col - 1)
        quote = 1 if info.style in ("'", '"') else 0
        origin = Location(info.loc.path, info.loc.line, info.loc.col + quote)
        return Code(value, origin, None)

    def constraints(self, raw: list, at: tuple = ("constraints",)) -> tuple:
        out = []
        for i, c in enumerate(raw or []):
            here = at + (i,)
            if isinstance(c, dict):
                e = self.condition(c["expr"], here + ("expr",))
                out.append(Constraint(e, c.get("message"), self.doc.loc(here)))
            else:
                out.append(Constraint(self.condition(c, here), None, self.doc.loc(here)))
        return tuple(out)

    @staticmethod
    def _at(data: Mapping, at: tuple):
        for key in at:
            if not isinstance(data, Mapping) or key not in data:
                return None
            data = data[key]
        return data

    @staticmethod
    def dtype_map(value: Any) -> DtypeMap | None:
        """A `{from: x, map: {...}}` dtype (the schema has checked its form), else None."""
        if not isinstance(value, dict):
            return None
        return DtypeMap(value["from"], tuple((k, v) for k, v in value["map"].items()))


class _Operands(_Parser):
    """The inputs and outputs, with their initialisers."""

    def operands(self, raw: Mapping, role: Role, at: tuple, inputs: set) -> tuple:
        out = []
        for name, spec in raw.items():
            here = at + (name,)
            shape = tuple(self.expr(v, here + ("shape", i)) for i, v in enumerate(spec["shape"]))
            dtype = spec["dtype"]
            follows, dtype_map = None, self.dtype_map(dtype)
            if dtype_map is not None:
                dtypes = dtype_map.targets
            elif isinstance(dtype, list):
                dtypes = tuple(dtype)
            elif dtype in inputs:
                dtypes, follows = None, dtype
            else:
                dtypes = (dtype,)
            out.append(
                Operand(
                    name,
                    role,
                    shape,
                    dtypes,
                    follows,
                    spec.get("doc", ""),
                    self.doc.key_loc(here),
                    self.doc.loc(here + ("dtype",)),
                    self.init(spec.get("init"), here + ("init",)),
                    bool(spec.get("prefetch", False)),
                    tuple(spec["kinds"]) if "kinds" in spec else None,
                    self.doc.loc(here + ("kinds",)) if "kinds" in spec else None,
                    bool(spec.get("residual", False)),
                    self.doc.loc(here + ("residual",)) if "residual" in spec else None,
                    optional=bool(spec.get("optional", False)),
                    dtype_map=dtype_map,
                    max=self.expr(spec["max"], here + ("max",)) if "max" in spec else None,
                )
            )
        return tuple(out)

    def init(self, raw: Mapping | None, at: tuple) -> Init | None:
        if raw is None:
            return None
        kind = InitKind(raw["kind"]) if "kind" in raw else None
        # an index initialiser's low is an expression (it may read dims, params and other inputs)
        expr_low = "low" in raw and (kind == InitKind.INDEX or isinstance(raw["low"], str))
        low_expr = self.expr(raw["low"], at + ("low",)) if expr_low else None
        numbers = {k: float(raw[k]) for k in ("low", "high", "mean", "std")
                   if k in raw and not (k == "low" and expr_low)}
        bound = self.expr(raw["bound"], at + ("bound",)) if "bound" in raw else None
        return Init(kind, **numbers, of=raw.get("of"), dim=raw.get("dim", 0), bound_expr=bound, loc=self.doc.loc(at),
                    low_expr=low_expr, code=self.code(at + ("code",)) if "code" in raw else None,
                    same_as=raw.get("same_as"), keys=tuple(raw))

    def wrapper(self, data: Mapping, inputs: set) -> Wrapper | None:
        """`prologue`, `epilogue` and `kernel:` (None when the spec has none of them)."""
        if not any(k in data for k in ("prologue", "epilogue", "kernel")):
            return None
        kernel = data.get("kernel") or {}
        kernel_inputs = self.operands(kernel.get("inputs") or {}, Role.INPUT, ("kernel", "inputs"),
                                      inputs | set(kernel.get("inputs") or {}))
        kernel_outputs = self.operands(kernel.get("outputs") or {}, Role.OUTPUT, ("kernel", "outputs"),
                                       inputs | set(kernel.get("inputs") or {}))
        first = next(k for k in ("kernel", "prologue", "epilogue") if k in data)
        return Wrapper(
            self.code(("prologue",)) if "prologue" in data else None,
            self.code(("epilogue",)) if "epilogue" in data else None,
            tuple(dataclasses.replace(o, kernel=True) for o in kernel_inputs),
            tuple(dataclasses.replace(o, kernel=True) for o in kernel_outputs),
            self.doc.key_loc((first,)),
        )


class _Variants(_Parser):
    """The kernel as each backend sees it: params, grid, blocks, scratch, compiler params, and a
    mesh kernel's mesh and pipelines, the spec's own overridden by each backend's."""

    def variants(self, data: Mapping) -> dict:
        base_params = self.params(data.get("params"), ("params",))
        base_grid = self.grid(data.get("grid"), ("grid",))
        base_blocks = self.blocks(data.get("blocks"), ("blocks",))
        base_scratch = self.scratch(data.get("scratch"), ("scratch",))
        base_body = self.code(("body",))
        declared = data.get("backends") or {name: None for name in DEFAULT_BACKENDS}
        out = {}
        for name, over in declared.items():
            over = over or {}
            at = ("backends", name)
            params = {p.name: p for p in base_params}
            params.update({p.name: p for p in self.params(over.get("params"), at + ("params",))})
            blocks = dict(base_blocks)
            blocks.update(self.blocks(over.get("blocks"), at + ("blocks",)))
            mesh_at = at + ("mesh",) if "mesh" in over else ("mesh",)
            pipes_at = at + ("pipelines",) if "pipelines" in over else ("pipelines",)
            refs = {k: MemorySpace(v) for k, v in {**(data.get("refs") or {}), **(over.get("refs") or {})}.items()}
            out[name] = Variant(
                backend=name,
                grid=self.grid(over["grid"], at + ("grid",)) if "grid" in over else base_grid,
                blocks=blocks,
                params=tuple(params.values()),
                scratch=self.scratch(over["scratch"], at + ("scratch",)) if "scratch" in over else base_scratch,
                body=self.code(at + ("body",)) if "body" in over else base_body,
                compiler_params=self.compiler_params(over.get("compiler_params"), at + ("compiler_params",)),
                dtypes={k: tuple(v) for k, v in (over.get("dtypes") or {}).items()},
                loc=self.doc.key_loc(at) if "backends" in data else self.doc.loc(()),
                mesh=self.mesh(self._at(data, mesh_at), mesh_at),
                pipelines=self.pipelines(self._at(data, pipes_at), pipes_at),
                refs=refs,
                mesh_loc=self.doc.key_loc(mesh_at) if self._at(data, mesh_at) is not None else None,
                constraints=self.constraints(over.get("constraints"), at + ("constraints",)),
                shared_memory=(self.expr(over["shared_memory"], at + ("shared_memory",), sizes=True)
                               if "shared_memory" in over else None),
            )
        return out

    def params(self, raw: Mapping, at: tuple) -> tuple:
        out = []
        for name, value in (raw or {}).items():
            here = at + (name,)
            if isinstance(value, dict):
                choices = tuple(value["choices"]) if "choices" in value else None
                default = value["default"]
                if isinstance(default, str):  # an expression over the dims, evaluated per call
                    default = self.expr(default, here + ("default",))
                out.append(Param(name, default, choices, value.get("doc", ""), self.doc.key_loc(here)))
            else:
                out.append(Param(name, value, None, "", self.doc.key_loc(here)))
        return tuple(out)

    def grid(self, raw: Any, at: tuple) -> tuple:
        if raw is None:
            return ()
        if isinstance(raw, dict):
            return tuple(GridAxis(k, self.expr(v, at + (k,)), self.doc.key_loc(at + (k,))) for k, v in raw.items())
        return tuple(GridAxis(None, self.expr(v, at + (i,))) for i, v in enumerate(raw))

    def blocks(self, raw: Mapping, at: tuple) -> dict:
        out = {}
        for name, spec in (raw or {}).items():
            here = at + (name,)
            dims = [self.block_dim(v, here + ("block_shape", i)) for i, v in enumerate(spec.get("block_shape") or ())]
            whole = "block_shape" not in spec
            imap = None if whole else self.index_map(spec["index_map"], here + ("index_map",))
            transforms = spec.get("transforms") or {}
            out[name] = Block(
                name,
                None if whole else tuple(size for _, size, _ in dims),
                imap,
                self.doc.key_loc(here),
                self.doc.loc(here + ("block_shape",)) if not whole else self.doc.key_loc(here),
                tuple(transforms.get("tiling", ())),
                transforms.get("swizzle"),
                spec.get("delay_release", 0),
                tuple(kind for kind, _, _ in dims),
                tuple(pad for _, _, pad in dims),
                _member(MemorySpace, spec.get("memory_space")),
                (spec.get("pipeline_mode") or {}).get("buffered"),
                masked=bool(spec.get("masked", False)),
                sliced=bool(spec.get("sliced", False)),
            )
        return out

    def block_dim(self, value: Any, at: tuple) -> tuple:
        """(kind, size Expr or None, (low, high) padding) of one block_shape entry."""
        if value is None:
            return SQUEEZED, None, (0, 0)
        if isinstance(value, dict) and "element" in value:
            return ELEMENT, self.expr(value["element"], at + ("element",)), tuple(value.get("padding", (0, 0)))
        if isinstance(value, dict):
            return BOUNDED, self.expr(value["bounded_slice"], at + ("bounded_slice",)), (0, 0)
        return BLOCKED, self.expr(value, at), (0, 0)

    def scratch(self, raw: Mapping, at: tuple) -> tuple:
        out = []
        for name, spec in (raw or {}).items():
            here = at + (name,)
            shape = tuple(self.expr(v, here + ("shape", i)) for i, v in enumerate(spec["shape"]))
            out.append(
                Scratch(
                    name,
                    shape,
                    None if isinstance(spec.get("dtype"), dict) else spec.get("dtype"),
                    MemorySpace(spec.get("memory_space", MemorySpace.VMEM)),
                    ScratchKind(spec.get("kind", ScratchKind.ARRAY)),
                    spec.get("num_arrivals", 1),
                    self.doc.key_loc(here),
                    tuple((spec.get("transforms") or {}).get("tiling", ())),
                    (spec.get("transforms") or {}).get("swizzle"),
                    tuple(spec.get("collective_axes", ())),
                    self.dtype_map(spec.get("dtype")),
                    spec.get("init"),
                )
            )
        return tuple(out)

    def mesh(self, raw: Mapping | None, at: tuple) -> tuple:
        out = []
        for role in MeshRole:
            for name, size in ((raw or {}).get(role) or {}).items():
                here = at + (role, name)
                out.append(MeshAxis(name, role, self.expr(size, here), self.doc.key_loc(here)))
        return tuple(out)

    def pipelines(self, raw: Mapping | None, at: tuple) -> tuple:
        out = []
        for name, spec in (raw or {}).items():
            here = at + (name,)
            blocks = []
            for role in PipeRole:
                for op, b in (spec.get(role) or {}).items():
                    bat = here + (role, op)
                    shape = tuple(self.expr(v, bat + ("block_shape", i)) for i, v in enumerate(b["block_shape"]))
                    view = tuple(self.expr(v, bat + ("view", i)) for i, v in enumerate(b["view"])) if "view" in b else None
                    transforms = b.get("transforms") or {}
                    block = Block(
                        op, shape, self.index_map(b["index_map"], bat + ("index_map",)), self.doc.key_loc(bat),
                        self.doc.loc(bat + ("block_shape",)), tuple(transforms.get("tiling", ())),
                        transforms.get("swizzle"), b.get("delay_release", 0),
                        collective_axes=tuple(b.get("collective_axes", ())),
                    )
                    blocks.append(PipeBlock(op, role, view, block))
            ws = spec.get("warp_specialized")
            out.append(
                Pipeline(
                    name,
                    self.grid(spec["grid"], here + ("grid",)),
                    tuple(blocks),
                    self.expr(spec["buffers"], here + ("buffers",)) if "buffers" in spec else None,
                    ws["num_compute_wgs"] if ws else None,
                    ws.get("memory_registers", 40) if ws else None,
                    self.doc.key_loc(here),
                )
            )
        return tuple(out)

    def compiler_params(self, raw: Mapping | None, at: tuple) -> dict:
        """Compiler params; numeric ones written as expressions (tunable) become Expr."""
        return {
            k: self.expr(v, at + (k,)) if k in EXPR_COMPILER_PARAMS and isinstance(v, str) else v
            for k, v in (raw or {}).items()
        }


class _Runs(_Parser):
    """What verify, bench and tune run the kernel on and against: cases, bench cases, families of
    shapes, and the competitors."""

    def cases(self, raw: list, key: str = "cases") -> tuple:
        out = []
        for i, case in enumerate(raw or []):
            here = (key, i)
            dims = {k: v for k, v in case.items()
                    if k not in ("name", "dtype", "params", "absent", "tolerance", "min_speedup", "min_speedup_over",
                                 "backends")}
            out.append(
                Case(
                    case.get("name") or f"{'bench' if key == 'bench' else 'case'}{i}",
                    dims,
                    case.get("dtype"),
                    dict(case.get("params") or {}),
                    dict(case.get("tolerance") or {}),
                    self.doc.loc(here),
                    case.get("min_speedup"),
                    dict(case.get("min_speedup_over") or {}),
                    {k: self.doc.key_loc(here + ("min_speedup_over", k)) for k in case.get("min_speedup_over") or {}},
                    absent=tuple(case.get("absent") or ()),
                    backends=tuple(case.get("backends") or ()),
                )
            )
        return tuple(out)

    def families(self, raw: Mapping | None) -> tuple:
        out = []
        for name, fam in (raw or {}).items():
            here = ("families", name)
            loc = self.doc.key_loc(here)
            values, lengths = {}, {}
            for dim, v in fam["dims"].items():
                if isinstance(v, list):
                    values[dim] = list(v)
                    lengths[dim] = len(v)
                    continue
                if "step" in v:  # its length without spelling it out: a range may be huge
                    lengths[dim] = max(0, (v["to"] - v["from"]) // v["step"] + 1)
                seq, x = [], v["from"]
                while x <= v["to"] and len(seq) <= MAX_FAMILY_SHAPES:
                    seq.append(x)
                    x = x * v["times"] if "times" in v else x + v["step"]
                if not seq:
                    self.errors.append(Diagnostic("E510", f"family `{name}`: dim {dim}'s range from {v['from']} to "
                                                  f"{v['to']} is empty", self.doc.loc(here + ("dims", dim))))
                values[dim] = seq
                lengths.setdefault(dim, len(seq))
            if fam.get("combine", "cross") == "zip":
                if len(set(lengths.values())) > 1:
                    shown = ", ".join(f"{d}: {n}" for d, n in lengths.items())
                    self.errors.append(Diagnostic("E510", f"family `{name}` zips dims of different lengths ({shown})",
                                                  self.doc.loc(here + ("dims",)), "give every dim as many values, "
                                                  "or use combine: cross"))
                    continue
                shapes = [dict(zip(values, row)) for row in zip(*values.values())]
            else:
                count = math.prod(lengths.values())
                if count > MAX_FAMILY_SHAPES:
                    self.errors.append(Diagnostic("E510", f"family `{name}` has {count} shapes; at most "
                                                  f"{MAX_FAMILY_SHAPES} allowed", self.doc.loc(here + ("dims",)),
                                                  "use fewer values, or split it into several families"))
                    continue
                shapes = [dict(zip(values, row)) for row in itertools.product(*values.values())]
            if len(shapes) > MAX_FAMILY_SHAPES:
                self.errors.append(Diagnostic("E510", f"family `{name}` has {len(shapes)} shapes; at most "
                                              f"{MAX_FAMILY_SHAPES} allowed", self.doc.loc(here + ("dims",))))
                continue
            dtypes = fam.get("dtype")
            dtypes = [None] if dtypes is None else [dtypes] if isinstance(dtypes, str) else list(dtypes)
            cases = tuple(
                Case(f"{name}_" + "_".join(f"{d}{n}" for d, n in shape.items()), shape, dtype,
                     dict(fam.get("params") or {}), dict(fam.get("tolerance") or {}), loc,
                     absent=tuple(fam.get("absent") or ()))
                for shape in shapes for dtype in dtypes
            )
            out.append(Family(name, str(fam.get("doc", "")).strip(), cases, loc))
        return tuple(out)

    def competitors(self, raw: Mapping | None) -> tuple:
        return tuple(
            Competitor(name, self.code(("competitors", name, "body")), tuple(c.get("platforms") or ("cpu", "gpu", "tpu")),
                       str(c.get("doc", "")).strip(), self.doc.key_loc(("competitors", name)),
                       tuple(c.get("requires") or ()))
            for name, c in (raw or {}).items()
        )


class _Call(_Parser):
    """pallas_call's options: its name, metadata and debug flag, and the cost estimate."""

    def call(self, raw: Mapping | None) -> CallOptions:
        raw = raw or {}
        return CallOptions(raw.get("name"), dict(raw.get("metadata") or {}), bool(raw.get("debug", False)))

    def cost(self, raw: Mapping | None) -> Cost | None:
        if raw is None:
            return None
        at = ("cost_estimate",)
        parts = {k: self.expr(raw[k], at + (k,)) if k in raw else None for k in ("flops", "transcendentals", "bytes_accessed")}
        return Cost(**parts)


def _member(kind: type[enum.StrEnum], value: str | None):
    """`value` as a member of `kind` (the schema allows only its values), or None."""
    return None if value is None else kind(value)


def _dims(inputs: tuple, params: set) -> tuple:
    seen: list = []
    for op in inputs:
        for e in op.shape:
            if e is not None and e.source.isidentifier() and e.source not in params and e.source not in seen:
                seen.append(e.source)
    return tuple(seen)


def build(doc: Document) -> KernelSpec:
    """Build the model from a schema-valid document; raise SpecError on bad expressions."""
    data = doc.data
    errors: list[Diagnostic] = []
    b, ops, runs, call = _Parser(doc, errors), _Operands(doc, errors), _Runs(doc, errors), _Call(doc, errors)
    input_names = set(data["inputs"])
    inputs = ops.operands(data["inputs"], Role.INPUT, ("inputs",), input_names)
    outputs = ops.operands(data["outputs"], Role.OUTPUT, ("outputs",), input_names)
    variants = _Variants(doc, errors).variants(data)
    spec = KernelSpec(
        name=data["name"],
        doc=data.get("doc", "").strip(),
        path=doc.path,
        sha256=hashlib.sha256(doc.text.encode("utf-8")).hexdigest(),
        inputs=inputs,
        outputs=outputs,
        dims=(),
        constraints=b.constraints(data.get("constraints")),
        reference=b.code(("reference",)),
        cases=runs.cases(data["cases"]),
        tolerance=dict(data.get("tolerance") or {}),
        variants=variants,
        loc=doc.loc(()),
        bench=runs.cases(data.get("bench"), "bench"),
        families=runs.families(data.get("families")),
        kernel_sha=tuning.kernel_sha(data),
        reference_sha=tuning.reference_sha(data),
        cost=call.cost(data.get("cost_estimate")),
        sharding=_sharding.build(doc),
        aliases=dict(data.get("input_output_aliases") or {}),
        aliases_loc=doc.key_loc(("input_output_aliases",)) if "input_output_aliases" in data else None,
        call=call.call(data.get("pallas_call")),
        kind=SpecKind(data.get("kind", SpecKind.PALLAS_CALL)),
        kind_loc=doc.loc(("kind",)) if "kind" in data else None,
        vjp=_vjp.build(doc),
        competitors=runs.competitors(data.get("competitors")),
        reference_when_faster=bool((data.get("dispatch") or {}).get("reference_when_faster", False)),
        wrapper=ops.wrapper(data, input_names),
    )
    if errors:
        raise SpecError(errors)
    all_params = {p.name for v in variants.values() for p in v.params}
    return dataclasses.replace(spec, dims=_dims(inputs, all_params))
