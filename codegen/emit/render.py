"""Stage 5: the checked model -> the generated package's files (text, no banner yet).

Templates in templates/ receive plain strings built here; spec text reaches them only
as data (never as template source), so `{{ }}` in a spec is inert. Every accepted
spec renders Python that parses: render() checks that before returning.
"""

from __future__ import annotations

import ast
import functools
import math
import textwrap
from importlib import resources
from pathlib import Path

import jinja2

from kspec.codegen.checks import vjp as _vjp
from kspec.codegen.checks.sharding import gather_dims
from kspec.codegen.backends import AUTO, BACKENDS
from kspec.codegen.spec.expr import Expr
from kspec.codegen.spec.model import KernelSpec, Variant
from kspec.codegen.spec.sharding import GATHER

TEMPLATES = Path(str(resources.files("kspec") / "templates"))


def _docstring(text: str, indent: int) -> str:
    """Text safe inside a triple-quoted docstring, continuation lines indented.

    Backslashes and every double quote are escaped, so no spec text can end the
    string early, whatever it holds."""
    text = (text or "").strip().replace("\\", "\\\\").replace('"', '\\"')
    pad = " " * indent
    return "\n".join((pad + line if line.strip() and i else line.rstrip()) for i, line in enumerate(text.splitlines()))


def _indent_code(source: str, indent: int) -> str:
    return textwrap.indent(source.rstrip("\n") + "\n", " " * indent).rstrip("\n")


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["docstring"] = _docstring
    env.filters["indent_code"] = _indent_code
    return env


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
        return _tuple(map(literal, value))
    return repr(value)


def jnp_dtype(name: str) -> str:
    return "jnp.bool_" if name == "bool" else f"jnp.{name}"


def _tuple(items) -> str:
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _dtype_expr(spec: KernelSpec, op) -> str:
    if op.dtype_map is not None:
        return f"(jnp.dtype(out_dtype) if out_dtype is not None else {_mapped_dtype(op.dtype_map)})"
    return f"{op.follows}.dtype" if op.follows else jnp_dtype(op.dtypes[0])


def _mapped_dtype(m) -> str:
    """`{'int8': jnp.int32, ...}[jnp.dtype(x.dtype).name]`: a dtype map looked up in a call."""
    table = "{" + ", ".join(f"{k!r}: {jnp_dtype(v)}" for k, v in m.table) + "}"
    return f"{table}[jnp.dtype({m.source}.dtype).name]"


def out_dtype_outputs(spec: KernelSpec) -> list:
    """The outputs whose dtype is a map: the ones the generated function's out_dtype sets."""
    return [o.name for o in spec.outputs if o.dtype_map is not None]


def _gpu_layout(block) -> str:
    """plgpu.BlockSpec keywords for a block's shared-memory layout; "" when it sets none."""
    transforms = [f"plgpu.TilingTransform({_tuple(map(str, block.tiling))})"] if block.tiling else []
    transforms += [f"plgpu.SwizzleTransform({block.swizzle})"] if block.swizzle else []
    kwargs = [f"transforms={_tuple(transforms)}"] if transforms else []
    kwargs += [f"delay_release={block.delay_release}"] if getattr(block, "delay_release", 0) else []
    axes = getattr(block, "collective_axes", ())
    kwargs += [f"collective_axes={_tuple(repr(a) for a in axes)}"] if axes else []
    return ", ".join(kwargs)


# How each block memory_space is spelled, per backend family.
MEMORY_SPACES = {"any": "pl.ANY", "hbm": "pltpu.HBM", "vmem": "pltpu.VMEM", "smem": "pltpu.SMEM"}
GPU_MEMORY_SPACES = {"gmem": "plgpu.GMEM", "smem": "plgpu.SMEM"}


def _block_dim(block, d: int) -> str:
    """One block_shape entry as Pallas spells it."""
    kind, size = block.kind(d), block.block_shape[d]
    if kind == "squeezed":
        return "pl.squeezed"
    if kind == "element":
        return f"pl.Element({size.render()}, {_tuple(map(str, block.padding[d]))})"
    if kind == "bounded_slice":
        return f"pl.BoundedSlice({size.render()})"
    return size.render()


def _grid_size(spec: KernelSpec, axis) -> str:
    """A grid axis's size in the kernel call: a scalar-prefetch extent (`max:`) it names is read
    from its array, `num_tiles[0]`, a traced value (so min/max become jnp.minimum/maximum)."""
    scalars = spec.grid_scalars
    if not axis.size.names & scalars.keys():
        return axis.size.render()
    tree = _ReadScalars(scalars).visit(ast.parse(axis.size.render(traced=True), mode="eval").body)
    return ast.unparse(tree)


