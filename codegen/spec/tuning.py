"""Tuning data: tuning/<kernel>/<device_kind>.json, written by `kspec tune`, read by codegen.

Each file holds every trial of one kernel on one device kind, appended (atomically
rewritten) as results come, so a stopped run resumes where it was. An entry is keyed
by backend, shape bucket, dtype, jax version, kernel hash, params, how it was timed
(alone, or `load: "sustained"` against the reference: `kspec tune --sustained`) and the
case (shape) it ran, so that a bucket's config is chosen over all of its tuned shapes; the
kernel hash covers what decides the generated kernel (not docs, cases or tolerances, nor which
values a param offers the tuner or a backend's shared-memory estimate, nor the reference or the inputs' test data: `init`, `kinds`), and
entries whose hash differs from the spec's are stale: `kspec check` reports them and codegen
ignores them. An entry tuned with a
value the spec no longer offers is kept but not embedded. An entry timed against the reference
also records the reference's own hash: after the reference changes, such entries still rank
the kernel's configs, but only a comparison with the current reference decides where
backend="auto" calls the reference instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from kspec.codegen.diagnostics import Diagnostic, Location
from kspec.codegen.spec import loader
from kspec.templates import runtime as _runtime

# Spec keys that do not change the generated kernel: editing them keeps tuning valid.
# (`vjp` adds the backward pass around the kernel; the kernel itself stays the same. The reference
# is hashed apart, `reference_sha`: what a sustained or grad entry was compared with.)
_NOT_KERNEL = ("doc", "cases", "bench", "tolerance", "vjp", "competitors", "dispatch", "families", "reference")


def _params_view(params):
    """A params mapping as the kernel sees it: each param's doc dropped, and its choices reduced to whether
    it has any. Offering more or fewer values leaves every recorded entry's kernel as it was; `best` skips
    the entries whose values are no longer offered."""
    if not isinstance(params, dict):
        return params
    view = {}
    for name, p in params.items():
        if isinstance(p, dict):
            p = {k: (True if k == "choices" else v) for k, v in p.items() if k != "doc"}
        view[name] = p
    return view


def _backend_view(backend):
    """A backend's overrides as the kernel sees them: its params as `_params_view` has them, and without
    its `shared_memory` estimate, which decides which configs run, not what a config's kernel is."""
    if not isinstance(backend, dict):
        return backend
    view = {k: v for k, v in backend.items() if k != "shared_memory"}
    if "params" in view:
        view["params"] = _params_view(view["params"])
    return view


