"""Tuning data: tuning/<kernel>/<device_kind>.json, written by `kspec tune`, read by codegen.

Each file holds every trial of one kernel on one device kind, appended (atomically
rewritten) as results come, so a stopped run resumes where it was. An entry is keyed
by backend, shape bucket, dtype, jax version, kernel hash, params and how it was timed
(alone, or `load: "sustained"` against the reference: `kspec tune --sustained`); the
kernel hash covers what decides the generated code (not docs, cases or tolerances, nor which
values a param offers the tuner), and entries whose hash differs from the spec's are stale:
`kspec check` reports them and codegen ignores them. An entry tuned with a value the spec no
longer offers is kept but not embedded.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from kspec.codegen.emit.writer import atomic_write

# Spec keys that do not change the generated kernel: editing them keeps tuning valid.
# (`vjp` adds the backward pass around the kernel; the kernel itself stays the same.)
_NOT_KERNEL = ("doc", "cases", "bench", "tolerance", "vjp", "competitors")


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


def kernel_sha(data: dict) -> str:
    """Hash of the spec parts that decide the generated kernel code."""
    kept = {k: v for k, v in data.items() if k not in _NOT_KERNEL}
    if "params" in kept:
        kept["params"] = _params_view(kept["params"])
    if isinstance(kept.get("backends"), dict):
        kept["backends"] = {
            b: ({**v, "params": _params_view(v["params"])} if isinstance(v, dict) and "params" in v else v)
            for b, v in kept["backends"].items()
        }
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def bucket(dims: tuple) -> tuple:
    """Shape bucket: each dim rounded up to a power of two."""
    return tuple(1 << max(int(d) - 1, 0).bit_length() for d in dims)


def file_name(device_kind: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", device_kind).strip("_") + ".json"


def tuning_dir(out_root: Path) -> Path:
    """tuning/ beside generated/."""
    return out_root.parent / "tuning"


def fixed(entry: dict) -> tuple:
    """The entry's untuned params (e.g. causal): part of what a config was tuned for."""
    return tuple(sorted(entry.get("fixed", {}).items()))


def how_timed(entry: dict) -> str:
    """How the entry was timed: "alone" (by itself, at the clocks it found) or "sustained"
    (in alternation with the reference under load, `kspec tune --sustained`)."""
    return entry.get("load", "alone")


def cost(entry: dict):
    """What ranks passing entries of one load, lower first: the time alone, or the time relative
    to the reference in the same rounds (1 / speedup) when sustained; None for a failed entry."""
    if entry.get("status") != "pass" or entry.get("ms") is None:
        return None
    if how_timed(entry) == "sustained":
        return 1.0 / entry["speedup"] if entry.get("speedup") else None
    return entry["ms"]


def key(entry: dict) -> tuple:
    return (
        entry["backend"], tuple(entry["bucket"]), entry["dtype"], fixed(entry), entry["jax_version"],
        entry["kernel_sha"], tuple(sorted(entry["params"].items())), how_timed(entry),
    )


class Store:
    """One kernel's tuning file for one device kind."""

    def __init__(self, root: Path, kernel: str, device_kind: str):
        self.path = root / kernel / file_name(device_kind)
        self.kernel, self.device_kind = kernel, device_kind
        self.entries = load(self.path)

    def done(self) -> set:
        return {key(e) for e in self.entries}

    def append(self, entry: dict) -> None:
        self.entries.append(entry)
        doc = {"kernel": self.kernel, "device_kind": self.device_kind, "entries": self.entries}
        atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def load(path: Path) -> list:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("entries", [])
    except (OSError, ValueError, AttributeError):
        return []


def tables(root: Path, kernel: str) -> dict:
    """{device_kind: [entries]} for every tuning file of a kernel."""
    out = {}
    folder = root / kernel
    if folder.is_dir():
        for path in sorted(folder.glob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            out[doc.get("device_kind", path.stem)] = doc.get("entries", [])
    return out


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


def best(entries: list, sha: str, choices: dict | None = None) -> dict:
    """{(backend, dtype, bucket, fixed): params} of the fastest usable entry per key.

    Where a key has sustained entries, the fastest of those wins (they rank configs under the
    clocks that applications run at); times taken alone are not compared with them."""
    chosen: dict = {}
    for e in entries:
        if not usable(e, sha, choices):
            continue
        k = (e["backend"], e["dtype"], tuple(e["bucket"]), fixed(e))
        rank = (how_timed(e) != "sustained", cost(e))
        if k not in chosen or rank < chosen[k][0]:
            chosen[k] = (rank, e)
    return {k: dict(sorted(e["params"].items())) for k, (_, e) in sorted(chosen.items())}


def stale(entries: list, sha: str) -> list:
    return [e for e in entries if e.get("kernel_sha") != sha]
