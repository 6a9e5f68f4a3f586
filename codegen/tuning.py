"""Tuning data: tuning/<kernel>/<device_kind>.json, written by `kspec tune`, read by codegen.

Each file holds every trial of one kernel on one device kind, appended (atomically
rewritten) as results come, so a stopped run resumes where it was. An entry is keyed
by backend, shape bucket, dtype, jax version, kernel hash and params; the kernel hash
covers what decides the generated code (not docs, cases or tolerances), and entries
whose hash differs from the spec's are stale: `kspec check` reports them and codegen
ignores them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .writer import atomic_write

# Spec keys that do not change the generated kernel: editing them keeps tuning valid.
# (`vjp` adds the backward pass around the kernel; the kernel itself stays the same.)
_NOT_KERNEL = ("doc", "cases", "bench", "tolerance", "vjp")


def kernel_sha(data: dict) -> str:
    """Hash of the spec parts that decide the generated kernel code."""
    kept = {k: v for k, v in data.items() if k not in _NOT_KERNEL}
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


def key(entry: dict) -> tuple:
    return (
        entry["backend"], tuple(entry["bucket"]), entry["dtype"], fixed(entry), entry["jax_version"],
        entry["kernel_sha"], tuple(sorted(entry["params"].items())),
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


def best(entries: list, sha: str) -> dict:
    """{(backend, dtype, bucket, fixed): params} of the fastest passing, current entry per key."""
    chosen: dict = {}
    for e in entries:
        if e.get("status") != "pass" or e.get("kernel_sha") != sha or e.get("ms") is None:
            continue
        k = (e["backend"], e["dtype"], tuple(e["bucket"]), fixed(e))
        if k not in chosen or e["ms"] < chosen[k]["ms"]:
            chosen[k] = e
    return {k: dict(sorted(e["params"].items())) for k, e in sorted(chosen.items())}


def stale(entries: list, sha: str) -> list:
    return [e for e in entries if e.get("kernel_sha") != sha]
