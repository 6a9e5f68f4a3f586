"""Checks of the `sharding:` section (E8xx): axis names, partition specs against their
operands, outputs against reductions, and, per case, that the split dims divide evenly and
that the per-shard problem (dims divided by their mesh axes) passes the block, grid and
backend rules. The section's model is codegen/spec/sharding.py.

An axis sized by the device count (`devices`) has no size until a run knows how many
devices there are: `kspec verify --devices N` calls `case_checks` with the sizes then.
"""

from __future__ import annotations

import dataclasses
import math

from kspec.codegen.checks import instances
from kspec.codegen.backends import rules
from kspec.codegen.diagnostics import Diagnostic, did_you_mean
from kspec.codegen.spec.sharding import GATHER, SHARDED_NAMES, Sharding


def check(spec, per_case: bool = True) -> list:
    """Every E8xx diagnostic of the spec's sharding; the per-case ones only with `per_case`
    (the caller turns them off while the spec has other errors)."""
    sh = spec.sharding
    out = _mesh(sh) + _names(spec, sh)
    if out:
        return out
    split, out = dim_split(spec)
    out += _outputs(spec, sh, split)
    if out or not per_case:
        return out
    sizes = sh.sizes()
    for case in spec.cases:
        out += case_checks(spec, case, sizes, split)
    return out


def _mesh(sh: Sharding) -> list:
    free = [a for a in sh.mesh if a.size is None]
    return [
        Diagnostic(
            "E807",
            f"mesh axes `{free[0].name}` and `{a.name}` are both sized by the device count",
            a.loc,
            "size every axis but one with an integer",
        )
        for a in free[1:]
    ]


def _names(spec, sh: Sharding) -> list:
    """E800 (unknown or non-manual axes), E801 (an axis twice in one spec), E802 (specs
    and reductions that do not fit their operand)."""
    out = []
    mesh = [a.name for a in sh.mesh]
    manual = set(sh.axis_names)

    def known(axis: str, loc, used_in: str) -> bool:
        if axis not in mesh:
            out.append(Diagnostic("E800", f"{used_in}: unknown mesh axis `{axis}`", loc,
                                  did_you_mean(axis, mesh) or f"mesh axes: {', '.join(mesh)}"))
            return False
        if axis not in manual and used_in != "axis_names":
            out.append(Diagnostic("E800", f"{used_in}: mesh axis `{axis}` is not manual", loc,
                                  f"add it to sharding.axis_names ({', '.join(sh.axis_names)})"))
            return False
        return True

    for axis in sh.axis_names:
        known(axis, sh.axis_names_loc, "axis_names")
    named = [(o.name, o.role, o.loc) for o in spec.operands] + [
        (p.name, "param", p.loc) for v in spec.variants.values() for p in v.params
    ]
    for name, what, loc in named:
        if name in SHARDED_NAMES:
            out.append(Diagnostic("E400", f"{what} `{name}` clashes with a name the generated sharded.py uses", loc,
                                  f"rename it; sharded specs also reserve {', '.join(sorted(SHARDED_NAMES))}"))
    operands = {o.name: o for o in spec.operands}
    for name, ps in sh.specs.items():
        op = operands.get(name)
        if op is None:
            out.append(Diagnostic("E802", f"partition spec for unknown operand `{name}`", ps.loc,
                                  did_you_mean(name, operands)))
            continue
        if op.residual:
            out.append(Diagnostic("E802", f"partition spec for `{name}`, a residual output, which the sharded "
                                  "function does not return", ps.loc, f"drop the partition spec of {name}"))
            continue
        if len(ps.dims) > op.rank:
            out.append(Diagnostic("E802", f"{name}: partition spec has {len(ps.dims)} entries but {name} has rank {op.rank}",
                                  ps.loc, "give at most one entry per dim; null leaves a dim whole"))
        seen: dict = {}
        for d, (axes, loc) in enumerate(zip(ps.dims, ps.dim_locs)):
            for axis in axes:
                if axis in seen:
                    out.append(Diagnostic("E801", f"{name}: mesh axis `{axis}` appears twice in the partition spec",
                                          loc, "a mesh axis can split at most one dim of an operand, once"))
                elif known(axis, loc, name):
                    seen[axis] = d
            if axes and d < op.rank and not _plain_dim(spec, op.shape[d]):
                out.append(Diagnostic("E802", f"{name}: dim {d} is `{op.shape[d].source}`; only a dim named alone "
                                      "in the shape can be split", loc, "split a dim whose shape entry is a dim name"))
    for name, red in sh.reductions.items():
        if name not in {o.name for o in spec.returned}:
            out.append(Diagnostic("E802", f"reduction for `{name}`, which is not a returned output", red.loc,
                                  did_you_mean(name, [o.name for o in spec.returned])))
        for axis in red.axes:
            known(axis, red.loc, f"{name} {red.op}")
    return out


def _plain_dim(spec, e) -> bool:
    return e is not None and e.source in spec.dims


def dim_split(spec) -> tuple:
    """({dim: axes it is split over}, E803 diagnostics): a dim is split the same way in every
    input it appears in, or the per-shard inputs would disagree on its size."""
    sh = spec.sharding
    split: dict = {}
    where: dict = {}
    out = []
    for op in spec.inputs:
        for d, (e, axes) in enumerate(zip(op.shape, sh.split(op.name, op.rank))):
            if not _plain_dim(spec, e):
                continue
            dim = e.source
            if dim not in split:
                split[dim], where[dim] = axes, op.name
            elif split[dim] != axes:
                ps = sh.specs.get(op.name)
                loc = ps.dim_locs[d] if ps is not None and d < len(ps.dim_locs) else op.loc
                out.append(Diagnostic("E803", f"dim {dim} is split over {_shown(axes)} in {op.name} but over "
                                      f"{_shown(split[dim])} in {where[dim]}", loc,
                                      f"split {dim} the same way in every input"))
    return split, out


