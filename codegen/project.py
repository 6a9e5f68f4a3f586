"""Wiring of the stages, shared by the CLI commands. No JAX here."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kspec.codegen.checks import semantic as checks
from kspec.codegen.spec import loader
from kspec.codegen.spec import model
from kspec.codegen.emit import render
from kspec.codegen.spec import schema
from kspec.codegen.spec import tuning
from kspec.codegen.checks import vjp
from kspec.codegen.emit import writer
from kspec.codegen.diagnostics import Diagnostic, Location, SpecError


@dataclasses.dataclass
class Compiled:
    """A spec file after loading and checking: the model if it is valid."""

    path: Path
    text: str
    spec: model.KernelSpec | None
    diagnostics: list
    backward: tuple = ()  # the Compiled backward specs its `vjp:` names (those that could be read)

    @property
    def ok(self) -> bool:
        return self.spec is not None and not any(d.severity == "error" for d in self.diagnostics)

    @property
    def linked(self) -> tuple:
        """The backward KernelSpecs of a valid spec, in `vjp.backward` order."""
        return tuple(b.spec for b in self.backward)


def compile_spec(path: Path, memo: dict | None = None, _stack: tuple = ()) -> Compiled:
    """Load, schema-check, build and check one spec, and the backward specs its `vjp:`
    names; never raises on bad input. `memo` (resolved path -> Compiled) shares the
    work between the specs of one run."""
    key = path.resolve()
    memo = {} if memo is None else memo  # a spec named by several backward entries is compiled once
    if key in memo:
        return memo[key]
    text = ""
    try:
        text = loader.read_text(path)
        doc = loader.load_text(text, str(path))
        schema.validate(doc)
        spec = model.build(doc)
        diags = checks.check(spec)
        backward = ()
        if spec.vjp is not None:
            backward, found = _link(path, spec, not any(d.severity == "error" for d in diags), memo, _stack + (key,))
            diags = sorted(diags + found, key=lambda d: (d.loc, d.code))
        compiled = Compiled(path, text, spec, diags + stale_tuning(spec, path), backward)
    except SpecError as e:
        compiled = Compiled(path, text, None, e.diagnostics)
    except (RecursionError, MemoryError) as e:
        diag = Diagnostic("E100", f"spec too complex to process ({type(e).__name__})", Location(str(path)))
        compiled = Compiled(path, text, None, [diag])
    memo[key] = compiled
    return compiled


def _link(path: Path, spec: model.KernelSpec, valid: bool, memo: dict, stack: tuple) -> tuple:
    """(the backward specs' Compiled, E420 to E429 for the vjp section). A backward spec
    is named relative to this one; a chain that comes back to a spec on `stack` is E426."""
    compiled, found, linked = [], [], {}
    for n, entry in enumerate(spec.vjp.backward):
        target = path.parent / entry.spec
        if target.resolve() in stack:
            chain = [p.name for p in stack[stack.index(target.resolve()):]] + [target.name]
            found.append(vjp.cycle(entry, chain))
            continue
        c = compile_spec(target, memo, stack)
        if c.spec is None and c.diagnostics and c.diagnostics[0].code == "E100":
            found.append(vjp.unreadable(entry, c.diagnostics[0].message))
            continue
        compiled.append(c)
        if c.ok:
            linked[n] = c.spec
        else:
            found.append(vjp.invalid(entry, sum(d.severity == "error" for d in c.diagnostics)))
    found += vjp.check(spec, linked, per_case=valid and len(linked) == len(spec.vjp.backward))
    return tuple(compiled), found


def closure(results: list) -> list:
    """`results` and, after them, every backward spec they name (recursively) that is not
    among them: generating or verifying a kernel needs its backward kernels too."""
    out, seen = list(results), {r.path.resolve() for r in results}
    for r in out:  # grows while it runs
        for b in r.backward:
            if b.path.resolve() not in seen:
                seen.add(b.path.resolve())
                out.append(b)
    return out


def stale_tuning(spec: model.KernelSpec, path: Path) -> list:
    """The spec's tuning files checked: each must be valid (E110, E120 to E122), and entries
    recorded against another version of the kernel are a warning (W900)."""
    root = tuning.tuning_dir(out_root_for(path))
    tables, out = tuning.tables(_relative(root), spec.name)
    tunable = {b: {p.name for p in v.params if p.choices} for b, v in spec.variants.items()}
    for device_kind, entries in tables.items():
        where = _relative(root) / spec.name / tuning.file_name(device_kind)
        out += tuning.untuned_params(where, {"entries": entries}, tunable)
        old = tuning.stale(entries, spec.kernel_sha)
        if old:
            out.append(
                Diagnostic(
                    "W900",
                    f"{len(old)} of {len(entries)} tuning entries for {device_kind} were recorded for another "
                    "version of the kernel and are ignored",
                    Location(str(where)),
                    f"rerun `kspec tune {path}` on that device, or delete the stale entries",
                    severity="warning",
                )
            )
    return out


def _relative(path: Path) -> Path:
    """`path` relative to the working directory when it lies below it (as diagnostics show it)."""
    rel = os.path.relpath(path)
    return Path(rel) if not rel.startswith("..") else path


def discover(paths: list, root: Path | None = None) -> list:
    """Spec files named by `paths` (files or folders); all of specs/ when empty."""
    if not paths:
        paths = [root / "specs" if root else Path("specs")]
    found = []
    for p in map(Path, paths):
        if p.is_dir() and p.suffix not in (".yaml", ".yml"):  # a folder named x.yaml is read, and refused, as a file
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
    tables, _ = tuning.tables(tuning.tuning_dir(out_root), spec.name)  # compile_spec reported its problems
    files = render.render(spec, shown, tables, compiled.linked)
    planned = {kernel_dir / name: writer.with_banner(text, shown, spec.sha256) for name, text in files.items()}
    return kernel_dir, planned


def package_init(out_root: Path) -> tuple:
    return out_root / "__init__.py", writer.PACKAGE_INIT
