"""Wiring of the stages, shared by the CLI commands. No JAX here."""

from __future__ import annotations

import dataclasses
import os
import re
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
        diags = diags + stale_tuning(spec, path, backward)
        if any(d.severity == "error" for d in diags):  # W902 speaks of the cases of a valid spec
            diags = [d for d in diags if d.code != "W902"]
        compiled = Compiled(path, text, spec, diags, backward)
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


def compile_all(paths: list, cache=None) -> list:
    """Each spec compiled (or, where `cache` holds an entry whose sources are unchanged, its cached
    result: see codegen/cache.py), then `closure`."""
    memo: dict = {}
    out = []
    for path in paths:
        found = cache.get(path) if cache is not None else None
        if found is None:
            found = compile_spec(path, memo)
            if cache is not None:
                cache.put(found)
        out.append(found)
    return closure(out)


def open_cache(project):
    """The project's check cache (codegen/cache.py)."""
    from kspec.codegen import cache

    return cache.Cache(project, lambda path, name: relative(tuning_dir(out_root_for(path))) / name)


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


def gradient_sha(spec: model.KernelSpec, backward: tuple) -> str | None:
    """The hash `kspec tune --grad` records its entries for (tuning.grad_sha): the kernel's, its
    backward kernels' and the reference's; None without a `vjp:` whose backward specs all built."""
    if spec.vjp is None or len(backward) != len(spec.vjp.backward) or any(b.spec is None for b in backward):
        return None
    return tuning.grad_sha(spec.kernel_sha, [b.spec.kernel_sha for b in backward], spec.reference_sha)


def stale_tuning(spec: model.KernelSpec, path: Path, backward: tuple = ()) -> list:
    """The spec's tuning files checked: each must be valid (E110, E120 to E122), and entries
    recorded against another version of the kernel (or, for `kspec tune --grad`'s, of its backward
    kernels: `backward`, the Compiled backward specs) are a warning (W900)."""
    root = tuning_dir(out_root_for(path))
    tables, out = tuning.tables(relative(root), spec.name)
    tunable = {b: {p.name for p in v.params if p.choices} for b, v in spec.variants.items()}
    for device_kind, entries in tables.items():
        where = relative(root) / spec.name / tuning.file_name(device_kind)
        out += tuning.untuned_params(where, {"entries": entries}, tunable, spec.kernel_sha)
        old = tuning.stale(entries, spec.kernel_sha, gradient_sha(spec, backward))
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
        out += _smem_estimates_met(spec, entries, where)
    return out


# What Triton's error gives when a program needs more shared memory than a block may have: through
# XLA (`Shared memory size limit exceeded: requested N, available: M`) or from Triton itself.
_SMEM_REFUSED = re.compile(r"Shared memory size limit exceeded: requested (\d+)|out of resource: shared memory, Required: (\d+)")


def _smem_estimates_met(spec: model.KernelSpec, entries: list, where: Path) -> list:
    """W903: a current entry whose config Triton refused for want of shared memory (the bytes its error
    gave) where the backend's `shared_memory` estimate, at that entry's case and dtypes, said it fits:
    the estimate is too low, and the nearest-bucket lookup and auto may hand calls configs that fail."""
    from kspec.codegen.backends import rules
    from kspec.codegen.checks import instances
    from kspec.codegen.spec.expr import ExprError, NotEvaluable

    out = []
    cases = {c.name: c for c in (*spec.cases, *spec.bench, *spec.sweep)}
    for e in entries:
        found = _SMEM_REFUSED.search(e.get("message") or "")
        variant, case = spec.variants.get(e.get("backend")), cases.get(e.get("case"))
        if (not found or variant is None or variant.shared_memory is None or case is None
                or e.get("kernel_sha") != spec.kernel_sha):
            continue
        asked = int(found.group(1) or found.group(2))
        trial = dataclasses.replace(case, params={**case.params, **e.get("params", {})})
        for assign in instances.dtype_assignments(spec, case):
            if tuning.case_dtype_label(spec, case, assign) != e.get("dtype"):
                continue
            inst, _ = instances.instantiate(spec.kernel_view, variant, trial, assign, [0])
            try:
                estimate = rules.declared_smem(inst) if inst is not None else None
            except (ExprError, NotEvaluable):
                estimate = None
            if isinstance(estimate, int) and estimate < asked and estimate <= rules.HOPPER_SMEM_LIMIT:
                out.append(Diagnostic(
                    "W903",
                    f"{e['backend']}: case `{case.name}` {e['dtype']} {e['params']}: Triton asked for {asked} bytes of "
                    f"shared memory, where the backend's shared_memory estimate gives {estimate}",
                    Location(str(where)),
                    f"raise the estimate in {spec.name}'s `backends.{e['backend']}.shared_memory` to cover this config",
                    severity="warning"))
            break
    return out


