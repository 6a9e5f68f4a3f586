"""One backend's module of the package: the function that checks a call, resolves its params
and runs the kernel."""

from __future__ import annotations

import ast
import dataclasses

from kspec.codegen.backends import BACKENDS
from kspec.codegen.emit import blocks, mesh
from kspec.codegen.emit.signature import Signature
from kspec.codegen.emit.source import dtype_src, grid_indices, jnp_dtype, literal, out_dtype_outputs, tuple_src
from kspec.codegen.spec.model import SpecKind, Variant


def kernel(sig: Signature, variant: Variant) -> dict:
    """The context of one backend's module: its pallas_call, or its mesh kernel."""
    if sig.spec.wrapper is not None:
        return _wrapped(sig, variant)
    spec = sig.spec
    backend = BACKENDS[variant.backend]
    refs = [f"{o.name}_ref" for o in spec.call_order + spec.outputs] + [f"{s.name}_ref" for s in variant.scratch]
    indices = grid_indices(variant)
    kwargs = [p.name for p in variant.params] + list(spec.dims) + list(spec.mesh_sizes)
    static = [p.name for p in variant.params] + (["interpret"] if backend.interpret == "interpret" else [])
    static += ["residuals"] if sig.with_residuals else []
    static += ["out_dtype"] if out_dtype_outputs(spec) else []
    # manual_axis_type: inside jax.shard_map(check_vma=True) the outputs vary over the
    # mesh axes the inputs vary over; outside it is empty and changes nothing.
    varying = f"_signature.manual_axis_type({', '.join(sig.inputs)})"
    out_shapes = [
        f"jax.ShapeDtypeStruct({tuple_src(e.render() for e in o.shape)}, {dtype_src(spec, o)}, "
        f"manual_axis_type={varying})"
        for o in spec.outputs
    ]
    out_specs = [blocks.block_spec(spec, variant, o) for o in spec.outputs]
    padded_inputs, padded_outputs, cropped = blocks.whole_blocks(spec, variant)
    if cropped:
        out_shapes = [
            f"jax.ShapeDtypeStruct({padded_outputs.get(o.name) or tuple_src(e.render() for e in o.shape)}, "
            f"{dtype_src(spec, o)}, manual_axis_type={varying})"
            for o in spec.outputs
        ]
    unwritten = blocks.unwritten(spec, variant)
    if unwritten:
        # The residual outputs are in the call only when asked for: the lists name them all,
        # and _runtime.written keeps the others unless residuals=True.
        omitted = tuple_src(str(n) for n, _ in unwritten)
        out_shapes = [f"_runtime.written([{', '.join(out_shapes)}], residuals, {omitted})"]
        out_specs = [f"_runtime.written([{', '.join(out_specs)}], residuals, {omitted})"]
        cropped = f"_runtime.written({cropped}, residuals, {omitted})" if cropped else None
    input_docs = [
        f"{o.name}: [{', '.join(e.shown for e in o.shape)}] "
        f"{'same dtype as ' + o.follows if o.follows else ' | '.join(o.dtypes)}"
        + (f". {o.doc.strip()}" if o.doc else "")
        for o in spec.inputs
    ]
    out = dict(
        sig.common(),
        backend=backend,
        body=variant.body.source,
        kernel_refs=refs,
        grid_indices=indices,  # {name: axis} of the named grid indices the body reads
        kernel_kwargs=kwargs,
        mesh_sizes=list(spec.mesh_sizes.items()),
        params=sig.params(variant),
        signature=sig.signature_of(
            variant,
            (("interpret=False",) if backend.interpret == "interpret" else ())
            + (("residuals=False",) if sig.with_residuals else ())
            + (("out_dtype=None",) if out_dtype_outputs(spec) else ()),
            tuned=True,
        ),
        tunable=[p.name for p in variant.params if p.resolved],
        untuned=[p.name for p in variant.params if not p.resolved],
        static_argnames=tuple_src(f'"{s}"' for s in static),
        input_docs=input_docs,
        out_shape=out_shapes[0] if len(out_shapes) == 1 else "[" + ", ".join(out_shapes) + "]",
        grid=tuple_src(_grid_size(spec, a) for a in variant.grid),
        in_specs=[blocks.block_spec(spec, variant, o) for o in spec.call_order if not o.prefetch],
        call_inputs=[o.name for o in spec.call_order],
        num_scalar_prefetch=len(spec.prefetched),
        aliases=blocks.aliases(spec),
        alias_docs=[f"{o} is written in place of {i}" for o, i in spec.aliases.items()],
        call_name=spec.call.name or spec.name,
        metadata=literal(dict(sorted(spec.call.metadata.items()))) if spec.call.metadata else None,
        debug=spec.call.debug,
        out_specs=out_specs[0] if len(out_specs) == 1 else "[" + ", ".join(out_specs) + "]",
        scratch_shapes=[blocks.scratch_shape(spec, variant, s) for s in variant.scratch],
        scratch_inits=[(f"{s.name}_ref", literal(s.init)) for s in variant.scratch if s.init is not None],
        compiler_params=blocks.compiler_params(variant.backend, variant.compiler_params),
        dtype_limits=[(name, tuple_src(jnp_dtype(d) for d in allowed)) for name, allowed in variant.dtypes.items()],
        cost_estimate=blocks.cost(spec),
        padded_inputs=padded_inputs,
        cropped=cropped,
        with_residuals=sig.with_residuals,
        residual_names=[o.name for o in spec.outputs if o.residual],
        keep=blocks.keep(spec),
        # The residual outputs the kernel writes only when asked for (residuals=True), as (position,
        # value) pairs for _runtime.inserted: among the kernel's refs, each one's _runtime.Unwritten;
        # among the call's results, None. None without such outputs.
        sinks=tuple_src(f"({len(spec.call_order) + n}, {sink})" for n, sink in unwritten) if unwritten else None,
        unwritten_nones=tuple_src(f"({n}, None)" for n, _ in unwritten),
    )
    if spec.kind == SpecKind.MESH:
        out.update(mesh.mesh(spec, variant))
    elif backend.name == "mosaic_gpu":
        out.update(mesh.gpu_pipeline(spec, variant))  # its compiler_params lose the pipeline's fields
    return out