class _ReadScalars(ast.NodeTransformer):
    def __init__(self, names):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            return ast.Subscript(ast.Name(node.id, ast.Load()), ast.Constant(0), ast.Load())
        return node


def _grid_indices(variant: Variant) -> dict:
    """{name: axis} of the named grid axes the body mentions: the body receives these
    indices as keyword arguments (a list grid has no names, so none)."""
    used = variant.body.names
    return {name: axis for axis, name in enumerate(variant.grid_names) if name in used}


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.names.get(node.id, node.id), node.ctx)


def _pipelined(imap, names: list, sequential: list) -> str:
    """An index map as plgpu.emit_pipeline calls it, on the sequential grid indices only.

    Its arguments are renamed to the grid's names, so the parallel indices resolve to
    the kernel's, which the generated code binds under those names."""
    rename = _Rename(dict(zip(imap.args, names)))
    results = [ast.unparse(rename.visit(ast.parse(r.render(traced=True), mode="eval").body)) for r in imap.results]
    body = ", ".join(results) + ("," if len(results) == 1 else "")
    return _lambda([names[n] for n in sequential], f"({body})")


def _lambda(args: list, body: str) -> str:
    return f"lambda {', '.join(args)}: {body}" if args else f"lambda: {body}"


class _Context:
    """Strings the templates need, computed once per spec."""

    def __init__(self, spec: KernelSpec, package: str = "generated"):
        self.spec, self.import_path = spec, package
        self.inputs = [o.name for o in spec.inputs]
        bound: set = set()
        self.bindings, self.shape_checks = [], []
        for op in spec.inputs:
            fresh = [
                (i, e.shown) for i, e in enumerate(op.shape) if e.shown in spec.dims and e.shown not in bound
            ]
            if fresh and len(fresh) == op.rank:
                self.bindings.append(f"{', '.join(n for _, n in fresh)}{',' if op.rank == 1 else ''} = {op.name}.shape")
            else:
                self.bindings += [f"{n} = {op.name}.shape[{i}]" for i, n in fresh]
            bound.update(n for _, n in fresh)
            if len(fresh) != op.rank:
                # the params this shape uses: it is checked once they are known (see signature.py.j2)
                uses = sorted(set().union(*(e.names for e in op.shape)) - set(spec.dims))
                self.shape_checks.append((op.name, _tuple(e.render() for e in op.shape), uses))
        names_in_shapes = set().union(*(e.names for o in spec.inputs for e in o.shape))
        self.bind_params = sorted(names_in_shapes - set(spec.dims))
        self.dims_tuple = ", ".join(spec.dims) if spec.dims else "()"
        if len(spec.dims) == 1:
            self.dims_tuple += ","
        self.dims_lhs = (", ".join(spec.dims) + ("," if len(spec.dims) == 1 else "")) if spec.dims else "_"
        outs = [f"{o.name} [{', '.join(e.shown for e in o.shape)}]" for o in spec.returned]
        self.returns = outs[0] if len(outs) == 1 else "the tuple (" + ", ".join(outs) + ")"
        every = [f"{o.name} [{', '.join(e.shown for e in o.shape)}]" for o in spec.outputs]
        # A backend function returns the residual outputs too when called with residuals=True.
        self.with_residuals = "the tuple (" + ", ".join(every) + ")" if len(every) > len(outs) else None

    def common(self) -> dict:
        spec = self.spec
        return {
            "name": spec.name,
            "package": self.import_path,
            "doc": spec.doc or f"The `{spec.name}` kernel.",
            "inputs": self.inputs,
            "dims": spec.dims,
            "dims_lhs": self.dims_lhs,
            "bind_params": self.bind_params,
            "returns": self.returns,
        }

    def signature(self) -> dict:
        ranks = [(o.name, o.rank) for o in self.spec.inputs]
        dtype_checks = [
            (o.name, _tuple(f"{o.follows}.dtype" for _ in [0]) if o.follows else _tuple(jnp_dtype(d) for d in o.dtypes))
            for o in self.spec.inputs
        ]
        return dict(
            self.common(),
            ranks=ranks,
            bindings=self.bindings,
            shape_checks=self.shape_checks,
            dtype_checks=dtype_checks,
            dims_tuple=self.dims_tuple,
        )

    def params(self, variant: Variant) -> list:
        return [
            {"name": p.name, "default": p.default.shown if isinstance(p.default, Expr) else literal(p.default), "doc": p.doc}
            for p in variant.params
        ]

    def signature_of(self, variant: Variant, extra: tuple = (), tuned: bool = False) -> str:
        """`x, y, *, bm=..., ...`; with `tuned`, tunable params default to None (resolved per call)."""
        kwargs = [
            f"{p.name}={None if (tuned and p.resolved) or isinstance(p.default, Expr) else literal(p.default)}"
            for p in variant.params
        ] + list(extra)
        return ", ".join(self.inputs + (["*"] + kwargs if kwargs else []))

    def reference(self) -> dict:
        base = next(iter(self.spec.variants.values()))
        competitors = [
            {"name": c.name, "doc": c.doc or f"The `{c.name}` competitor.", "platforms": c.platforms,
             "platforms_repr": repr(tuple(c.platforms)),
             "body": c.body.source}
            for c in self.spec.competitors
        ]
        return dict(self.common(), signature=self.signature_of(base), reference=self.spec.reference.source,
                    mesh_sizes=list(self.spec.mesh_sizes.items()),
                    competitors=competitors)

    def kernel(self, variant: Variant) -> dict:
        spec = self.spec
        backend = BACKENDS[variant.backend]
        refs = [f"{o.name}_ref" for o in spec.call_order + spec.outputs] + [f"{s.name}_ref" for s in variant.scratch]
        indices = _grid_indices(variant)
        kwargs = [p.name for p in variant.params] + list(spec.dims) + list(spec.mesh_sizes)
        static = [p.name for p in variant.params] + (["interpret"] if backend.interpret == "interpret" else [])
        static += ["residuals"] if self.with_residuals else []
        static += ["out_dtype"] if out_dtype_outputs(spec) else []
        # manual_axis_type: inside jax.shard_map(check_vma=True) the outputs vary over the
        # mesh axes the inputs vary over; outside it is empty and changes nothing.
        varying = f"_signature.manual_axis_type({', '.join(self.inputs)})"
        out_shapes = [
            f"jax.ShapeDtypeStruct({_tuple(e.render() for e in o.shape)}, {_dtype_expr(spec, o)}, "
            f"manual_axis_type={varying})"
            for o in spec.outputs
        ]
        out_specs = [self._block(variant, o) for o in spec.outputs]
        padded_inputs, padded_outputs, cropped = self._whole_blocks(variant)
        if cropped:
            out_shapes = [
                f"jax.ShapeDtypeStruct({padded_outputs.get(o.name) or _tuple(e.render() for e in o.shape)}, "
                f"{_dtype_expr(spec, o)}, manual_axis_type={varying})"
                for o in spec.outputs
            ]
        input_docs = [
            f"{o.name}: [{', '.join(e.shown for e in o.shape)}] "
            f"{'same dtype as ' + o.follows if o.follows else ' | '.join(o.dtypes)}"
            + (f". {o.doc.strip()}" if o.doc else "")
            for o in spec.inputs
        ]
        out = dict(
            self.common(),
            backend=backend,
            body=variant.body.source,
            kernel_refs=refs,
            grid_indices=indices,  # {name: axis} of the named grid indices the body reads
            kernel_kwargs=kwargs,
            mesh_sizes=list(spec.mesh_sizes.items()),
            params=self.params(variant),
            signature=self.signature_of(
                variant,
                (("interpret=False",) if backend.interpret == "interpret" else ())
                + (("residuals=False",) if self.with_residuals else ())
                + (("out_dtype=None",) if out_dtype_outputs(spec) else ()),
                tuned=True,
            ),
            tunable=[p.name for p in variant.params if p.resolved],
            untuned=[p.name for p in variant.params if not p.resolved],
            static_argnames=_tuple(f'"{s}"' for s in static),
            input_docs=input_docs,
            out_shape=out_shapes[0] if len(out_shapes) == 1 else "[" + ", ".join(out_shapes) + "]",
            grid=_tuple(_grid_size(spec, a) for a in variant.grid),
            in_specs=[self._block(variant, o) for o in spec.call_order if not o.prefetch],
            call_inputs=[o.name for o in spec.call_order],
            num_scalar_prefetch=len(spec.prefetched),
            aliases=self._aliases(),
            alias_docs=[f"{o} is written in place of {i}" for o, i in spec.aliases.items()],
            call_name=spec.call.name or spec.name,
            metadata=literal(dict(sorted(spec.call.metadata.items()))) if spec.call.metadata else None,
            debug=spec.call.debug,
            out_specs=out_specs[0] if len(out_specs) == 1 else "[" + ", ".join(out_specs) + "]",
            scratch_shapes=[self._scratch(variant, s) for s in variant.scratch],
            scratch_inits=[(f"{s.name}_ref", literal(s.init)) for s in variant.scratch if s.init is not None],
            compiler_params=self._compiler_params(variant),
            dtype_limits=[(name, _tuple(jnp_dtype(d) for d in allowed)) for name, allowed in variant.dtypes.items()],
            cost_estimate=self._cost(),
            padded_inputs=padded_inputs,
            cropped=cropped,
            with_residuals=self.with_residuals,
            residual_names=[o.name for o in spec.outputs if o.residual],
            keep=self._keep(),
        )
        if spec.kind == "mesh":
            out.update(self._mesh(variant))
        elif backend.name == "mosaic_gpu":
            out.update(self._pipeline(variant))  # its compiler_params lose the pipeline's fields
        return out

    def _keep(self) -> str | None:
        """What a backend function returns of its kernel's outputs `out`, for a spec with residual
        outputs: all of them with residuals=True, else the others; None without residual outputs."""
        outputs = self.spec.outputs
        kept = [n for n, o in enumerate(outputs) if not o.residual]
        if len(kept) == len(outputs):
            return None
        returned = f"out[{kept[0]}]" if len(kept) == 1 else _tuple(f"out[{n}]" for n in kept)
        return f"out if residuals else {returned}"

    def _whole_blocks(self, variant: Variant) -> tuple:
        """Pallas Triton neither masks nor clips a ragged last block: the program reads and
        writes past the array (into whatever lies next in device memory). So on triton every
        blocked dim is padded to whole blocks: ([(input, blocks tuple)], {output: padded shape},
        the outputs' true shapes to crop to, or None when no output is blocked)."""
        if variant.backend != "triton":
            return [], {}, None
        inputs, outputs = [], {}
        for op in self.spec.operands:
            block = variant.blocks.get(op.name)
            if block is None or block.block_shape is None:
                continue
            sizes = [e.render() if block.kind(d) == "blocked" and e.source != op.shape[d].source else None
                     for d, e in enumerate(block.block_shape)]
            if not any(sizes):
                continue
            if op.role == "input":
                inputs.append((op.name, _tuple(b or "None" for b in sizes)))
            else:
                outputs[op.name] = _tuple(
                    f"_signature.whole({e.render()}, {b})" if b else e.render() for e, b in zip(op.shape, sizes)
                )
        if not outputs:
            return inputs, outputs, None
        shapes = [_tuple(e.render() for e in o.shape) for o in self.spec.outputs]
        return inputs, outputs, shapes[0] if len(shapes) == 1 else _tuple(shapes)

    def _mesh(self, variant: Variant) -> dict:
        """A mesh kernel: plgpu.kernel or pl.kernel over a TensorCore mesh, its pipelines as
        factories the body calls, and the mesh axis indices the body mentions."""
        gpu = variant.backend == "mosaic_gpu"
        used = variant.body.names
        grid, cluster = variant.mesh_axes("grid"), variant.mesh_axes("cluster")
        threads, cores = variant.mesh_axes("threads"), variant.mesh_axes("cores")
        kernel_grid = []
        for n, axis in enumerate(grid):
            size = axis.size.render()
            kernel_grid.append(f"({size}) // ({cluster[n].size.render()})" if n < len(cluster) else size)
        mesh = {}
        if gpu:
            mesh["grid"] = _tuple(kernel_grid)
            mesh["grid_names"] = _tuple(f'"{a.name}"' for a in grid)
            if cluster:
                mesh["cluster"] = _tuple(a.size.render() for a in cluster)
                mesh["cluster_names"] = _tuple(f'"{a.name}"' for a in cluster)
            if threads:
                mesh["num_threads"] = threads[0].size.render()
                mesh["thread_name"] = f'"{threads[0].name}"'
        else:
            core = cores[0]
            mesh["mesh"] = f'pltpu.create_tensorcore_mesh("{core.name}", num_cores={core.size.render()})'
        pipelines = [self._mesh_pipeline(variant, p) for p in variant.pipelines]
        return {
            "grid_indices": {a.name: a.name for a in variant.mesh if a.name in used},
            "kernel_kwargs": [p.name for p in variant.pipelines] + [p.name for p in variant.params] + list(self.spec.dims),
            "mesh_args": [f"{k}={v}" for k, v in mesh.items()],
            "pipelines": pipelines,
            "num_sms": any("num_sms" in a.size.names for a in grid),
            "refs": {o.name: variant.refs.get(o.name) for o in self.spec.operands if variant.refs.get(o.name)},
        }

    def _mesh_pipeline(self, variant: Variant, pipe) -> dict:
        gpu = variant.backend == "mosaic_gpu"
        names = [a.name for a in pipe.grid]
        specs = {"in": [], "out": []}
        for pb in pipe.blocks:
            block = pb.block
            shape = _tuple(e.render() for e in block.block_shape)
            index_map = _lambda(names, _tuple(r.render(traced=True) for r in block.index_map.results))
            extra = [kw for kw in [_gpu_layout(block)] if kw] if gpu else []
            cls = "plgpu.BlockSpec" if extra else "pl.BlockSpec"
            specs[pb.role].append(f"{cls}({', '.join([shape, index_map] + extra)})")
        options = []
        if gpu and pipe.compute_wgs:
            thread = variant.mesh_axes("threads")[0].name
            options += [f'wg_axis="{thread}"', f"num_compute_wgs={pipe.compute_wgs}", f"memory_registers={pipe.memory_registers}"]
        if gpu:
            options.append(f"max_concurrent_steps={pipe.buffers.render() if pipe.buffers is not None else 2}")
        views = [f"{pb.operand} [{', '.join(e.shown for e in (pb.view or self.spec.operand(pb.operand).shape))}]"
                 for pb in pipe.blocks]
        function = ("plgpu.emit_pipeline_warp_specialized" if pipe.compute_wgs else "plgpu.emit_pipeline") if gpu \
            else "pltpu.emit_pipeline"
        return {
            "name": pipe.name,
            "function": function,
            "grid": _tuple(a.size.render() for a in pipe.grid),
            "in_specs": specs["in"],
            "out_specs": specs["out"],
            "options": options,
            "views": ", ".join(views),
            "step_args": ("(indices, " if gpu else "(") + ", ".join(f"{pb.operand}_block" for pb in pipe.blocks) + ")",
        }

    def _pipeline(self, variant: Variant) -> dict:
        """plgpu.kernel + plgpu.emit_pipeline: the parallel grid axes are the kernel's grid
        (read with lax.axis_index), the sequential ones the pipeline's (its `indices`)."""
        params = dict(variant.compiler_params)
        semantics = params.pop("dimension_semantics", None) or ["parallel"] * len(variant.grid)
        depth = params.pop("max_concurrent_steps", 1)
        names = [a.name or f"_{n}" for n, a in enumerate(variant.grid)]
        parallel = [n for n, s in enumerate(semantics) if s == "parallel"]
        sequential = [n for n, s in enumerate(semantics) if s != "parallel"]
        specs = {o.name: self._block(variant, o, (names, sequential)) for o in self.spec.operands}
        return {
            "kernel_grid": _tuple(variant.grid[n].size.render() for n in parallel),
            "kernel_grid_names": _tuple(f'"{names[n]}"' for n in parallel),
            "operand_refs": [f"{o.name}_ref" for o in self.spec.operands],
            "parallel_indices": [names[n] for n in parallel],
            "pipeline_grid": _tuple(variant.grid[n].size.render() for n in sequential),
            "pipeline_indices": [names[n] for n in sequential],
            "pipeline_in_specs": [specs[o.name] for o in self.spec.inputs],
            "pipeline_out_specs": [specs[o.name] for o in self.spec.outputs],
            "max_concurrent_steps": depth.render() if isinstance(depth, Expr) else depth,
            "compiler_params": self._params_call(variant.backend, params),
        }

    def _aliases(self) -> str | None:
        """pallas_call's input_output_aliases: {input position in the call: output position}."""
        if not self.spec.aliases:
            return None
        ins = [o.name for o in self.spec.call_order]
        outs = [o.name for o in self.spec.outputs]
        pairs = sorted((ins.index(i), outs.index(o)) for o, i in self.spec.aliases.items())
        return "{" + ", ".join(f"{i}: {o}" for i, o in pairs) + "}"

    def _cost(self) -> str | None:
        cost = self.spec.cost
        if cost is None:
            return None
        if cost.bytes_accessed is not None:
            nbytes = cost.bytes_accessed.render()
        else:
            terms = [f"{o.name}.size * {o.name}.dtype.itemsize" for o in self.spec.inputs]
            terms += [
                f"math.prod({_tuple(e.render() for e in o.shape)}) * jnp.dtype({_dtype_expr(self.spec, o)}).itemsize"
                for o in self.spec.outputs
            ]
            nbytes = " + ".join(terms)
        flops = cost.flops.render() if cost.flops is not None else "0"
        trans = cost.transcendentals.render() if cost.transcendentals is not None else "0"
        return f"pl.CostEstimate(flops={flops}, transcendentals={trans}, bytes_accessed={nbytes})"

    def _block(self, variant: Variant, op, pipeline: tuple | None = None) -> str:
        """The operand's BlockSpec; with `pipeline` (grid names, sequential axes), as
        plgpu.emit_pipeline takes it: its index map gets the sequential indices only."""
        block = variant.blocks.get(op.name)
        if pipeline is not None:
            names, sequential = pipeline
            grid_args = [names[n] for n in sequential]
        else:
            grid_args = [f"_{i}" for i in range(len(variant.grid))] + [f"_{o.name}" for o in self.spec.prefetched]
        if block is None:
            zeros = _tuple("0" for _ in op.shape)
            return f"pl.BlockSpec({_tuple(e.render() for e in op.shape)}, {_lambda(grid_args, zeros)})"
        spaces = GPU_MEMORY_SPACES if variant.backend == "mosaic_gpu" else MEMORY_SPACES
        extra = [f"pipeline_mode=pl.Buffered({block.buffers})"] if block.buffers else []
        extra += [f"memory_space={spaces[block.memory_space]}"] if block.memory_space else []
        if block.block_shape is None:  # the whole array, in its memory space
            return f"pl.BlockSpec({', '.join(extra)})"
        shape = _tuple(_block_dim(block, d) for d in range(len(block.block_shape)))
        index_map = block.index_map.render() if pipeline is None else _pipelined(block.index_map, *pipeline)
        layout = [kw for kw in [_gpu_layout(block)] if kw] + extra
        if variant.backend == "mosaic_gpu" and layout:
            return f"plgpu.BlockSpec({shape}, {index_map}, {', '.join(layout)})"
        return f"pl.BlockSpec({', '.join([shape, index_map] + extra)})"

    def _scratch(self, variant: Variant, s) -> str:
        shape = _tuple(e.render() for e in s.shape)
        if s.kind == "dma_semaphore":
            return f"pltpu.SemaphoreType.DMA({shape})"
        if s.kind == "semaphore":
            return f"pltpu.SemaphoreType.REGULAR({shape})"
        if s.kind == "barrier":
            count = s.shape[0].render() if s.shape else "1"
            if s.collective_axes:
                axes = _tuple(repr(a) for a in s.collective_axes)
                return f"plgpu.ClusterBarrier(collective_axes={axes}, num_arrivals={s.num_arrivals}, num_barriers={count})"
            return f"plgpu.Barrier(num_arrivals={s.num_arrivals}, num_barriers={count})"
        if s.kind == "accumulator":
            return f"plgpu.ACC({shape}, {self._scratch_dtype(s) if s.dtype else 'jnp.float32'})"
        if variant.backend == "mosaic_gpu":
            layout = _gpu_layout(s)
            return f"plgpu.SMEM({shape}, {self._scratch_dtype(s)}{', ' + layout if layout else ''})"
        space = "SMEM" if s.memory_space == "smem" else "VMEM"
        return f"pltpu.{space}({shape}, {self._scratch_dtype(s)})"

    def _scratch_dtype(self, s) -> str:
        """A dtype name, or an input's name: that input's dtype at call time (`x.dtype`)."""
        if s.dtype_map is not None:
            return _mapped_dtype(s.dtype_map)
        return f"{s.dtype}.dtype" if s.dtype in {o.name for o in self.spec.inputs} else jnp_dtype(s.dtype)

    def _compiler_params(self, variant: Variant) -> str | None:
        return self._params_call(variant.backend, variant.compiler_params)

    def _params_call(self, backend: str, params: dict) -> str | None:
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
                value_src = _tuple(literal(v) for v in value)
            else:
                value_src = literal(value)
            args.append(f"{key}={value_src}")
        return f"{cls}({', '.join(args)})"

    def tuning(self, tuned: dict) -> dict:
        from kspec.codegen.spec import tuning

        table, slower = [], []
        choices = tuning.choices_of(self.spec.variants)
        for device_kind, entries in sorted(tuned.items()):
            for (backend, dtype, bucket, fixed), params in tuning.best(entries, self.spec.kernel_sha, choices).items():
                if backend in self.spec.variants:
                    table.append((literal((device_kind, backend, dtype, bucket, fixed)), literal(params)))
            if self.spec.reference_when_faster:
                for (backend, dtype, bucket, fixed), x in tuning.slower(entries, self.spec.kernel_sha, choices).items():
                    if backend in self.spec.variants:
                        slower.append((literal((device_kind, backend, dtype, bucket, fixed)), literal(x)))
        defaults = [
            (b, "{" + ", ".join(f"{p.name!r}: {p.default.render() if isinstance(p.default, Expr) else literal(p.default)}"
                                for p in v.params if p.resolved) + "}")
            for b, v in self.spec.variants.items()
        ]
        constraint_params = sorted(
            set().union(*(c.expr.names for c in self.spec.constraints)) - set(self.spec.dims)
        ) if self.spec.constraints else []
        constraints = " and ".join(f"({c.expr.render()})" for c in self.spec.constraints) or "True"
        return dict(
            self.common(), table=table, defaults=defaults, constraint_params=constraint_params,
            constraints=constraints, slower=slower, reference_when_faster=self.spec.reference_when_faster,
            dims_args=", ".join(self.spec.dims),
        )

    def dispatch(self) -> dict:
        """_dispatch.py: what each backend needs of a call (backends/requirements.py)."""
        from kspec.codegen.backends import requirements as rq

        spec = self.spec
        per_backend, sizes = [], {}
        for name, v in spec.variants.items():
            reqs = rq.requirements(spec, v)
            per_backend.append({
                "name": name,
                "requirements": reqs,
                "untuned": [(p.name, literal(p.default)) for p in v.params if not p.resolved],
                "resolved": [p.name for p in v.params if p.resolved],
            })
            if any("_itemsize" in r.condition + r.reason for r in reqs):
                sizes.update(rq.itemsizes(spec, v))
        params = list(dict.fromkeys(p.name for v in spec.variants.values() for p in v.params))
        package = self.package("")
        return dict(
            self.common(),
            backends_tuple=package["backends_tuple"], platforms=package["platforms"], auto=package["auto"],
            dims_constraints=rq.dims_constraints(spec),
            dims_args=", ".join(spec.dims),
            dim_names=_tuple(repr(d) for d in spec.dims),
            dims_tuple=", ".join(spec.dims) + ("," if len(spec.dims) == 1 else ""),
            per_backend=per_backend,
            needs_itemsize=bool(sizes),
            itemsize_dict="{" + ", ".join(f"{k!r}: {v}" for k, v in sizes.items()) + "}",
            params=params,
            params_dict="{" + ", ".join(f'"{p}": {p}' for p in params) + "}",
            slower=spec.reference_when_faster,
        )

    def package(self, spec_path: str) -> dict:
        spec = self.spec
        backends = list(spec.variants)
        platforms = {b: BACKENDS[b].platforms for b in backends}
        # On each platform, the declared backends AUTO allows, in the spec's order.
        auto = {p: tuple(b for b in backends if b in prefs) for p, prefs in AUTO.items()}
        auto = {p: bs for p, bs in auto.items() if bs}
        params = []
        for v in spec.variants.values():
            params += [p.name for p in v.params if p.name not in params]
        return dict(
            self.common(),
            spec_path=spec_path,
            backends=backends,
            backends_tuple=_tuple(repr(b) for b in backends),
            platforms=repr(platforms),
            auto=repr(auto),
            params=params,
            params_dict="{" + ", ".join(f'"{p}": {p}' for p in params) + "}",
            vjp=spec.vjp is not None,
            out_dtype=self._out_dtype_returned(),
            reference_params=_tuple(repr(p.name) for p in next(iter(spec.variants.values())).params),
        )

    def _out_dtype_returned(self) -> str | None:
        """For the package function's out_dtype: per returned output, whether out_dtype sets its
        dtype (a tuple literal); None when no output's dtype is a map."""
        if not out_dtype_outputs(self.spec):
            return None
        return _tuple(repr(o.dtype_map is not None) for o in self.spec.outputs if not o.residual)

    def vjp(self, linked: tuple) -> dict:
        """_vjp.py: the custom_vjp around the kernel, calling the backward kernels `linked`
        (the backward KernelSpecs, in `vjp.backward` order)."""
        spec, vjp = self.spec, self.spec.vjp
        passed = list(dict.fromkeys(f for e in vjp.backward for f in e.params.values()))
        entries, grads = [], {}
        for entry, bspec in zip(vjp.backward, linked):
            by_output = {g.output: g for g in entry.grads}
            for o in bspec.outputs:
                g = by_output[o.name]
                grads[g.input] = f"_grad_{g.input}"
                if g.reduce:
                    extra = o.rank - spec.operand(g.input).rank
                    kind, what = _vjp.dtype_witness(spec, g.input)
                    dtype = {"fixed": jnp_dtype(what), "residual": f"{what}.dtype", "cotangent": f"_grad_{what}.dtype"}[kind]
                    grads[g.input] = f"_sum_partials(_grad_{g.input}, {extra}, {dtype})"
            args = [
                f"_grad_{b.source}" if b.cotangent else b.source
                for b in (entry.binding(op.name) for op in bspec.inputs)
            ]
            made = ", ".join(f"{g.output} -> {g.input}" + (" (summed)" if g.reduce else "") for g in entry.grads)
            entries.append({
                "package": bspec.name,
                "local": f"_{bspec.name}",
                "params": "{" + ", ".join(f'"{b}": _passed["{f}"]' for b, f in entry.params.items()) + "}",
                "args": args,
                "lhs": ", ".join(f"_grad_{by_output[o.name].input}" for o in bspec.outputs),
                "doc": f"{bspec.name}({', '.join(args)}): {made}",
            })
        outputs = [o.name for o in spec.outputs]
        residuals = list(vjp.residuals)
        returned = [o.name for o in spec.returned]
        return dict(
            self.common(),
            outputs=outputs,
            returned=returned,
            hidden=[o.name for o in spec.outputs if o.residual],
            outputs_lhs=", ".join(o.name if not o.residual else "_" for o in spec.outputs),
            returned_value=", ".join(returned),
            residuals=residuals,
            output_residuals=any(r in outputs for r in residuals),
            residuals_lhs=", ".join(residuals) if len(residuals) != 1 else f"({residuals[0]},)",
            residuals_value=_tuple(residuals),
            # a residual output is not returned: its cotangent is always zero, and unused
            cotangents=[f"_grad_{o.name}" if not o.residual else "_" for o in spec.outputs],
            entries=entries,
            packages=sorted({e["package"] for e in entries}),
            passed=passed,
            passed_on=literal({b: {f: v.param_defaults[f] for f in passed} for b, v in spec.variants.items()}),
            returns=_tuple(grads.get(name, "None") for name in self.inputs),
            sums=any(g.reduce for e in vjp.backward for g in e.grads),
        )

    def sharded(self) -> dict:
        """sharded.py: the mesh, the partition specs and the reductions of `sharding:`."""
        spec, sh = self.spec, self.spec.sharding

        def pspec(name: str) -> str:
            ps = sh.specs.get(name)
            entries = ps.dims if ps is not None else ()
            shown = ["None" if not a else f'"{a[0]}"' if len(a) == 1 else _tuple(f'"{x}"' for x in a) for a in entries]
            return f"P({', '.join(shown)})"

        def reduced(o) -> str:
            red = sh.reductions.get(o.name)
            if red is None:
                return o.name
            if red.op == GATHER:
                value = o.name
                for axis, dim in gather_dims(spec, o):
                    value = f'lax.all_gather({value}, "{axis}", axis={dim}, tiled=True, to="invarying")'
                return value
            axes = _tuple(f'"{a}"' for a in red.axes)
            return f"lax.{red.op}({o.name}, {axes})"

        out_specs = [pspec(o.name) for o in spec.returned]  # the kernel returns no residual output
        return dict(
            self.common(),
            outputs=[o.name for o in spec.returned],
            returns_expr=", ".join(reduced(o) for o in spec.returned),
            params=list(dict.fromkeys(p.name for v in spec.variants.values() for p in v.params)),
            mesh_axes="{" + ", ".join(f'"{a.name}": {a.size}' for a in sh.mesh) + "}",
            axis_names="frozenset({" + ", ".join(f'"{a}"' for a in sh.axis_names) + "})",
            in_specs=_tuple(pspec(o.name) for o in spec.inputs),
            out_specs=out_specs[0] if len(out_specs) == 1 else _tuple(out_specs),
            check_vma=sh.check_vma,
            has_tpu="mosaic_tpu" in spec.variants,
        )