def tuning_dir(out_root: Path) -> Path:
    """The tuning files of the packages in `out_root`: the project's tuning folder for its own
    output folder, else tuning/ beside it."""
    project = current(out_root.resolve().parent)
    return project.tuning if Path(os.path.abspath(out_root)) == project.out else tuning.tuning_dir(out_root)


def relative(path: Path) -> Path:
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


CONFIG_KEYS = {
    "specs": "the folder of the spec files (default specs)",
    "out": "the folder generate writes the packages to (default generated)",
    "package": "the import path of the output folder (default: out, with / as .)",
    "tuning": "the folder of the tuning files (default tuning)",
}


@dataclasses.dataclass(frozen=True)
class Project:
    """Where a project's files are: found upward from the working directory (see `find`)."""

    root: Path
    specs: Path
    out: Path
    package: str
    tuning: Path
    config: Path | None = None  # the file that configured it; None: the defaults, rooted at the cwd


_current: list = []


def use(project: Project) -> None:
    """The project the commands of this process work in (the CLI sets it once)."""
    _current[:] = [project]


def current(near: Path | None = None) -> Project:
    """The project in use (`use`); without one (kspec used as a library), the project around
    `near` (a spec's folder), else around the working directory."""
    return _current[0] if _current else find(near or Path.cwd())


