"""Where `kspec tune` records its trials: one kernel's tuning file for one device kind, rewritten
atomically as each trial comes, so a stopped run resumes where it was (see spec/tuning.py for
what the entries hold and how they are read).

Several `kspec tune` processes may record into one file at once (one per GPU of a host, each with
its share of the shapes): each append holds an exclusive lock on the file's folder, reads the file
as it is on disk, and writes it back with the new entry, so no process overwrites another's."""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from pathlib import Path

from kspec.codegen.emit.writer import atomic_write, ensure_folder
from kspec.codegen.spec.tuning import file_name, key, read


def _text(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True)


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on `folder` itself (no lock file is left in tuning/)."""
    ensure_folder(folder)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Store:
    """One kernel's tuning file for one device kind."""

    def __init__(self, root: Path, kernel: str, device_kind: str):
        self.path = root / kernel / file_name(device_kind)
        self.kernel, self.device_kind = kernel, device_kind
        self.entries = self._on_disk()
        self._mine: list = []  # what this store appended, kept should the file lose it

    def _on_disk(self) -> list:
        doc, problems = read(self.path)
        if problems:  # never start over a file that could not be read: its entries would be lost
            raise ValueError(problems[0].format())
        return list(doc["entries"]) if doc else []

    def done(self) -> set:
        return {key(e) for e in self.entries}

    def append(self, entry: dict) -> None:
        """Record one entry after those on disk now (another process's included)."""
        self._mine.append(entry)
        with _locked(self.path.parent):
            entries = self._on_disk()
            there = Counter(_text(e) for e in entries)
            for e in self._mine:  # each of ours not on disk (as many times as we appended it)
                t = _text(e)
                if there[t]:
                    there[t] -= 1
                else:
                    entries.append(e)
            doc = {"kernel": self.kernel, "device_kind": self.device_kind, "entries": entries}
            atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        self.entries = entries
