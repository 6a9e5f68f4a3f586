"""Wiring of the stages, shared by the CLI commands. No JAX here."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import checks, loader, model, render, schema, tuning, writer
from .diagnostics import Diagnostic, Location, SpecError


@dataclasses.dataclass
class Compiled:
    """A spec file after loading and checking: the model if it is valid."""

    path: Path
    text: str
    spec: model.KernelSpec | None
    diagnostics: list

    @property
    def ok(self) -> bool:
        return self.spec is not None and not any(d.severity == "error" for d in self.diagnostics)


def compile_spec(path: Path) -> Compiled:
    """Load, schema-check, build and check one spec; never raises on bad input."""
    text = ""
    try:
        text = loader.read_text(path)
        doc = loader.load_text(text, str(path))
        schema.validate(doc)
        spec = model.build(doc)
        return Compiled(path, text, spec, checks.check(spec) + stale_tuning(spec, path))
    except SpecError as e:
        return Compiled(path, text, None, e.diagnostics)
    except (RecursionError, MemoryError) as e:
        diag = Diagnostic("E100", f"spec too complex to process ({type(e).__name__})", Location(str(path)))
        return Compiled(path, text, None, [diag])


def stale_tuning(spec: model.KernelSpec, path: Path) -> list:
    """Warnings for tuning entries recorded against another version of the kernel."""
    out = []
    root = tuning.tuning_dir(out_root_for(path))
    for device_kind, entries in tuning.tables(root, spec.name).items():
        old = tuning.stale(entries, spec.kernel_sha)
        if old:
            where = root / spec.name / tuning.file_name(device_kind)
            shown = os.path.relpath(where) if not os.path.relpath(where).startswith("..") else str(where)
            out.append(
                Diagnostic(
                    "W900",
                    f"{len(old)} of {len(entries)} tuning entries for {device_kind} were recorded for another "
                    "version of the kernel and are ignored",
                    Location(shown),
                    f"rerun `kspec tune {path}` on that device, or delete the stale entries",
                    severity="warning",
                )
            )
    return out


def discover(paths: list, root: Path | None = None) -> list:
    """Spec files named by `paths` (files or folders); all of specs/ when empty."""
    if not paths:
        paths = [root / "specs" if root else Path("specs")]
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file())
        else:
            found.append(p)
    return found


def out_root_for(spec_path: Path) -> Path:
    """generated/ beside the spec's folder: specs/x.yaml -> generated/x/."""
    return spec_path.resolve().parent.parent / "generated"


def plan(compiled: Compiled, out_root: Path) -> tuple:
    """(kernel_dir, {path: full text}) for a valid spec."""
    spec = compiled.spec
    shown = Path(os.path.relpath(compiled.path.resolve(), out_root.resolve().parent)).as_posix()
    kernel_dir = out_root / spec.name
    files = render.render(spec, shown, tuning.tables(tuning.tuning_dir(out_root), spec.name))
    planned = {kernel_dir / name: writer.with_banner(text, shown, spec.sha256) for name, text in files.items()}
    return kernel_dir, planned


def package_init(out_root: Path) -> tuple:
    return out_root / "__init__.py", writer.PACKAGE_INIT
