"""What checking and rendering a spec found, kept so that an unchanged spec costs a few file reads.

`kspec check` and `kspec generate` keep, per spec file, the diagnostics checking it produced and,
once it is generated, the files it renders, in the project's `.kspec/cache/` (safe to delete at
any time; `kspec init`'s .gitignore keeps it out of version control). An entry is used only when
nothing it was made from has changed:

- the spec's bytes, and those of every backward spec its `vjp:` names (recursively, whether or not
  they could be read);
- its tuning files (their names and bytes);
- the project (its folders, output package and configuration file's bytes) and the working
  directory (diagnostics name paths as they were given);
- kspec itself: the bytes of its code, templates and schemas.

verify, bench and tune always check afresh: they need the whole model, not its verdict. A cache
that cannot be read or written is passed over, never an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from kspec.codegen.diagnostics import Diagnostic, Location
from kspec.codegen.spec import loader

FOLDER = ".kspec/cache"
FORMAT = 1
_MAX_ENTRY_BYTES = 16 << 20


@dataclasses.dataclass
class Named:
    """What a cached result keeps of its spec: the kernel's name and where it is declared."""

    name: str
    loc: Location


@dataclasses.dataclass
class Cached:
    """A spec's check result read from the cache: what `Compiled` offers, without the model.
    `files`: {output folder: {path relative to it: text}} of what it renders, where known."""

    path: Path
    text: str
    spec: Named | None
    diagnostics: list
    backward: tuple = ()
    files: dict = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.spec is not None and not any(d.severity == "error" for d in self.diagnostics)


_fingerprint: list = []


def kspec_fingerprint() -> str:
    """Digest of kspec's own code, templates and schemas (and its version): a new kspec, or an
    edited one, never reads the entries of another."""
    if not _fingerprint:
        from kspec import __version__

        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(__version__.encode())
        files = [root / "__init__.py", root / "cli.py"]
        for folder, pattern in (("codegen", "*.py"), ("templates", "*"), ("schema", "*.json")):
            files += sorted((root / folder).rglob(pattern))
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.relative_to(root).as_posix().encode() + b"\0")
                h.update(hashlib.sha256(f.read_bytes()).digest())
        _fingerprint.append(h.hexdigest())
    return _fingerprint[0]


def file_state(path: Path) -> str:
    """The digest of a file's bytes, or what it is instead of a readable regular file."""
    try:
        raw = loader.read_regular(path, loader.MAX_FILE_BYTES)
    except FileNotFoundError:
        return "missing"
    except loader.NotRegular as e:
        return f"not regular: {e}"
    except OSError as e:
        return f"unreadable: {type(e).__name__}"
    return hashlib.sha256(raw).hexdigest()


def folder_state(folder: Path) -> str:
    """The digest of a tuning folder: whether it is one, and the names and bytes of its JSON files."""
    if folder.is_symlink():
        return "link"
    if not folder.is_dir():
        return "none"
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.json")):
        h.update(f.name.encode() + b"\0" + file_state(f).encode() + b"\0")
    return h.hexdigest()


