"""Where `kspec tune` records its trials: one kernel's tuning file for one device kind, rewritten
atomically as each trial comes, so a stopped run resumes where it was (see spec/tuning.py for
what the entries hold and how they are read)."""

from __future__ import annotations

import json
from pathlib import Path

from kspec.codegen.emit.writer import atomic_write
from kspec.codegen.spec.tuning import file_name, key, read


class Store:
    """One kernel's tuning file for one device kind."""

    def __init__(self, root: Path, kernel: str, device_kind: str):
        self.path = root / kernel / file_name(device_kind)
        self.kernel, self.device_kind = kernel, device_kind
        doc, problems = read(self.path)
        if problems:  # never start over a file that could not be read: its entries would be lost
            raise ValueError(problems[0].format())
        self.entries = list(doc["entries"]) if doc else []

    def done(self) -> set:
        return {key(e) for e in self.entries}

    def append(self, entry: dict) -> None:
        self.entries.append(entry)
        doc = {"kernel": self.kernel, "device_kind": self.device_kind, "entries": self.entries}
        atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
