"""Dtype facts kspec needs without importing jax, and the default tolerances."""

from __future__ import annotations

# name -> (itemsize in bytes, kind: b(ool) i(nt) u(nsigned) f(loat) c(omplex)).
# tests/unit/spec/test_dtypes.py checks every entry against jnp.dtype().
DTYPES: dict = {
    "bool": (1, "b"),
    "int4": (1, "i"),
    "int8": (1, "i"),
    "int16": (2, "i"),
    "int32": (4, "i"),
    "int64": (8, "i"),
    "uint8": (1, "u"),
    "uint16": (2, "u"),
    "uint32": (4, "u"),
    "uint64": (8, "u"),
    "float8_e4m3fn": (1, "f"),
    "float8_e5m2": (1, "f"),
    "float16": (2, "f"),
    "bfloat16": (2, "f"),
    "float32": (4, "f"),
    "float64": (8, "f"),
    "complex64": (8, "c"),
}

# Fraction bits: orders float dtypes by precision (fewer bits, looser tolerance).
_MANTISSA = {
    "float8_e5m2": 2,
    "float8_e4m3fn": 3,
    "bfloat16": 7,
    "float16": 10,
    "float32": 23,
    "complex64": 23,
    "float64": 52,
}

# Default tolerances by dtype. One place only. The rule (codegen/run/compare.py, docs/verify.md
# "Tolerances"): with s the RMS of the reference's finite values, an element passes when
# |out - ref| <= atol * s + rtol * |ref|, and an output when every element passes and
# ||out - ref|| / ||ref|| <= rel_err. scripts/calibrate_tolerances.py shows that the library's
# kernels pass and planted bfloat16 bugs fail under these numbers.
TOLERANCES: dict = {
    "float8_e5m2": {"atol": 0.25, "rtol": 0.25, "rel_err": 0.125},
    "float8_e4m3fn": {"atol": 0.125, "rtol": 0.125, "rel_err": 0.0625},
    "bfloat16": {"atol": 1e-2, "rtol": 1e-2, "rel_err": 5e-3},
    "float16": {"atol": 1e-2, "rtol": 5e-3, "rel_err": 1e-3},
    "float32": {"atol": 1e-4, "rtol": 1e-4, "rel_err": 1e-5},
    "complex64": {"atol": 1e-4, "rtol": 1e-4, "rel_err": 1e-5},
    "float64": {"atol": 1e-10, "rtol": 1e-10, "rel_err": 1e-11},
}
EXACT = {"atol": 0.0, "rtol": 0.0}  # integers and bool; no rel_err: compare bounds it by max(atol, rtol)


def itemsize(name: str) -> int:
    return DTYPES[name][0]


def is_float(name: str) -> bool:
    return DTYPES[name][1] in "fc"


def least_precise(names) -> str | None:
    """The float dtype with the fewest mantissa bits among `names`, if any."""
    floats = [n for n in names if n in _MANTISSA]
    return min(floats, key=_MANTISSA.__getitem__) if floats else None


def tolerance(names, *overrides) -> dict:
    """The tolerance for a case whose operands have dtypes `names`: {"atol", "rtol", "rel_err"} of
    the least precise float dtype among them (integers and bool alone: EXACT).

    `overrides` are per-dtype tables (the spec's, then the case's), later ones win. An entry's
    `grad` ({"atol", "rtol", "rel_err"}, any of them) bounds the gradients of a grad row apart from
    its outputs, over that entry's own bounds: the gradients' table is the defaults, then each
    entry's bounds and then its `grad`, in order. Where it differs from the outputs' table it is kept
    under "grad", and `for_gradients` applies it.
    """
    key = least_precise(names)
    if key is None:
        tol = dict(EXACT)
        key = next(iter(names), "")
    else:
        tol = dict(TOLERANCES[key])
    grad = dict(tol)
    for table in overrides:
        entry = dict(table.get(key, {}))
        own = entry.pop("grad", None) or {}
        tol.update(entry)
        grad.update(entry)
        grad.update(own)
    if grad != tol:
        tol["grad"] = {k: v for k, v in grad.items() if tol.get(k) != v}
    return tol


def for_outputs(tol: dict) -> dict:
    """A tolerance table (`tolerance`'s) as it holds the outputs: without the gradients' own bounds."""
    return {k: v for k, v in tol.items() if k != "grad"}


def for_gradients(tol: dict) -> dict:
    """A tolerance table (`tolerance`'s) as it holds gradients: its `grad` bounds over the others."""
    return {**for_outputs(tol), **tol.get("grad", {})}