def _wrapped(sig: Signature, variant: Variant) -> dict:
    """A backend module of a spec with a prologue or epilogue: the pallas_call on the kernel's
    own operands (the kernel view's context), inside the function of the spec's inputs, which
    runs the prologue before it and the epilogue after it."""
    spec, w = sig.spec, sig.spec.wrapper
    out = kernel(Signature(spec.kernel_view, sig.import_path), variant)
    facing = kernel(Signature(dataclasses.replace(spec, wrapper=None), sig.import_path), variant)
    for key in ("signature", "static_argnames", "input_docs", "returns", "with_residuals", "residual_names",
                "bind_params", "dims_lhs", "doc"):
        out[key] = facing[key]
    kernel_inputs, kernel_outputs = [o.name for o in w.inputs], [o.name for o in w.outputs]
    static = [p.name for p in variant.params] + list(spec.dims)
    # The body learns which optional inputs the call gave: a static `has_<name>` each.
    given = [o for o in spec.inputs if o.optional]
    out["kernel_kwargs"] = out["kernel_kwargs"] + [o.given_flag for o in given]
    out["wrapper"] = {
        "user_inputs": sig.inputs,
        "kwargs": ", ".join(f"{k}={k}" for k in static),
        "params": static,
        "prologue": w.prologue.source if w.prologue is not None else None,
        "epilogue": w.epilogue.source if w.epilogue is not None else None,
        "kernel_inputs": kernel_inputs,
        "kernel_outputs": kernel_outputs,
        "kernel_inputs_lhs": ", ".join(kernel_inputs),  # one: the prologue returns it, not a tuple
        "kernel_outputs_lhs": ", ".join(kernel_outputs),
        "kernel_shapes": [(o.name, tuple_src(e.render() for e in o.shape)) for o in w.inputs],
        "given": [(o.given_flag, o.name) for o in given],
        # the epilogue returns every output; the function, the others unless residuals=True
        "keep": facing["keep"] if w.epilogue is not None else None,
    }
    # _kernel_call returns every kernel output (None for a residual one not written), in order
    out["keep"] = None
    return out


def _grid_size(spec, axis) -> str:
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
