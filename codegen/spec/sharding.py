"""The `sharding:` section as a frozen `Sharding`: the kernel on a device mesh, wrapped in jax.shard_map.

`build(doc)` turns the schema-valid section into the model; its checks (E8xx) are in
codegen/checks/sharding.py. An axis sized by the device count (`devices`) has no size until a
run knows how many devices there are.
"""


from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from kspec.codegen.diagnostics import Location

REDUCTIONS = ("psum", "pmax", "pmin")  # lax collectives an output may be reduced with
GATHER = "all_gather"  # the collective that gathers an output's shards along a dim the inputs split
# Names `<kernel>_sharded` takes or calls: operands and params may not shadow them.
SHARDED_NAMES = frozenset({"mesh", "make_mesh", "select_sharded_backend"})


@dataclasses.dataclass(frozen=True)
class DeviceAxis:
    name: str
    size: int | None  # None: the devices left over after the sized axes
    loc: Location


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
    """One operand's split: per dim, the mesh axes it is split over (() = not split)."""

    operand: str
    dims: tuple  # of tuples of axis names
    dim_locs: tuple  # of Location, one per entry
    loc: Location


@dataclasses.dataclass(frozen=True)
class Reduction:
    output: str
    op: str  # one of REDUCTIONS, or GATHER
    axes: tuple
    loc: Location


@dataclasses.dataclass(frozen=True)
class Sharding:
    mesh: tuple  # of DeviceAxis, in mesh order
    specs: Mapping[str, PartitionSpec]  # operand -> spec; operands left out are replicated
    axis_names: tuple  # the manual axes, in mesh order
    check_vma: bool
    reductions: Mapping[str, Reduction]
    loc: Location
    axis_names_loc: Location
    mesh_only: bool = False  # runs only on a mesh: single-device verify and lowering skip it

    def split(self, operand: str, rank: int) -> tuple:
        """The operand's axes per dim, padded to its rank."""
        spec = self.specs.get(operand)
        dims = spec.dims if spec is not None else ()
        return tuple(dims) + ((),) * max(rank - len(dims), 0)

    def sizes(self, devices: int | None = None) -> dict:
        """Axis -> size; the `devices` axis is None unless `devices` is given (and divides)."""
        fixed = math.prod(a.size for a in self.mesh if a.size is not None)
        rest = devices // fixed if devices and devices % fixed == 0 else None
        return {a.name: a.size if a.size is not None else rest for a in self.mesh}

    def unfit(self, devices: int) -> str | None:
        """Why this mesh cannot be built from `devices` devices; None if it can."""
        fixed = math.prod(a.size for a in self.mesh if a.size is not None)
        shape = ", ".join(f"{a.name}={a.size or 'devices'}" for a in self.mesh)
        if any(a.size is None for a in self.mesh):
            return None if devices % fixed == 0 else f"mesh ({shape}) needs a multiple of {fixed} devices, have {devices}"
        return None if fixed <= devices else f"mesh ({shape}) needs {fixed} devices, have {devices}"


def _axes(value) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def build(doc) -> Sharding | None:
    """The `sharding:` section of a schema-valid document as a Sharding; None without one."""
    raw = doc.data.get("sharding")
    if raw is None:
        return None
    at = ("sharding",)
    mesh = tuple(
        DeviceAxis(name, size if isinstance(size, int) else None, doc.key_loc(at + ("mesh", name)))
        for name, size in raw["mesh"].items()
    )
    specs = {
        name: PartitionSpec(
            name,
            tuple(_axes(v) for v in entries),
            tuple(doc.loc(at + ("specs", name, i)) for i in range(len(entries))),
            doc.key_loc(at + ("specs", name)),
        )
        for name, entries in (raw.get("specs") or {}).items()
    }
    reductions = {}
    for name, entry in (raw.get("reductions") or {}).items():
        (op, axes), = entry.items()
        reductions[name] = Reduction(name, op, _axes(axes), doc.key_loc(at + ("reductions", name)))
    return Sharding(
        mesh=mesh,
        specs=specs,
        axis_names=tuple(raw.get("axis_names") or (a.name for a in mesh)),
        check_vma=raw.get("check_vma", True),
        reductions=reductions,
        loc=doc.key_loc(at),
        axis_names_loc=doc.loc(at + ("axis_names",)),
        mesh_only=raw.get("mesh_only", False),
    )
