"""sharded.py: the spec's `sharding:` as a jax.shard_map around the kernel."""

from __future__ import annotations

from kspec.codegen.checks.sharding import gather_dims
from kspec.codegen.spec.sharding import GATHER
from kspec.codegen.emit.signature import Signature
from kspec.codegen.emit.source import tuple_src


def sharded(sig: Signature) -> dict:
    """sharded.py: the mesh, the partition specs and the reductions of `sharding:`."""
    spec, sh = sig.spec, sig.spec.sharding

    def pspec(name: str) -> str:
        ps = sh.specs.get(name)
        entries = ps.dims if ps is not None else ()
        shown = ["None" if not a else f'"{a[0]}"' if len(a) == 1 else tuple_src(f'"{x}"' for x in a) for a in entries]
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
        axes = tuple_src(f'"{a}"' for a in red.axes)
        return f"lax.{red.op}({o.name}, {axes})"

    out_specs = [pspec(o.name) for o in spec.returned]  # the kernel returns no residual output
    return dict(
        sig.common(),
        outputs=[o.name for o in spec.returned],
        returns_expr=", ".join(reduced(o) for o in spec.returned),
        params=list(dict.fromkeys(p.name for v in spec.variants.values() for p in v.params)),
        mesh_axes="{" + ", ".join(f'"{a.name}": {a.size}' for a in sh.mesh) + "}",
        axis_names="frozenset({" + ", ".join(f'"{a}"' for a in sh.axis_names) + "})",
        in_specs=tuple_src(pspec(o.name) for o in spec.inputs),
        out_specs=out_specs[0] if len(out_specs) == 1 else tuple_src(out_specs),
        check_vma=sh.check_vma,
        has_tpu="mosaic_tpu" in spec.variants,
    )