def find(start: Path, out: Path | None = None) -> Project:
    """The project around `start`: the nearest folder upward holding a kspec.toml, a
    pyproject.toml with a [tool.kspec] table, or a specs/ folder (then with the defaults);
    without one, `start` with the defaults. `out` overrides the output folder (it must lie
    inside the root). Raises SpecError (E140, E141)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        for name in ("kspec.toml", "pyproject.toml"):
            path = folder / name
            if path.is_file():
                table = _config_table(path)
                if table is not None:
                    return _project(folder, path, table, out)
        if (folder / "specs").is_dir():  # a project without a configuration: the defaults
            return _project(folder, None, {}, out)
    return _project(start, None, {}, out)


def _config_table(path: Path) -> dict | None:
    import tomllib

    try:
        text = loader.read_regular(path, loader.MAX_FILE_BYTES).decode("utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([Diagnostic("E140", f"cannot read the project configuration: {e}",
                                    Location(str(relative(path))))]) from None
    except tomllib.TOMLDecodeError as e:
        import re

        at = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        where = Location(str(relative(path)), *map(int, at.groups())) if at else Location(str(relative(path)))
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(e))
        raise SpecError([Diagnostic("E140", f"not valid TOML: {message}", where)]) from None
    if path.name == "kspec.toml":
        return data
    tool = data.get("tool")
    return tool.get("kspec") if isinstance(tool, dict) and isinstance(tool.get("kspec"), dict) else None


def _project(root: Path, config: Path | None, table: dict, out: Path | None) -> Project:
    diags = []

    def where(key: str) -> Location:
        return _key_loc(config, key) if config else Location(str(root))

    for key, value in table.items():
        if key not in CONFIG_KEYS:
            from kspec.codegen.diagnostics import did_you_mean

            diags.append(Diagnostic("E140", f"unknown key `{key}` in the kspec configuration", where(key),
                                    did_you_mean(key, CONFIG_KEYS) or "keys: " + ", ".join(CONFIG_KEYS)))
        elif not isinstance(value, str) or not value.strip():
            diags.append(Diagnostic("E140", f"`{key}` must be a non-empty string ({CONFIG_KEYS[key]})", where(key)))
    if diags:
        raise SpecError(diags)

    def inside(key: str, value: str | Path) -> Path:
        """The folder, absolute but with links left in place (the writer refuses to write through
        one, E111); it must lie inside the root once they are followed."""
        path = Path(os.path.normpath(root / value))
        real = path.resolve()
        if real != root and root not in real.parents:
            loc = where(key) if key in table else Location(str(value))
            diags.append(Diagnostic("E141", f"{key} `{value}` is outside the project at {root}", loc,
                                    "kspec reads and writes only inside the project; name a folder below it"))
        return path

    specs = inside("specs", table.get("specs", "specs"))
    out_path = inside("out", out if out is not None else table.get("out", "generated"))
    tuning_path = inside("tuning", table.get("tuning", "tuning"))
    package = table.get("package") or ".".join(out_path.relative_to(root).parts) if not diags else ""
    if not diags and not all(part.isidentifier() for part in package.split(".")):
        diags.append(Diagnostic("E140", f"package `{package}` is not an import path", where("package"),
                                "name the output folder's import path, e.g. `package = \"myproject.kernels\"`"))
    if diags:
        raise SpecError(diags)
    return Project(root, specs, out_path, package, tuning_path, config)


def _key_loc(config: Path, key: str) -> Location:
    """Where `key = ...` is written in a configuration file (its first line if it is not found)."""
    import re

    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    in_table = config.name == "kspec.toml"
    for n, line in enumerate(lines, 1):
        if line.strip().startswith("["):
            in_table = config.name == "kspec.toml" or line.strip() == "[tool.kspec]"
        elif in_table and (m := re.match(rf"\s*({re.escape(key)})\s*=", line)):
            return Location(str(relative(config)), n, m.start(1) + 1)
    return Location(str(relative(config)))


def out_root_for(spec_path: Path) -> Path:
    """The output folder of the current project (generated/ at its root, unless configured)."""
    return current(spec_path.resolve().parent).out


def plan(compiled, out_root: Path, cache=None) -> tuple:
    """(kernel_dir, {path: full text}) for a valid spec: a `Compiled`, or a cached result (whose
    rendered files the cache keeps, else it is compiled again)."""
    if not isinstance(compiled, Compiled):
        kept = compiled.files.get(str(out_root))
        if kept is not None:
            kernel_dir = out_root / compiled.spec.name
            return kernel_dir, {out_root / name: text for name, text in kept.items()}
        compiled = compile_spec(compiled.path)
    kernel_dir, planned = _render(compiled, out_root)
    if cache is not None:
        cache.put(compiled, {str(out_root): {p.relative_to(out_root).as_posix(): t for p, t in planned.items()}})
    return kernel_dir, planned


def _render(compiled: Compiled, out_root: Path) -> tuple:
    spec = compiled.spec
    shown = Path(os.path.relpath(compiled.path.resolve(), out_root.resolve().parent)).as_posix()
    kernel_dir = out_root / spec.name
    tables, _ = tuning.tables(tuning_dir(out_root), spec.name)  # compile_spec reported its problems
    project = current(out_root.resolve().parent)
    package = project.package if Path(os.path.abspath(out_root)) == project.out else out_root.name
    files = render.render(spec, shown, tables, compiled.linked, package)
    planned = {kernel_dir / name: writer.with_banner(text, shown, spec.sha256) for name, text in files.items()}
    return kernel_dir, planned


def root_files(out_root: Path) -> dict:
    """{path: text} of what kspec writes at the top of the output folder: its __init__.py, and
    _runtime.py, the tuned-config lookup and dispatch every package shares."""
    from importlib import resources

    runtime = (resources.files("kspec") / "templates" / "runtime.py").read_text(encoding="utf-8")
    return {
        out_root / "__init__.py": writer.PACKAGE_INIT,
        out_root / "_runtime.py": writer.with_banner(runtime, "kspec's templates/runtime.py", writer.sha(runtime), root=True),
    }
