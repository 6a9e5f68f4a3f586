"""W902: a `cdiv` grid axis whose partial last block no case runs.

A grid axis of `cdiv(n, b)` programs exists to cover an extent n that b need not divide: the
last program's block hangs over the edge and the kernel must mask or clip it. If every declared
case makes n a multiple of b, only the ragged case verify derives (derive.py) runs that program. The warning fires only when a ragged case is possible: it suggests one, made from a
declared case by changing one dim, that passes every per-case check and hardware rule on every
backend (and, for a sharded spec, the per-shard checks). Where the spec rules ragged extents out
(a constraint `n % b == 0`, a backend's constraint, a hardware rule), no such case exists and
nothing is reported. Nothing here runs spec code: it evaluates the spec's expressions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kspec.codegen.checks.derive import cdiv_parts, ratio, runs
from kspec.codegen.diagnostics import Diagnostic
from kspec.codegen.spec.model import Case, KernelSpec, SpecKind

MAX_TRIES = 12  # candidate cases checked per axis before giving up on a suggestion


def check(spec: KernelSpec, valid: Callable[[Case], bool]) -> list:
    """W902 for each `cdiv` grid axis that no case makes ragged on some backend, when a
    ragged case (one that `valid` accepts) can be made from a declared one."""
    if spec.kind != SpecKind.PALLAS_CALL:
        return []
    axes: dict = {}  # (location, source) -> [(variant, axis index, numerator, denominator)]
    for v in spec.variants.values():
        for i, axis in enumerate(v.grid):
            parts = cdiv_parts(axis.size)
            if parts is not None:
                axes.setdefault((axis.size.loc, axis.size.source), []).append((v, i, *parts))
    out = []
    for (loc, _), users in axes.items():
        never = []
        for v, i, num, den in users:
            cases = [c for c in spec.cases if runs(spec, v, c)]
            values = [x for x in (ratio(v, c, num, den) for c in cases) if x is not None]
            if values and all(a % b == 0 for a, b in values):
                never.append((v, i, num, den))
        if never:
            found = _suggest(spec, never, valid)
            if found is not None:
                out.append(_warning(spec, never, users, loc, *found))
    return out


def _suggest(spec: KernelSpec, never: list, valid: Callable[[Case], bool]) -> tuple | None:
    """(a valid case that makes the axis ragged on every backend in `never`, the dim changed), or None."""
    v0, _, num, den = never[0]
    dims = [d for d in spec.dims if d in num.names]
    tries = 0
    for base in (c for c in spec.cases if runs(spec, v0, c)):
        at_base = ratio(v0, base, num, den)
        if at_base is None:
            continue
        b = at_base[1]
        half = max(b // 2, 1)
        for dim in dims:
            n = base.dims[dim]
            for value in dict.fromkeys((n + half, n - half, n + b + half, n + 1, n - 1)):
                if value < 1 or value == n:
                    continue
                candidate = dataclasses.replace(base, name=_name(spec, dim), dims={**base.dims, dim: value})
                ragged = [ratio(v, candidate, nu, de) for v, _, nu, de in never]
                if not all(r is not None and r[0] % r[1] for r in ragged):
                    continue
                if not all(runs(spec, v, candidate) for v, *_ in never):
                    continue  # a backend's own constraints rule it out there
                tries += 1
                if valid(candidate):
                    return candidate, dim
                if tries >= MAX_TRIES:
                    return None
    return None


def _name(spec: KernelSpec, dim: str) -> str:
    taken = {c.name for c in spec.cases}
    for name in ("ragged", f"ragged_{dim}", f"ragged_{dim.lower()}_edge"):
        if name not in taken:
            return name
    return next(f"ragged{k}" for k in range(2, len(taken) + 3) if f"ragged{k}" not in taken)


def _flow(case: Case) -> str:
    """The case as a YAML flow mapping, as a spec's `cases:` entry writes it."""
    parts = [f"name: {case.name}"] + [f"{d}: {n}" for d, n in case.dims.items()]
    if case.dtype is not None:
        dtype = case.dtype if isinstance(case.dtype, str) else "{" + ", ".join(f"{k}: {t}" for k, t in case.dtype.items()) + "}"
        parts.append(f"dtype: {dtype}")
    if case.params:
        parts.append("params: {" + ", ".join(f"{k}: {val}" for k, val in case.params.items()) + "}")
    return "{" + ", ".join(parts) + "}"


def _warning(spec: KernelSpec, never: list, users: list, loc, case: Case, dim: str) -> Diagnostic:
    v, i, num, den = never[0]
    axis = v.grid[i]
    label = f"`{axis.name}`" if axis.name else str(i)
    on = ""
    if len(never) < len(users):
        on = " on " + ", ".join(u[0].backend for u in never)
    n, b = ratio(v, case, num, den)
    return Diagnostic(
        "W902",
        f"grid axis {label} is {axis.size.shown}, but {num.shown} is a multiple of {den.shown} in every case{on}: "
        "no case runs its partial last block",
        loc,
        f"add a case with a ragged edge, e.g. `- {_flow(case)}` ({num.shown} = {n} is not a multiple of "
        f"{den.shown} = {b})",
        severity="warning",
    )
