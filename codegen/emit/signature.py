"""What every module of a generated package shares: the inputs and the dims bound from their
shapes, the checks on them (_signature.py), what the functions return, and how a backend's
signature is spelled."""

from __future__ import annotations

from kspec.codegen.emit.source import jnp_dtype, literal, out_dtype_outputs, tuple_src
from kspec.codegen.spec.expr import Expr
from kspec.codegen.spec.model import KernelSpec, Variant


class Signature:
    """What every module of the package shares: the inputs, the dims bound from their shapes, the
    checks on them, what the functions return, and how their signatures are spelled."""

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
                self.shape_checks.append((op.name, tuple_src(e.render() for e in op.shape), uses))
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
            "input_args": self.input_args(),
            "optional": [o.name for o in spec.inputs if o.optional],
        }

    def signature(self) -> dict:
        ranks = [(o.name, o.rank) for o in self.spec.inputs]
        dtype_checks = [
            (o.name, tuple_src(f"{o.follows}.dtype" for _ in [0]) if o.follows else tuple_src(jnp_dtype(d) for d in o.dtypes))
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

    @property
    def reference_variant(self) -> Variant:
        """The variant whose params the reference takes (the spec's first backend: the spec's own params)."""
        return next(iter(self.spec.variants.values()))

    @property
    def reference_forward(self) -> bool:
        """Whether the reference can stand in for the forward kernel under autodiff: a `vjp:`, no
        residual outputs (the reference does not write them) and no dtype maps (out_dtype)."""
        spec = self.spec
        return spec.vjp is not None and not any(o.residual for o in spec.outputs) and not out_dtype_outputs(spec)

    @property
    def reference_gradient(self) -> bool:
        """Whether backend="auto" may differentiate the reference instead of running the backward
        kernels, where `kspec tune --grad` measured them slower (dispatch.reference_when_faster)."""
        return self.spec.reference_when_faster and self.reference_forward

    @property
    def reference_params(self) -> str:
        """The names of the params the reference takes, as a tuple literal."""
        return tuple_src(repr(p.name) for p in self.reference_variant.params)

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
        return ", ".join(self.input_args() + (["*"] + kwargs if kwargs else []))

    def input_args(self) -> list:
        """The inputs as the public functions take them: an optional input defaults to None."""
        return [f"{o.name}=None" if o.optional else o.name for o in self.spec.inputs]