def kernel_sha(data: dict) -> str:
    """Hash of the spec parts that decide the generated kernel code."""
    kept = {k: v for k, v in data.items() if k not in _NOT_KERNEL}
    if isinstance(kept.get("inputs"), dict):  # an input's `init` and `kinds` say what verify feeds it, not what runs
        kept["inputs"] = {n: ({k: v for k, v in i.items() if k not in ("init", "kinds")} if isinstance(i, dict) else i)
                          for n, i in kept["inputs"].items()}
    if "params" in kept:
        kept["params"] = _params_view(kept["params"])
    if isinstance(kept.get("backends"), dict):
        kept["backends"] = {b: _backend_view(v) for b, v in kept["backends"].items()}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def reference_sha(data: dict) -> str:
    """Hash of the spec's reference: what sustained and grad entries were timed against."""
    text = json.dumps({"reference": data.get("reference")}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# The module every generated package shares (rendered as generated/_runtime.py) defines the shape
# bucket and the dtype label once, for the tables kspec writes and the packages that read them.
bucket = _runtime.bucket  # each dim rounded up to a power of two
dtype_label = _runtime.dtype_label_of  # the inputs' dtype names, each once, in order: "bfloat16,float32"


def case_dtype_label(spec, case, assign: dict) -> str:
    """The dtype label of a case's call: its inputs' dtypes, without the optional inputs it leaves
    out, as a generated package labels a call that passes None for them."""
    return dtype_label(assign[o.name] for o in spec.inputs if o.name not in case.absent)


def file_name(device_kind: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", device_kind).strip("_") + ".json"


def tuning_dir(out_root: Path) -> Path:
    """tuning/ beside generated/."""
    return out_root.parent / "tuning"


def fixed(entry: dict) -> tuple:
    """The entry's untuned params (e.g. causal): part of what a config was tuned for."""
    return tuple(sorted(entry.get("fixed", {}).items()))


GRAD = "grad"


def how_timed(entry: dict) -> str:
    """How the entry was timed: "alone" (by itself, at the clocks it found), "sustained"
    (in alternation with the reference under load, `kspec tune --sustained`) or "grad" (the
    forward and backward pass together, against the reference's autodiff, `kspec tune --grad`:
    its params are the forward's config, not a candidate)."""
    return entry.get("load", "alone")


def grad_sha(forward_sha: str, backward_shas, reference: str) -> str:
    """The hash a grad entry is recorded for: the forward kernel's and its backward kernels'
    (`vjp:` order), and the reference's (`reference_sha`: its autodiff is what the entry was
    timed against), so that a change to any of them makes the entry stale."""
    return hashlib.sha256(":".join([forward_sha, *backward_shas, reference]).encode()).hexdigest()


def cost(entry: dict):
    """What ranks passing entries of one load, lower first: the time alone, or the time relative
    to the reference in the same rounds (1 / speedup) when sustained; None for a failed entry."""
    if entry.get("status") != "pass" or entry.get("ms") is None:
        return None
    if how_timed(entry) in ("sustained", GRAD):
        return 1.0 / entry["speedup"] if entry.get("speedup") else None
    return entry["ms"]


def key(entry: dict) -> tuple:
    """What makes a trial new: a config timed at another case (shape) of a recorded bucket is one,
    so that a bucket's config can be chosen for all of its shapes (`best`)."""
    return (
        entry["backend"], tuple(entry["bucket"]), entry["dtype"], fixed(entry), entry["jax_version"],
        entry["kernel_sha"], tuple(sorted(entry["params"].items())), how_timed(entry), entry.get("reference_sha"),
        entry.get("case"),
    )


MAX_TUNING_BYTES = 64 << 20  # a tuning file of every trial of a shape family stays far below this


def tables(root: Path, kernel: str) -> tuple:
    """({device_kind: [entries]}, diagnostics) for every tuning file of a kernel. A file that
    cannot be used is a located diagnostic (its entries are then left out)."""
    out, diags = {}, []
    folder = root / kernel
    if folder.is_dir() and not folder.is_symlink():
        for path in sorted(folder.glob("*.json")):
            doc, found = read(path)
            diags += found
            if doc is not None and not found:
                out[doc["device_kind"]] = doc["entries"]
    return out, diags


def read(path: Path) -> tuple:
    """(document, diagnostics) of one tuning file: a regular file of UTF-8 JSON without NaN or
    Infinity, valid against schema/tuning.schema.json. (None, []) when it does not exist."""
    shown = str(path)
    try:
        raw = loader.read_regular(path, MAX_TUNING_BYTES)
    except FileNotFoundError:
        return None, []
    except loader.NotRegular as e:
        return None, [Diagnostic("E110", f"cannot read the tuning file: it is {e}", Location(shown))]
    except IsADirectoryError:
        return None, [Diagnostic("E110", "cannot read the tuning file: it is a folder, not a regular file",
                                 Location(shown))]
    except OSError as e:
        return None, [Diagnostic("E120", f"cannot read the tuning file: {e.strerror or e}", Location(shown))]
    if len(raw) > MAX_TUNING_BYTES:
        return None, [Diagnostic("E120", f"tuning file is larger than {MAX_TUNING_BYTES >> 20} MiB", Location(shown))]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        good = raw[: e.start].decode("utf-8")
        return None, [Diagnostic("E120", f"byte 0x{raw[e.start]:02x} is not valid UTF-8", _at(shown, good, len(good)))]
    try:
        doc = json.loads(text, parse_constant=_not_a_number)
    except _NotANumber as e:
        return None, [Diagnostic("E120", f"`{e}` is not a number: tuning files hold finite numbers only",
                                 _at(shown, text, _first_constant(text)))]
    except json.JSONDecodeError as e:
        return None, [Diagnostic("E120", f"not valid JSON: {e.msg}", Location(shown, e.lineno, e.colno),
                                 "a merge left conflict markers? keep one side, or delete the file and tune again")]
    except RecursionError:
        return None, [Diagnostic("E120", "not valid JSON: nested too deeply", Location(shown))]
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        where = _Positions(text)
        return None, [_schema_error(shown, text, where, e) for e in errors[:20]]
    return doc, []


def untuned_params(path: Path, doc: dict, tunable: dict, sha: str) -> list:
    """E122 for each param of an entry for this version of the kernel (`sha`; the others are
    stale, W900, and never embedded) that is not a tuned param of its backend ({backend: {param
    names}}): the generated code would pass it to a kernel that does not take it."""
    shown, text, where = str(path), None, None
    out = []
    for i, entry in enumerate(doc["entries"]):
        allowed = tunable.get(entry["backend"])
        if allowed is None or entry["kernel_sha"] != sha:
            continue
        for name in entry["params"]:
            if name not in allowed:
                if where is None:
                    text = loader.read_regular(path, MAX_TUNING_BYTES).decode("utf-8")
                    where = _Positions(text)
                out.append(Diagnostic(
                    "E122", f"entries[{i}]: `{name}` is not a tuned param of {entry['backend']}",
                    _at(shown, text, where.of(("entries", i, "params", name), key=True)),
                    "tuned params: " + (", ".join(sorted(allowed)) or "none")))
    return out


class _NotANumber(ValueError):
    pass


def _not_a_number(name: str):
    raise _NotANumber(name)


def _first_constant(text: str) -> int:
    """Offset of the first NaN/Infinity outside a string."""
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)', text):
        if m.group(1):
            return m.start(1)
    return 0


def _at(shown: str, text: str, offset: int) -> Location:
    line = text.count("\n", 0, offset) + 1
    return Location(shown, line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "the file"


def _schema_error(shown: str, text: str, where, error) -> Diagnostic:
    path, message, key = tuple(error.absolute_path), error.message, False
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = sorted(k for k in error.instance if k not in error.schema.get("properties", {}))
        path, message, key = path + (extra[0],), f"`{extra[0]}` is not a key of a tuning file", True
        path_shown = _path(error.absolute_path)
    else:
        path_shown = _path(path)
    return Diagnostic("E121", f"{path_shown}: {message}", _at(shown, text, where.of(path, key=key)),
                      "tuning files are written by `kspec tune` (their format: kspec schema --tuning)")


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads((resources.files("kspec") / "schema" / "tuning.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


class _Positions:
    """Offsets of the values (and keys) of a JSON text, by path: read only to place a diagnostic,
    so only when the file has one (json.loads, in C, did the parsing)."""

    _WS = re.compile(r"[ \t\n\r]*")
    _ATOM = re.compile(r'-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null')

    def __init__(self, text: str):
        self.text, self.values, self.keys = text, {}, {}
        try:
            self._value(0, ())
        except (IndexError, ValueError, RecursionError):
            pass  # positions found so far still place the diagnostics

    def of(self, path: tuple, key: bool = False) -> int:
        while path:
            found = (self.keys if key else self.values).get(path)
            if found is not None:
                return found
            path, key = path[:-1], False
        return self.values.get((), 0)

    def _skip(self, i: int) -> int:
        return self._WS.match(self.text, i).end()

    def _value(self, i: int, path: tuple) -> int:
        i = self._skip(i)
        self.values[path] = i
        c = self.text[i]
        if c == "{":
            i = self._skip(i + 1)
            if self.text[i] == "}":
                return i + 1
            while True:
                start = self._skip(i)
                name, i = json.decoder.scanstring(self.text, start + 1)
                self.keys[path + (name,)] = start
                i = self._skip(i) + 1  # the colon
                i = self._skip(self._value(i, path + (name,)))
                if self.text[i] == "}":
                    return i + 1
                i += 1  # the comma
        if c == "[":
            i, n = self._skip(i + 1), 0
            if self.text[i] == "]":
                return i + 1
            while True:
                i = self._skip(self._value(i, path + (n,)))
                n += 1
                if self.text[i] == "]":
                    return i + 1
                i += 1
        if c == '"':
            return json.decoder.scanstring(self.text, i + 1)[1]
        return self._ATOM.match(self.text, i).end()


def choices_of(variants: dict) -> dict:
    """{backend: {param: the values it offers}} of a spec's variants ({backend: Variant})."""
    return {b: {p.name: p.choices for p in v.params if p.choices} for b, v in variants.items()}


def offered(entry: dict, choices: dict) -> bool:
    """Whether the spec still offers every value the entry was tuned with; choices is
    {backend: {param: values}} (a backend or param missing from it restricts nothing)."""
    allowed = choices.get(entry["backend"], {})
    return all(name not in allowed or value in allowed[name] for name, value in entry["params"].items())


def usable(entry: dict, sha: str, choices: dict | None = None) -> bool:
    """Whether an entry can be embedded: it passed, was timed, is for this version of the kernel and,
    with `choices` (`choices_of`), was tuned with values the spec still offers."""
    return entry.get("kernel_sha") == sha and cost(entry) is not None and (not choices or offered(entry, choices))


def table_key(entry: dict) -> tuple:
    """(backend, dtype, bucket, fixed): what a generated package looks a config up by."""
    return entry["backend"], entry["dtype"], tuple(entry["bucket"]), fixed(entry)


class Pick(NamedTuple):
    """The config `picks` chooses for a bucket: its params, its score (lower is better; see
    `picks`) and, per case it was timed at, the entry that counts there (its least cost)."""

    params: dict
    score: float
    at: dict


def picks(entries: list, sha: str, choices: dict | None = None, ref: str | None = None) -> dict:
    """{(backend, dtype, bucket, fixed): Pick}: the config chosen per key, for every case (shape) of
    its bucket that was tuned, not only the first.

    Only the key's best group of usable entries ranks: sustained ones (they rank configs under the
    clocks that applications run at; times taken alone are not compared with them), those timed
    against the current reference (`ref`, its `reference_sha`) before those against an earlier
    one, else those timed alone. Within it, a config counts at each case by its least cost there.
    The candidates are the configs timed at every case the group has, or where none is, at the
    most cases; each is scored by its worst case: the largest cost when sustained (1 / its worst
    speedup), and when timed alone, where times at different shapes do not compare, the largest
    ratio of its time to the fastest config's at the same case. The lowest score wins; ties go to
    the config whose entries were recorded first (with one case: the first entry of the least cost)."""
    groups: dict = {}  # key -> (rank, {params: {case: (cost, index, entry)}})
    for i, e in enumerate(entries):
        if not usable(e, sha, choices) or how_timed(e) == GRAD:
            continue
        k, rank = table_key(e), (how_timed(e) != "sustained", ref is not None and e.get("reference_sha") != ref)
        if k not in groups or rank < groups[k][0]:
            groups[k] = (rank, {})
        if rank == groups[k][0]:
            cases = groups[k][1].setdefault(tuple(sorted(e["params"].items())), {})
            if e.get("case") not in cases or cost(e) < cases[e.get("case")][0]:
                cases[e.get("case")] = (cost(e), i, e)
    return {k: _pick(alone, configs) for k, ((alone, _), configs) in sorted(groups.items())}


def _pick(alone: bool, configs: dict) -> Pick:
    """The best-scored of one group's configs ({params: {case: (cost, index, entry)}}), see `picks`."""
    fastest: dict = {}  # case -> the least cost of any config there
    for cases in configs.values():
        for case, (c, _, _) in cases.items():
            fastest[case] = min(fastest.get(case, c), c)
    most = max(map(len, configs.values()))
    scored = []
    for params, cases in configs.items():
        if len(cases) == most:
            worst = max(_relative(c, fastest[case]) if alone else c for case, (c, _, _) in cases.items())
            scored.append((worst, max(i for _, i, _ in cases.values()), params, cases))
    score, _, params, cases = min(scored)
    return Pick(dict(params), score, {case: e for case, (_, _, e) in sorted(cases.items(), key=_case_order)})


def _relative(ms: float, fastest: float) -> float:
    """A time relative to the fastest at its case (a hand-written 0 ms is as fast as any other)."""
    return ms / fastest if fastest else (1.0 if ms == fastest else math.inf)


def _case_order(item) -> tuple:
    """Cases by name (an entry recorded without one last)."""
    return item[0] is None, item[0] or ""


def best(entries: list, sha: str, choices: dict | None = None, ref: str | None = None) -> dict:
    """{(backend, dtype, bucket, fixed): params} of the config `picks` chooses per key: the one
    best at its worst case of the bucket."""
    return {k: p.params for k, p in picks(entries, sha, choices, ref).items()}


def slower(entries: list, sha: str, ref: str, choices: dict | None = None) -> dict:
    """{(backend, dtype, bucket, fixed): speedup} where the config `best` picks was timed against
    the current reference (`kspec tune --sustained`; `ref`, its `reference_sha`) and, at the worst
    of the bucket's cases, ran slower than it (speedup < 1): auto calls the reference there."""
    out = {}
    for k, p in picks(entries, sha, choices, ref).items():
        if all(how_timed(e) == "sustained" and e.get("reference_sha") == ref for e in p.at.values()):
            worst = min(e["speedup"] for e in p.at.values())
            if worst < 1.0:
                out[k] = round(float(worst), 3)
    return out


def grad_slower(entries: list, sha: str) -> dict:
    """{(backend, dtype, bucket, fixed): speedup} of the buckets `grad_speedups` has below 1."""
    return {k: x for k, x in grad_speedups(entries, sha).items() if x < 1.0}


def stale(entries: list, sha: str, gradient_sha: str | None = None) -> list:
    """The entries recorded for another version of the kernel (`sha`), or, for grad entries, of the
    kernel and its backward kernels (`gradient_sha`)."""
    return [e for e in entries if e.get("kernel_sha") != (gradient_sha if how_timed(e) == GRAD else sha)]


# A gradient entry whose 95% interval reaches below this counts by the interval's low end: rounds
# that noisy do not show the kernels ahead, and auto differentiates the reference there.
GRAD_TRUSTED_LOW = 0.9
# A gradient entry faster than the reference by less than this, whose interval reaches below 1, is a
# tie: it counts by its low end too, and auto differentiates the reference there. Such a shape gains
# at most a few percent from the kernels, and another run can find them as far behind.
GRAD_CLEAR = 1.05


def grad_figure(entry: dict) -> float:
    """What a grad entry says of its shape: its speedup, or its 95% interval's low end where that
    is below GRAD_TRUSTED_LOW, or below 1 with a speedup under GRAD_CLEAR (a tie)."""
    low = (entry.get("speedup_ci95") or [entry["speedup"]])[0]
    tie = low < 1.0 and entry["speedup"] < GRAD_CLEAR
    return low if low < GRAD_TRUSTED_LOW or tie else entry["speedup"]


def grad_speedups(entries: list, sha: str) -> dict:
    """{(backend, dtype, bucket, fixed): speedup} of every bucket `kspec tune --grad` measured for
    this version of the kernels (`sha` is `grad_sha`): the forward and backward kernels together
    over the reference's autodiff, by the last entry at each case of the bucket (`grad_figure`);
    the smallest of those. A call in a bucket not measured takes the verdict of the nearest
    measured one (generated/_runtime.py `nearest`)."""
    last = {}
    for e in entries:
        if how_timed(e) == GRAD and e.get("kernel_sha") == sha and cost(e) is not None:
            last[(table_key(e), e.get("case"))] = grad_figure(e)
    worst: dict = {}
    for (k, _), x in last.items():
        worst[k] = min(worst.get(k, x), x)
    return dict(sorted((k, round(float(x), 3)) for k, x in worst.items()))
