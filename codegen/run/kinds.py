"""The kinds of input data verify runs a kernel on, and which kinds each input takes.

`normal` is the data verify always runs (standard normal floats; see inputs.py). The other kinds
are inputs that break kernels: large magnitudes (an exp that overflows), rows whose values are
all equal (a variance of zero), zero rows (a mean square of zero), very negative rows (an exp
that underflows to zero in every element), and, for the inputs that ask for it, rows whose product
with another input is very negative (attention scores whose every exp underflows). Each is one more
run of the kernel, against the reference on the same data. Pure Python: the `kspec` process plans with it without numpy or jax.
"""

from __future__ import annotations

from kspec.codegen.spec import dtypes as dt

NORMAL = "normal"
# kind -> what it is, as the docs and a failure's message say it (floats; integers in KIND_INTS)
KINDS = {
    "large": "standard normal x 30",
    "equal_rows": "rows 0, 2, 4, ... each one repeated value",
    "zero_rows": "rows 0, 2, 4, ... all zero",
    "negative_rows": "rows 0, 2, 4, ... near -1000",
    "opposed_rows": "rows 0, 2, 4, ... near -1000 in the first input taking it, |standard normal| + 0.5 in the others",
}
KIND_INTS = {
    "large": "the dtype's minimum and maximum",
    "equal_rows": "rows 0, 2, 4, ... each one repeated value",
    "zero_rows": "rows 0, 2, 4, ... all zero",
    "negative_rows": "rows 0, 2, 4, ... at the dtype's minimum (unsigned: zero)",
    "opposed_rows": "rows 0, 2, 4, ... at the dtype's minimum in the first input taking it, positive in the others",
}
# Kinds an input takes only where its `kinds` lists them: their data is made for a product of inputs
# (the first input that takes opposed_rows against the others), which no input gets by default.
OPT_IN = ("opposed_rows",)
SELECTIONS = ("default", "all", NORMAL)
# The other kinds can be ill-conditioned (a row of one value has variance zero, and rounding
# divided by sqrt(eps) is no longer small): their outputs pass when no element is NaN/Inf where the
# reference's is finite and rel_err is at most NORMWISE x rtol of the task's tolerance.
NORMWISE = 10  # --inputs: besides a list of kinds


def takes(op, dtype: str, spec=None) -> tuple:
    """The kinds (other than normal) that an input takes with this dtype: those its `kinds` lists,
    else every kind but the OPT_IN ones for a float or integer input without an `init` (an input with
    `init` keeps the data it declares; a scalar-prefetch input holds indices; bool inputs have no such
    kinds). An input that another input's initialiser keeps a structure with (`same_as`, an index's
    bounds; `spec`'s) takes none; one that init code reads may, and the code computes from that data."""
    if getattr(op, "prefetch", False) or dt.DTYPES.get(dtype, (0, "b"))[1] == "b":
        return ()
    if spec is not None and any(op.name in names for names in spec.init_keeps.values()):
        return ()
    declared = getattr(op, "kinds", None)
    if declared is not None:
        return tuple(k for k in KINDS if k in declared)
    return () if getattr(op, "init", None) is not None else tuple(k for k in KINDS if k not in OPT_IN)


def leads(spec, op, kind: str, assign: dict) -> bool:
    """Whether `op` is the first of the spec's inputs that takes `kind` under a dtype assignment: the
    one whose rows go negative in an `opposed_rows` run, the others' data being positive."""
    return next((o.name for o in spec.inputs if kind in takes(o, assign[o.name], spec)), None) == op.name


def available(spec, assign: dict) -> tuple:
    """The kinds that some input of the spec takes under a dtype assignment, in KINDS order."""
    taken = {k for op in spec.inputs for k in takes(op, assign[op.name], spec)}
    return tuple(k for k in KINDS if k in taken)


def parse(values: list) -> tuple:
    """--inputs values (repeatable, each a comma-separated list) -> ('default' | 'all' | 'normal',)
    or a tuple of kinds; raises ValueError naming what is not a kind."""
    words = [w.strip() for v in values or [] for w in v.split(",") if w.strip()]
    if not words:
        return ("default",)
    if len(words) == 1 and words[0] in SELECTIONS:
        return (words[0],)
    unknown = [w for w in words if w not in KINDS and w != NORMAL]
    if unknown:
        raise ValueError(f"unknown input kind {unknown[0]!r}; use default, all, normal or kinds from: "
                         + ", ".join(KINDS))
    return tuple(dict.fromkeys(w for w in words if w != NORMAL))


def chosen(selection: tuple, spec, assign: dict, case_index: int) -> tuple:
    """The input kinds one task runs, normal first. `default`: normal and one more kind, the
    spec's cases taking the kinds it offers in turn (case i gets the (i mod n)-th); `all`: every
    kind; `normal`: normal only; else normal and the listed kinds the spec's inputs take."""
    offered = available(spec, assign)
    if selection == ("default",):
        extra = (offered[case_index % len(offered)],) if offered else ()
    elif selection == ("all",):
        extra = offered
    elif selection == (NORMAL,):
        extra = ()
    else:
        extra = tuple(k for k in selection if k in offered)
    return (NORMAL,) + extra


def described(kind: str, dtypes: list) -> str:
    """How a failure names the inputs it ran on: `large inputs (standard normal x 30)`."""
    ints = [d for d in dtypes if dt.DTYPES.get(d, (0, "f"))[1] in "iu"]
    floats = [d for d in dtypes if d not in ints]
    what = KINDS[kind] if floats or not ints else KIND_INTS[kind]
    if floats and ints and KIND_INTS[kind] != KINDS[kind]:
        what += f"; integers: {KIND_INTS[kind]}"
    return f"{kind} inputs ({what})"