def render(spec: KernelSpec, spec_path: str, tuned: dict | None = None, linked: tuple = (),
           package: str = "generated") -> dict:
    """{relative file name: content} for generated/<name>/. Content has no banner.

    `tuned`: {device_kind: [tuning entries]} from tuning/<name>/ (see codegen.tuning).
    `linked`: the backward KernelSpecs of the spec's `vjp:`, in order.
    `package`: the output folder's import path, as the docstrings show it.
    """
    ctx = _Context(spec, package)
    env = _env()
    files = {
        "_tuning.py": env.get_template("tuning.py.j2").render(ctx.tuning(tuned or {})),
        "__init__.py": env.get_template("package.py.j2").render(ctx.package(spec_path)),
        "_signature.py": env.get_template("signature.py.j2").render(ctx.signature()),
        "reference.py": env.get_template("reference.py.j2").render(ctx.reference()),
        "_dispatch.py": env.get_template("dispatch.py.j2").render(ctx.dispatch()),
    }
    for name, variant in spec.variants.items():
        template = "mesh.py.j2" if spec.kind == "mesh" else BACKENDS[name].template
        files[f"{name}.py"] = env.get_template(template).render(ctx.kernel(variant))
    if spec.sharding is not None:
        files["sharded.py"] = env.get_template("sharded.py.j2").render(ctx.sharded())
    if spec.vjp is not None:
        files["_vjp.py"] = env.get_template("vjp.py.j2").render(ctx.vjp(linked))
    for fname, text in files.items():
        ast.parse(text, filename=f"generated/{spec.name}/{fname}")  # a bug in kspec if this fails
    return files