class Cache:
    """The cache of one project, for one working directory and one kspec."""

    def __init__(self, project, tuning_folder):
        """`tuning_folder(spec_path, kernel_name)`: where that kernel's tuning files are."""
        self.folder = Path(project.root) / FOLDER
        # Written only as real folders inside the project: a link on the way turns the cache off.
        self.usable = not any(f.is_symlink() for f in (self.folder.parent, self.folder))
        self.tuning_folder = tuning_folder
        config = file_state(project.config) if project.config else "defaults"
        parts = [FORMAT, kspec_fingerprint(), os.getcwd(), str(project.root), str(project.specs), str(project.out),
                 project.package, str(project.tuning), config]
        self.key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
        self._read: dict = {}  # str(path) -> Cached or None, this run

    def _entry_path(self, path: Path) -> Path:
        return self.folder / (hashlib.sha256(f"{self.key}\0{path}".encode()).hexdigest()[:40] + ".json")

    def get(self, path: Path):
        """The cached result of the spec at `path` (as given), or None where there is none that holds."""
        shown = str(path)
        if shown in self._read:
            return self._read[shown]
        self._read[shown] = None  # a cycle of backward specs reads as a miss
        found = None
        try:
            found = self._get(path)
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            found = None
        self._read[shown] = found
        return found

    def _get(self, path: Path):
        entry_path = self._entry_path(path)
        if not self.usable or entry_path.is_symlink() or not entry_path.is_file() or entry_path.stat().st_size > _MAX_ENTRY_BYTES:
            return None
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
        if entry.get("key") != self.key or entry.get("path") != str(path):
            return None
        if any(file_state(Path(p)) != state for p, state in entry["files_read"].items()):
            return None
        if any(folder_state(Path(p)) != state for p, state in entry["folders_read"].items()):
            return None
        backward = []
        for b in entry["backward"]:
            got = self.get(Path(b))
            if got is None:
                return None
            backward.append(got)
        spec = entry["spec"]
        return Cached(
            path=path,
            text=entry["text"],
            spec=None if spec is None else Named(spec["name"], Location(*spec["loc"])),
            diagnostics=[Diagnostic(d[0], d[1], Location(*d[2]), d[3], d[4]) for d in entry["diagnostics"]],
            backward=tuple(backward),
            files=entry.get("rendered", {}),
        )

    def put(self, compiled, rendered: dict | None = None) -> None:
        """Keep `compiled` (a `Compiled` of this run) and its backward specs; `rendered`: {output
        folder: {relative path: text}} of what it renders. Nothing is kept of a spec whose file
        changed while it was checked, or whose text could not be read."""
        from kspec.codegen.emit import writer

        if not self.usable:
            return
        try:
            self._put(compiled, rendered or {}, set())
        except (OSError, ValueError, TypeError, RecursionError, writer.WriteError):
            pass

    def _put(self, compiled, rendered: dict, done: set) -> None:
        shown = str(compiled.path)
        if shown in done:
            return
        done.add(shown)
        for b in compiled.backward:
            self._put(b, {}, done)
        state = file_state(compiled.path)
        if not compiled.text or state != hashlib.sha256(compiled.text.encode("utf-8")).hexdigest():
            return
        files_read, folders_read = {shown: state}, {}
        spec = compiled.spec
        if spec is not None:
            if spec.vjp is not None:
                for entry in spec.vjp.backward:
                    target = compiled.path.parent / entry.spec
                    files_read[str(target)] = file_state(target)
            folder = self.tuning_folder(compiled.path, spec.name)
            folders_read[str(folder)] = folder_state(folder)
        for b in compiled.backward:  # a backward entry must hold for this one to hold
            if str(b.path) not in files_read:
                files_read[str(b.path)] = file_state(b.path)
        old = self.get_raw(compiled.path)
        # Rendered files stay only while everything they were rendered from does: the spec files and
        # the tuning folder (a new tuning file changes the generated _tuning.py).
        same = old and old.get("files_read") == files_read and old.get("folders_read") == folders_read
        keep = dict(old.get("rendered", {})) if same else {}
        keep.update(rendered)
        entry = {
            "key": self.key,
            "path": shown,
            "text": compiled.text,
            "spec": None if spec is None else {"name": spec.name, "loc": [spec.loc.path, spec.loc.line, spec.loc.col]},
            "diagnostics": [[d.code, d.message, [d.loc.path, d.loc.line, d.loc.col], d.hint, d.severity]
                            for d in compiled.diagnostics],
            "backward": [str(b.path) for b in compiled.backward],
            "files_read": files_read,
            "folders_read": folders_read,
            "rendered": keep,
        }
        from kspec.codegen.emit import writer

        writer.atomic_write(self._entry_path(compiled.path), json.dumps(entry, sort_keys=True))
        self._read.pop(shown, None)

    def get_raw(self, path: Path):
        try:
            return json.loads(self._entry_path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