def gather_dims(spec, op, split: dict | None = None) -> list:
    """[(axis, dim)]: for an output with `all_gather` over some axes, each axis with the output
    dim that the inputs split over it (the dim lax.all_gather gathers along); an axis that
    splits none of its dims is left out (E805 reports it)."""
    red = spec.sharding.reductions.get(op.name)
    if red is None or red.op != GATHER:
        return []
    if split is None:
        split, _ = dim_split(spec)
    out = []
    for axis in red.axes:
        dims = [d for d, e in enumerate(op.shape) if _plain_dim(spec, e) and axis in split.get(e.source, ())]
        if dims:
            out.append((axis, dims[0]))
    return out


def _shown(axes: tuple) -> str:
    return "(" + ", ".join(axes) + ")" if axes else "nothing"


def _outputs(spec, sh: Sharding, split: dict) -> list:
    """E805: each output dim is split as its dim is in the inputs, and every axis the inputs
    are split over either splits the output or is reduced over."""
    out = []
    input_axes = {a for op in spec.inputs for axes in sh.split(op.name, op.rank) for a in axes}
    for op in spec.returned:  # a residual output stays inside the kernel's custom_vjp
        ps = sh.specs.get(op.name)
        loc = ps.loc if ps is not None else sh.loc
        own = sh.split(op.name, op.rank)
        red = sh.reductions.get(op.name)
        gathered = set(red.axes) if red and red.op == GATHER else set()
        for d, (e, axes) in enumerate(zip(op.shape, own)):
            want = split.get(e.source, ()) if _plain_dim(spec, e) else ()
            want = tuple(a for a in want if a not in gathered)  # gathered: whole along those axes
            if axes != want:
                dim_loc = ps.dim_locs[d] if ps is not None and d < len(ps.dim_locs) else loc
                out.append(Diagnostic("E805", f"{op.name}: dim {d} ({e.source}) is split over {_shown(axes)} but the "
                                      f"inputs split {e.source} over {_shown(want)}", dim_loc,
                                      f"split {op.name} dim {d} as the inputs split {e.source}"))
        reduced = set(red.axes) if red else set()
        mine = {a for axes in own for a in axes}
        found = {axis for axis, _ in gather_dims(spec, op, split)}
        for axis in sorted(gathered - found):
            out.append(Diagnostic("E805", f"{op.name}: gathered over `{axis}`, which splits none of its dims in the "
                                  "inputs", red.loc, f"all_gather collects the shards of a dim that the inputs split "
                                  f"over {axis}; drop it, or use psum for partial results"))
        reduced -= gathered - found  # reported just now
        for axis in sorted(input_axes - mine - reduced, key=[a.name for a in sh.mesh].index):
            out.append(Diagnostic("E805", f"{op.name}: the inputs are split over `{axis}` but {op.name} is neither "
                                  f"split nor reduced over it", loc,
                                  f"add `reductions: {{{op.name}: {{psum: [{axis}]}}}}` if each shard holds a partial "
                                  f"{op.name}, or split {op.name} over {axis}"))
        for axis in sorted(reduced & mine):
            out.append(Diagnostic("E805", f"{op.name}: reduced over `{axis}`, which also splits it", red.loc))
        for axis in sorted(reduced - gathered - input_axes - mine):
            out.append(Diagnostic("E805", f"{op.name}: reduced over `{axis}`, which splits no input", red.loc,
                                  f"every shard along {axis} holds the same {op.name}: drop the reduction"))
    return out


def case_checks(spec, case, sizes: dict, split: dict | None = None) -> list:
    """E804 and E806 for one case, with the axis sizes known (None for an unsized axis:
    its dims are checked against the sized axes only, and per shard not at all)."""
    if split is None:
        split, _ = dim_split(spec)
    out, per_shard = [], dict(case.dims)
    for dim, axes in split.items():
        if not axes or dim not in case.dims:
            continue
        known = math.prod(sizes[a] for a in axes if sizes.get(a))
        n = case.dims[dim]
        if n % known:
            shown = " x ".join(f"{a}={sizes[a]}" for a in axes if sizes.get(a))
            out.append(Diagnostic("E804", f"case `{case.name}`: {dim}={n} is split over {shown} = {known} devices, "
                                  "which does not divide it", case.loc, f"make {dim} a multiple of {known}"))
        if any(sizes.get(a) is None for a in axes):
            per_shard = None
        elif per_shard is not None:
            per_shard[dim] = n // known
    if out or per_shard is None or per_shard == dict(case.dims):
        return out
    return _per_shard(spec, dataclasses.replace(case, dims=per_shard))


def _per_shard(spec, case) -> list:
    """E806: the block, grid and backend rules on the per-shard problem."""

    shown = ", ".join(f"{k}={v}" for k, v in case.dims.items())
    out = []
    for variant in spec.variants.values():
        for dtypes in instances.dtype_assignments(spec, case):
            if not variant.supports(dtypes):
                continue
            inst, found = instances.instantiate(spec, variant, case, dtypes)
            found += rules.check(inst) if inst is not None else []
            out += [
                Diagnostic("E806", f"per shard ({shown}): {d.message} [{d.code}]", d.loc, d.hint)
                for d in found
                if d.severity == "error"
            ]
    return out
