"""The `kspec` command: wires the pipeline stages in codegen/ to the terminal.

Exit codes: 0 success; 1 a check failed (verification mismatch, drift, refused
overwrite); 2 invalid input or usage.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional

import typer

from kspec import __version__
from kspec.codegen import project as pipeline
from kspec.codegen.emit import writer
from kspec.codegen.diagnostics import CHECK_ONLY, Diagnostic, printable
from kspec.codegen.run.tasks import DEFAULT_SCHEDULES, Status

EPILOG = """
Examples:

  kspec check                          # every spec in specs/

  kspec check specs/matmul.yaml

  kspec generate                       # write generated/<kernel>/ for every spec

  kspec generate --check               # exit 1 and list files that drifted

  kspec verify --backend interpret     # run every case against the reference

  kspec explain E602                   # what a diagnostic code means and how to fix it
"""

app = typer.Typer(
    help="kspec: declare JAX Pallas kernels in YAML; check, generate, verify, bench and tune them.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

PathsArg = typer.Argument(None, help="Spec files or folders (default: the specs folder).", show_default=False)
CASE_HELP = "Only {what} with these names or shell-style patterns such as 'llm_M1000_*' (repeatable)."
OutOpt = typer.Option(None, "--out", help="The output folder for this run (default: the project's `out`, generated/); it must lie inside the project.", show_default=False)

SHARD_HELP = ("I/N: only the I-th of N shares of the cases (0 <= I < N), of about equal size by the product of "
              "their dims: one process per GPU of a host, each its own share of a family.")


def _shard_option(value: Optional[str]) -> Optional[tuple]:
    if value is None:
        return None
    found = re.fullmatch(r"(\d+)/(\d+)", value)
    if not found or not 0 <= int(found[1]) < int(found[2]):
        raise typer.BadParameter(f"{value!r} is not I/N with 0 <= I < N (e.g. 0/4)")
    return int(found[1]), int(found[2])



def _seconds(value: Optional[float]) -> Optional[float]:
    """A time limit: a positive, finite number of seconds (checked before anything runs)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive, finite number of seconds")
    return value


def _report_path(value: Optional[Path]) -> Optional[Path]:
    """Where a report goes: `-` for standard output, else a file whose folder exists and can be
    written (checked before the run, so a long run never ends in a path error)."""
    if value is None or str(value) == "-":
        return value
    if value.is_dir():
        raise typer.BadParameter(f"{_shown(value)} is a folder")
    folder = value.parent if str(value.parent) else Path(".")
    if not folder.is_dir():
        raise typer.BadParameter(f"folder {_shown(folder)} does not exist")
    if not os.access(folder, os.W_OK) or (value.exists() and not os.access(value, os.W_OK)):
        raise typer.BadParameter(f"{_shown(value)} cannot be written")
    return value


def _file_path(value: Optional[Path]) -> Optional[Path]:
    """A report that is a file (a PNG plot): `-` is not a file."""
    if value is not None and str(value) == "-":
        raise typer.BadParameter("this report cannot go to standard output; name a file")
    return _report_path(value)


def _write_report(path: Optional[Path], text: str) -> None:
    """Write a report to `path`, or to standard output for `-`."""
    if path is None:
        return
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text)


def _human_output(*paths):
    """Where the tables and progress go: standard output, or standard error when a report
    (`--json -`, ...) takes standard output, so that it holds the report alone."""
    if any(p is not None and str(p) == "-" for p in paths):
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


def _unknown_cases(results, names, attribute: str) -> Optional[str]:
    """The message for --case names that match no case of the selected specs (None if all match)."""
    known = {c.name for r in results if r.spec is not None for c in getattr(r.spec, attribute)}
    if attribute == "cases" and any(n.startswith("derived:") for n in names or []):  # verify's derived cases
        from kspec.codegen.checks.semantic import derived_cases

        known |= {d.case.name for r in results if r.spec is not None for ex in (False, True)
                  for d in derived_cases(r.spec, ex)}
    known = sorted(known)
    from kspec.codegen.verify import case_selected

    missing = [n for n in names or [] if not any(case_selected(k, [n]) for k in known)]
    if not missing:
        return None
    from kspec.codegen.diagnostics import did_you_mean

    hint = did_you_mean(missing[0], known)
    return (f"no case named {missing[0]!r} in the selected specs" + (f" ({hint})" if hint else "")
            + f"; known: {', '.join(known) or 'none'}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kspec {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kspec: declare JAX Pallas kernels in YAML; check, generate, verify, bench and tune them."""


def _report(compiled: pipeline.Compiled, lint: bool = False) -> None:
    """Print a file's diagnostics: with the YAML line and a caret on a terminal, plain when piped.
    The warnings about a spec's cases (CHECK_ONLY) only with `lint`: `kspec check` shows them."""
    lines = compiled.text.splitlines() if sys.stdout.isatty() else None
    for diag in compiled.diagnostics:
        if lint or diag.code not in CHECK_ONLY:
            typer.echo(diag.format(lines))


def _use_project(out: Optional[Path] = None) -> "pipeline.Project":
    """Find the project around the working directory (its configuration checked) and use it."""
    from kspec.codegen.diagnostics import SpecError

    try:
        project = pipeline.find(Path.cwd(), out)
    except SpecError as e:
        for d in e.diagnostics:
            typer.echo(d.format())
        raise typer.Exit(2)
    pipeline.use(project)
    return project


def _compile_all(paths: Optional[List[Path]], out: Optional[Path] = None, cache=None, lint: bool = False) -> list:
    """Every spec named (default: the project's), checked and reported; `cache`: a function of the
    project giving the check cache to use (check and generate), else each spec is checked afresh."""
    project = _use_project(out)
    specs = pipeline.discover(paths or [pipeline.relative(project.specs)])
    if not specs:
        where = ", ".join(_shown(p) for p in paths) if paths else _shown(project.specs) + "/"
        typer.echo(f"error: no spec files found (looked in {where})", err=True)
        raise typer.Exit(2)
    results = pipeline.compile_all(specs, cache(project) if cache else None)
    for r in results:
        _report(r, lint)
    owners: dict = {}
    for r in results:
        if r.ok and owners.setdefault(r.spec.name, r.path) != r.path:
            clash = Diagnostic(
                "E400", f"kernel name `{r.spec.name}` is also used by {owners[r.spec.name]}", r.spec.loc
            )
            r.diagnostics.append(clash)
            typer.echo(clash.format())
    return results


def _summary(results: list) -> int:
    bad = [r for r in results if not r.ok]
    errors = sum(d.severity == "error" for r in bad for d in r.diagnostics)  # warnings are not counted
    if bad:
        typer.echo(f"{errors} error(s) in {len(bad)} of {len(results)} spec(s)")
        return 2
    return 0


@app.command(short_help="Check specs; runs no spec code.")
def check(paths: Optional[List[Path]] = PathsArg) -> None:
    """Validate specs: schema, expressions, shapes, bounds and hardware rules. Runs no spec code."""
    results = _compile_all(paths, cache=pipeline.open_cache, lint=True)
    code = _summary(results)
    if code == 0:
        typer.echo(f"{len(results)} spec(s) OK")
    raise typer.Exit(code)


@app.command(short_help="Write the generated packages.")
def generate(
    paths: Optional[List[Path]] = PathsArg,
    out: Optional[Path] = OutOpt,
    check_only: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if the output folder differs in any file or folder."),
    force: bool = typer.Option(False, "--force", help="Overwrite files edited by hand and remove what kspec did not write."),
    prune: bool = typer.Option(False, "--prune", help="Also remove generated packages whose spec is gone."),
) -> None:
    """Render generated/<kernel>/ for each spec (each package atomically; hand edits are kept unless --force)."""
    caches: list = []
    results = _compile_all(paths, out, cache=lambda project: caches.append(pipeline.open_cache(project)) or caches[0])
    code = _summary(results)
    if code:
        raise typer.Exit(code)
    by_root: dict = {}
    for r in results:
        out_root = pipeline.out_root_for(r.path)
        by_root.setdefault(out_root, []).append((r, *pipeline.plan(r, out_root, caches[0])))
    failed = False
    try:
        for out_root, items in by_root.items():
            roots = pipeline.root_files(out_root)
            if check_only:
                failed |= _check_tree(out_root, items, roots, whole=not paths)
            else:
                failed |= _write_tree(out_root, items, roots, force=force, prune=prune)
    except writer.WriteError as e:
        typer.echo(f"{_shown(e.path)}:1:1: error[E111]: {e.reason}")
        raise typer.Exit(2)
    if check_only and not failed:
        typer.echo(f"generated/ is up to date for {len(results)} spec(s)")
    raise typer.Exit(1 if failed else 0)


def _check_tree(out_root: Path, items: list, roots: dict, whole: bool) -> bool:
    """Print what differs under the output folder from what generate would write; True if anything.
    `whole`: every spec is being checked, so every file and folder there must be one kspec writes."""
    planned_all = dict(roots)
    for _, _, planned in items:
        planned_all.update(planned)
    if whole:
        drift = writer.compare(planned_all, out_root)
    else:
        drift = writer.compare(roots, out_root)
        drift = [(p, why) for p, why in drift if p in roots]
        for _, kernel_dir, planned in items:
            drift += writer.compare(planned, kernel_dir)
    for path, reason in drift:
        typer.echo(f"{_shown(path)}: {reason}")
    return bool(drift)


def _write_tree(out_root: Path, items: list, roots: dict, force: bool, prune: bool) -> bool:
    """Write each kernel's package and the output folder's own files (root_files); True if
    anything was refused."""
    refused = []
    with writer.locked(out_root):
        writer.sweep(out_root)
        for r, kernel_dir, planned in items:
            outcome = writer.write_package(planned, kernel_dir, force=force)
            refused += outcome.refused
            n = len(outcome.written) + len(outcome.removed)
            if not outcome.refused:
                typer.echo(f"{r.spec.name}: {n} file(s) written, {len(outcome.unchanged)} unchanged -> {_shown(kernel_dir)}")
        for root_path, root_text in roots.items():
            current = writer.read_generated(root_path)
            if current != root_text:
                if current is not None and not force and (root_path.name == "__init__.py" or writer.hand_edited(current)):
                    refused.append((root_path, "edited by hand (use --force to overwrite)"))
                else:
                    writer.atomic_write(root_path, root_text)
        if prune:
            kernels = {kernel_dir for _, kernel_dir, _ in items}
            for folder in sorted(p for p in out_root.iterdir() if p.is_dir() and not p.is_symlink()):
                if folder in kernels or folder.name == "__pycache__":
                    continue
                if writer.orphan(folder):
                    writer.remove_package(folder)
                    typer.echo(f"{_shown(folder)}: removed (no spec generates it)")
                else:
                    refused.append((folder, "not a package kspec generated; remove it yourself"))
    for path, reason in refused:
        typer.echo(f"{_shown(path)}: refused: {reason}")
    return bool(refused)


@app.command(short_help="Run every backend against the reference.")
def verify(
    paths: Optional[List[Path]] = PathsArg,
    out: Optional[Path] = OutOpt,
    backend: Optional[List[str]] = typer.Option(
        None, "--backend", "-b",
        help="Only these backends (repeatable). Off a GPU, naming triton runs its bodies in Pallas interpret mode, naming mosaic_gpu the mesh kernels in Mosaic GPU interpret mode."),
    case: Optional[List[str]] = typer.Option(None, "--case", help=CASE_HELP.format(what="cases")),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for the random inputs (default: fresh, printed)."),
    json_path: Optional[Path] = typer.Option(None, "--json", callback=_report_path, help="Write results as JSON; - for standard output (see `kspec docs verify`)."),
    junit_path: Optional[Path] = typer.Option(None, "--junit", callback=_report_path, help="Write results as JUnit XML; - for standard output."),
    lower: bool = typer.Option(
        False, "--lower",
        help="Lower each backend for its own platform instead of running (mosaic_tpu off a TPU: for a TPU v5e); "
        "with --devices, the sharded variants on a mesh of N devices.",
    ),
    timeout: float = typer.Option(300.0, "--timeout", callback=_seconds, help="Seconds allowed per case."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Run everything with N seeds: seed, seed+1, ..."),
    schedules: int = typer.Option(
        DEFAULT_SCHEDULES, "--schedules", min=1,
        help="Run each mosaic_tpu task in TPU interpret mode (off a TPU) under N schedules, cycling through "
        "(on_wait DMAs, 2 cores), (eager, 1), (eager, 2), (on_wait, 1), each with its own seed for the order of "
        "the parallel grid axes; outputs must match the reference and, bit for bit, each other.",
    ),
    devices: Optional[int] = typer.Option(
        None, "--devices", min=1,
        help="Verify the sharded variants (specs with `sharding:`) on a mesh of N devices instead "
        "(on the CPU, N forced host devices); with --lower, lower them.",
    ),
    inputs: Optional[List[str]] = typer.Option(
        None, "--inputs", metavar="KINDS",
        help="Which input kinds each task runs the kernel on, besides standard normal data: default (one more "
        "kind per case, the spec's cases taking large, equal_rows, zero_rows and negative_rows in turn, then "
        "opposed_rows where its inputs list it), all (every kind its inputs take), normal (none), or kinds, "
        "comma-separated or repeated (e.g. --inputs large,zero_rows). A failure names the kind.",
    ),
    exhaustive: bool = typer.Option(
        False, "--exhaustive",
        help="Run every case derived from the specs (a ragged extent on each split dim, 1, 2 and 3 steps, the "
        "smallest extent, a full persistent grid: `derived:ragged_M`, ...), each with every dtype, input kind, "
        "schedule and grad task; by default only the derived cases that add coverage the declared cases lack "
        "run, on one dtype, normal inputs and one schedule.",
    ),
    show_traceback: bool = typer.Option(
        False, "--traceback", help="With an error row, the whole stack of the exception, not only its first lines."),
) -> None:
    """Run every case x dtype x backend this machine can run against the reference (exit 1 on any failure),
    and the edge-case shapes derived from each spec (`derived:...` rows)."""
    import json

    from kspec.codegen import verify as v
    from kspec.codegen.run import kinds

    try:
        selection = kinds.parse(inputs)
    except ValueError as e:
        typer.echo(f"error: --inputs: {e}", err=True)
        raise typer.Exit(2)
    if show_traceback:  # the workers inherit it
        os.environ["KSPEC_TRACEBACK"] = "1"
    with _human_output(json_path, junit_path):
        results, session, seed = _start_run(paths, backend, seed, timeout, devices, cases=case, out=out)
        info = session.info
        if devices:
            tasks, skipped = v.plan_sharded(
                results, devices=devices, device_count=info["device_count"], backends=backend or [], cases=case or [],
                seed=seed, platform=info["platform"], lower=lower,
            )
        else:
            tasks, skipped = v.plan(
                results, backends=backend or [], cases=case or [], seed=seed, lower=lower, platform=info["platform"],
                repeat=repeat, schedules=schedules, inputs=selection, exhaustive=exhaustive,
            )
        try:
            outcomes = _run_with_progress(session, tasks)
        finally:
            session.close()
        outcomes += [r for r in skipped if r.status is not Status.SKIP]  # --devices: errors found while planning
        outcomes, skipped = _rows(outcomes), _rows(r for r in skipped if r.status is Status.SKIP)
        rows = outcomes + skipped
        typer.echo(_table(outcomes, whole=show_traceback))
        for (name, why), n in sorted(Counter((r["backend"], r["message"]) for r in skipped).items()):
            typer.echo(f"skipped {n} {name} task(s): {why}")
        counts = v.summary(rows)
        typer.echo(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors, {counts['skip']} skipped"
        )
    if json_path:
        payload = v.to_json(rows, seed=seed, jax_version=info["jax_version"], device=info["device"])
        _write_report(json_path, json.dumps(payload, indent=2) + "\n")
    _write_report(junit_path, v.to_junit(rows) if junit_path else "")
    raise typer.Exit(1 if counts["fail"] or counts["error"] else 0)


@app.command(short_help="Time kernels against XLA and competitors.")
def bench(
    paths: Optional[List[Path]] = PathsArg,
    out: Optional[Path] = OutOpt,
    backend: Optional[List[str]] = typer.Option(None, "--backend", "-b", help="Only these backends (repeatable)."),
    case: Optional[List[str]] = typer.Option(None, "--case", help=CASE_HELP.format(what="bench cases")),
    samples: int = typer.Option(20, "--samples", min=3, help="Timed samples per figure."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for the random inputs."),
    json_path: Optional[Path] = typer.Option(None, "--json", callback=_report_path, help="Write results as JSON; - for standard output (see `kspec docs bench`)."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", callback=_report_path, help="Write a markdown report; - for standard output."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", callback=_file_path, help="Write a PNG plot (needs matplotlib)."),
    measure_ceilings: bool = typer.Option(False, "--measure-ceilings", help="Measure copy bandwidth and bf16 matmul peak here and use them as the roofline."),
    timeout: float = typer.Option(900.0, "--timeout", callback=_seconds, help="Seconds allowed per bench case."),
    sweep: bool = typer.Option(False, "--sweep", help="Time every shape of the specs' families instead of the bench cases, and sum up each kernel: geomean and worst speedup, shapes where auto runs the reference; --plot draws speedup against size."),
    family: Optional[List[str]] = typer.Option(None, "--family", help="With --sweep: only these families (repeatable)."),
    grad: bool = typer.Option(False, "--grad", help="Time the forward and backward pass (jax.vjp through the spec's `vjp:` kernels) against XLA's autodiff of the reference and of each competitor; specs without `vjp:` are skipped."),
    shard: Optional[str] = typer.Option(None, "--shard", callback=_shard_option, help=SHARD_HELP),
    budget_seconds: Optional[float] = typer.Option(
        None, "--budget-seconds", min=1,
        help="Start no new task after this long: the reports cover what was timed, and the JSON says partial."),
) -> None:
    """Time each kernel x backend x bench case against its XLA reference and the spec's competitors, side by side."""
    import datetime
    import json

    from kspec import __version__ as version
    from kspec.codegen import bench as bn
    from kspec.codegen import verify as v

    if plot_path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            typer.echo("error: --plot needs matplotlib: pip install 'kspec[plot]'", err=True)
            raise typer.Exit(2)
    with _human_output(json_path, markdown_path):
        if family and not sweep:
            typer.echo("error: --family needs --sweep", err=True)
            raise typer.Exit(2)
        results, session, seed = _start_run(paths, backend, seed, timeout, cases=case,
                                            case_kind="sweep" if sweep else "bench", out=out, families=family,
                                            sweep=sweep)
        info = session.info
        try:
            ceilings, roofline = (), "vendor peak table (kspec.codegen.backends.devices)"
            if measure_ceilings:
                measured = session.run(bn.ceilings_task()).extra
                ceilings = (measured["bandwidth_gbs"], measured["tflops_bf16"])
                roofline = f"measured here: copy {ceilings[0]:.0f} GB/s, bf16 matmul {ceilings[1]:.1f} TFLOP/s"
                typer.echo(f"ceilings: {roofline}")
            cases = _sharded(results, _chosen_cases(results, case, family), shard, sweep)
            tasks, skipped = bn.plan(results, backends=backend or [], cases=cases, seed=seed,
                                     samples=samples, platform=info["platform"], ceilings=ceilings,
                                     suite="sweep" if sweep else "bench", grad=grad)
            meta = {"device": info["device"], "jax_version": info["jax_version"], "kspec_version": version,
                    "date": datetime.date.today().isoformat(), "seed": seed, "samples": samples,
                    "roofline": roofline, "grad": grad}

            def partial(rows):  # a run cut short keeps what it measured
                if json_path and str(json_path) != "-":
                    _write_report(json_path, json.dumps(dict(meta, partial=True, results=_rows(rows)), indent=2) + "\n")

            rows = _rows(_run_with_progress(session, tasks, on_row=partial, budget=budget_seconds))
            skipped = _rows(skipped)
        finally:
            session.close()
        left = len(tasks) - len(rows)
        if left:  # --budget-seconds: what was timed, said to be part of the run
            meta["partial"] = True
        report = bn.markdown(rows, meta=meta)
        if left:
            report += f"\nTime budget spent: {len(rows)} of {len(tasks)} tasks timed, {left} not started.\n"
        if sweep:
            summary = bn.sweep_summary(rows + skipped)
            report += "\n" + bn.sweep_markdown(summary)
            meta["sweep"] = summary
        typer.echo(report)
        for r in rows:
            if r["status"] == "fail" and r.get("ms") is not None:  # timed, but below the case's min_speedup
                typer.echo(f"{r['kernel']}[{r['backend']}] {r['case']} {r['dtype']}: {r['message']}")
        for (name, why), n in sorted(Counter((r["backend"], r["message"]) for r in skipped).items()):
            typer.echo(f"skipped {n} {name} task(s): {why}")
        if plot_path:
            (bn.plot_sweep if sweep else bn.plot)(rows + skipped, str(plot_path))
        counts = v.summary(rows + skipped)
        typer.echo(f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors, {counts['skip']} skipped")
    if json_path:
        _write_report(json_path, json.dumps(dict(meta, results=rows + skipped), indent=2) + "\n")
    if markdown_path:
        _write_report(markdown_path, report)
    raise typer.Exit(1 if counts["fail"] or counts["error"] else 0)


@app.command(short_help="Search params for the fastest config.")
def tune(
    paths: Optional[List[Path]] = PathsArg,
    out: Optional[Path] = OutOpt,
    backend: Optional[List[str]] = typer.Option(
        None, "--backend", "-b",
        help="Only these backends (repeatable; default: every backend this machine runs, but interpret mode only "
             "on a CPU-only machine, since its times say nothing about an accelerator).",
    ),
    case: Optional[List[str]] = typer.Option(None, "--case", help=CASE_HELP.format(what="bench cases")),
    strategy: str = typer.Option(
        "exhaustive", "--strategy",
        help="exhaustive (every config), random (a seeded sample) or guided (a first batch of the configs chosen "
             "at the nearest tuned buckets, then ranked by a static score of the blocks, the default config first "
             "among equals, then batches around the fastest so far; see `kspec docs tune`).",
    ),
    budget_trials: Optional[int] = typer.Option(
        None, "--budget-trials", min=1,
        help="Most configs to try per case (default: all; guided: a third of the pruned space, counting the "
             "trials already recorded).",
    ),
    budget_seconds: Optional[float] = typer.Option(None, "--budget-seconds", min=1, callback=_seconds, help="Stop starting new cases after this long."),
    samples: int = typer.Option(10, "--samples", min=3, help="Timed samples per config."),
    sustained: bool = typer.Option(
        False, "--sustained",
        help="Time each config in alternation with the XLA reference after holding the device under load, "
             "as `kspec bench` does, and rank configs by their speedup over it round by round: the ranking "
             "under the clocks a power cap holds (default: each config timed alone, at the clocks it finds).",
    ),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for inputs and the random and guided strategies."),
    tuning_dir: Optional[Path] = typer.Option(None, "--tuning-dir", help="Where results go (default: tuning/ beside generated/)."),
    timeout: float = typer.Option(1800.0, "--timeout", callback=_seconds, help="Seconds allowed per config batch."),
    sweep: bool = typer.Option(False, "--sweep", help="Tune every shape of the specs' families instead of the bench cases, each shape bucket at one shape before any at a second (resumable: what is recorded is skipped); bound it with --budget-seconds."),
    family: Optional[List[str]] = typer.Option(None, "--family", help="With --sweep: only these families (repeatable)."),
    grad: bool = typer.Option(
        False, "--grad",
        help="Search nothing: time the forward and backward pass together as backend=\"auto\" runs them (the tuned "
             "forward config, the backward kernels) against XLA's autodiff of the reference, round by round, per case "
             "or shape, and record it. Where it is slower at any shape of a bucket, the generated package differentiates "
             "the reference in that bucket. "
             "For specs with `vjp:` and `dispatch: {reference_when_faster: true}` (resumable: what is recorded is "
             "skipped).",
    ),
    shard: Optional[str] = typer.Option(None, "--shard", callback=_shard_option, help=SHARD_HELP),
) -> None:
    """Search each spec's param choices for the fastest correct config; results go to tuning/."""
    import time

    import functools

    from kspec.codegen.checks import instances
    from kspec.codegen import tune as tn
    from kspec.codegen.verify import case_selected
    from kspec.codegen.emit.signature import Signature
    from kspec.codegen.tune.case import CaseJob, first_shapes_first, tune_case, tune_grad
    from kspec.codegen.tune.store import Store

    if strategy not in tn.STRATEGIES:
        typer.echo("error: --strategy must be exhaustive, random or guided", err=True)
        raise typer.Exit(2)
    if family and not sweep:
        typer.echo("error: --family needs --sweep", err=True)
        raise typer.Exit(2)
    results, session, seed = _start_run(paths, backend, seed, timeout, cases=case,
                                        case_kind="sweep" if sweep else "bench", out=out, families=family, sweep=sweep)
    case = _sharded(results, _chosen_cases(results, case, family), shard, sweep)
    info = session.info
    started = time.monotonic()
    failed = False
    try:
        jobs = []  # (job, its kernel's store, the keys recorded there, its grad hash): spec, backend, case, dtype
        for r in results:
            spec = r.spec
            out_root = pipeline.out_root_for(r.path)
            store = Store(tuning_dir or pipeline.tuning_dir(out_root), spec.name, info["device"])
            done = store.done()
            if sweep:
                suite, chosen = "sweep", spec.sweep
            else:
                suite, chosen = ("bench", spec.bench) if spec.bench else ("cases", spec.cases)
            gradient_sha = pipeline.gradient_sha(spec, r.backward) if grad else None
            if grad and (gradient_sha is None or not Signature(spec).reference_gradient):
                typer.echo(f"{spec.name}: skipped: --grad tunes specs with `vjp:` whose reference can stand in for the "
                           "forward pass and whose `dispatch` sets reference_when_faster")
                continue
            for name, variant in spec.variants.items():
                searched = any(p.choices for p in variant.params)
                if not _tuned_here(name, backend, info["platform"]) or not (grad or searched):
                    continue
                for i, c in enumerate(chosen):
                    if not case_selected(c.name, case):
                        continue
                    for assign in instances.dtype_assignments(spec, c):
                        if variant.supports(assign):
                            job = CaseJob(spec, variant, i, c, assign, suite, str(out_root), info["device"],
                                          info["jax_version"], strategy, budget_trials, samples, seed, sustained)
                            jobs.append((job, store, done, gradient_sha))
        if sweep:  # every bucket at one shape before any at a second
            jobs = first_shapes_first(jobs, lambda item: item[0])
        for job, store, done, gradient_sha in jobs:
            if budget_seconds and time.monotonic() - started > budget_seconds:
                typer.echo("time budget spent: stopping")
                raise typer.Exit(1 if failed else 0)
            if grad:
                failed |= tune_grad(job, store, gradient_sha, session.run, typer.echo)
            else:
                failed |= tune_case(job, store, done, functools.partial(_stream_with_progress, session), typer.echo)
    finally:
        session.close()
    typer.echo("run `kspec generate` to embed the tuned configs in generated/")
    raise typer.Exit(1 if failed else 0)



EXAMPLE_SPEC = """\
# yaml-language-server: $schema=../.kspec/kspec.schema.json
kspec: 1
name: scale_rows
doc: Multiplies each row of x by its weight, one block of rows per program.
params:
  bm: {default: 8, choices: [8, 16, 32], doc: Rows per program.}
inputs:
  x: {shape: [M, N], dtype: [float32, bfloat16]}
  w: {shape: [M, 1], dtype: x}
outputs:
  o: {shape: [M, N], dtype: x}
grid: {i: "cdiv(M, bm)"}
blocks:
  x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
  w: {block_shape: [bm, 1], index_map: "i -> (i, 0)"}
  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = (x_ref[...].astype(jnp.float32) * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)
reference: |
  return (x.astype(jnp.float32) * w.astype(jnp.float32)).astype(x.dtype)
cases:
  - {name: square, M: 64, N: 128}
  - {name: ragged, M: 44, N: 128, dtype: float32}
"""
CONFIG = '[tool.kspec]\nspecs = "specs"\nout = "generated"\npackage = "generated"\ntuning = "tuning"\n'
GITIGNORE = ["generated/.kspec.lock", ".kspec/cache/", "__pycache__/"]


@app.command(short_help="Make a folder a kspec project.")
def init(
    folder: Path = typer.Argument(Path("."), help="The project folder (default: the working directory).", show_default=False),
) -> None:
    """Make a folder a kspec project: configuration, an example spec, the schema for editors."""
    from importlib import resources

    folder.mkdir(parents=True, exist_ok=True)
    pyproject, kspec_toml = folder / "pyproject.toml", folder / "kspec.toml"
    refused = []
    if kspec_toml.exists() or (pyproject.is_file() and "[tool.kspec]" in pyproject.read_text(encoding="utf-8")):
        refused.append((kspec_toml if kspec_toml.exists() else pyproject, "is already a kspec project's configuration"))
    example = folder / "specs" / "scale_rows.yaml"
    if example.exists():
        refused.append((example, "exists"))
    if refused:
        for path, why in refused:
            typer.echo(f"{_shown(path)}:1:1: error[E142]: {why}; kspec init writes nothing over it")
        raise typer.Exit(2)
    made = []
    if pyproject.is_file():
        text = pyproject.read_text(encoding="utf-8")
        pyproject.write_text(text + ("" if text.endswith("\n") else "\n") + "\n" + CONFIG, encoding="utf-8")
        made.append(f"{_shown(pyproject)} ([tool.kspec] added)")
    else:
        kspec_toml.write_text(CONFIG.replace("[tool.kspec]\n", ""), encoding="utf-8")
        made.append(_shown(kspec_toml))
    example.parent.mkdir(exist_ok=True)
    example.write_text(EXAMPLE_SPEC, encoding="utf-8")
    made.append(_shown(example))
    schema_copy = folder / ".kspec" / "kspec.schema.json"
    schema_copy.parent.mkdir(exist_ok=True)
    schema_copy.write_text((resources.files("kspec") / "schema" / "kspec.schema.json").read_text(encoding="utf-8"))
    made.append(f"{_shown(schema_copy)} (the schema the specs' $schema comment names, for editors)")
    gitignore = folder / ".gitignore"
    lines = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.is_file() else []
    missing = [line for line in GITIGNORE if line not in lines]
    if missing:
        gitignore.write_text("\n".join(lines + missing) + "\n", encoding="utf-8")
        made.append(_shown(gitignore))
    for line in made:
        typer.echo(f"created {line}")
    typer.echo("next: kspec check && kspec generate && kspec verify; then `from generated.scale_rows import scale_rows`")


@app.command(short_help="Read the user manual in the terminal.")
def docs(topic: Optional[str] = typer.Argument(None, help="A page of the manual (default: list them).", show_default=False)) -> None:
    """Print a page of the user manual (the docs/ folder, shipped with kspec), or list the pages."""
    from importlib import resources

    pages = {p.name[:-3]: p for p in (resources.files("kspec") / "docs").iterdir() if p.name.endswith(".md")}
    if topic is None:
        for name in sorted(pages):
            title = next((line.lstrip("# ").strip() for line in pages[name].read_text(encoding="utf-8").splitlines()
                          if line.startswith("# ")), "")
            typer.echo(f"{name:<16} {title}")
        return
    if topic not in pages:
        from kspec.codegen.diagnostics import did_you_mean

        hint = did_you_mean(topic, pages)
        typer.echo(f"error: no page {topic!r}" + (f" ({hint})" if hint else "") + f"; pages: {', '.join(sorted(pages))}", err=True)
        raise typer.Exit(2)
    typer.echo(pages[topic].read_text(encoding="utf-8"), nl=False)

@app.command(short_help="Explain a diagnostic code.")
def explain(code: str = typer.Argument(..., help="A diagnostic code, e.g. E602 or W900.", show_default=False)) -> None:
    """Print what a diagnostic code means, an example and the fix: its section of the manual's
    diagnostics page (`kspec docs diagnostics` prints all of them)."""
    from importlib import resources

    from kspec.codegen.diagnostics import CODES, did_you_mean

    wanted = code.strip().upper()
    if wanted not in CODES:
        hint = did_you_mean(wanted, CODES)
        typer.echo(f"error: no diagnostic {code!r}" + (f" ({hint})" if hint else "")
                   + "; `kspec docs diagnostics` lists them all", err=True)
        raise typer.Exit(2)
    text = (resources.files("kspec") / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    lines, out = text.splitlines(), []
    for line in lines:
        if out and line.startswith("#"):
            break
        if out or line.startswith(f"### {wanted}:"):
            out.append(line)
    typer.echo("\n".join(out).rstrip() if out else f"{wanted}: {CODES[wanted]}")


@app.command(short_help="Print the JSON Schema of specs or tuning files.")
def schema(
    tuning: bool = typer.Option(False, "--tuning", help="The schema of tuning files (tuning/<kernel>/<device>.json) instead."),
) -> None:
    """Print the JSON Schema of spec files (or, with --tuning, of tuning files)."""
    from importlib import resources

    name = "tuning.schema.json" if tuning else "kspec.schema.json"
    typer.echo((resources.files("kspec") / "schema" / name).read_text(encoding="utf-8"), nl=False)


def _tuned_here(name: str, requested, platform: str) -> bool:
    """Whether `kspec tune` tunes backend `name` on this platform: the backends named with --backend,
    else every backend the platform runs, except interpret mode off the CPU (its times say nothing
    about the kernel on the accelerator; name it to tune it anyway)."""
    from kspec.codegen.backends import BACKENDS

    if platform not in BACKENDS[name].platforms:
        return False
    if requested:
        return name in requested
    return name != "interpret" or platform == "cpu"


def _stream_with_progress(session, task, started: int, total: int):
    if sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            bar = progress.add_task(f"tuning {task.label}", total=total, completed=started)
            for row in session.stream(task):
                progress.advance(bar)
                yield row
        return
    for i, row in enumerate(session.stream(task), started + 1):
        typer.echo(f"[{i}/{total}] {row.status:5} {row.extra.get('params')}", err=True)
        yield row


def _sharded(results, chosen: list, shard: Optional[tuple], sweep: bool) -> list:
    """`chosen` (case names, []: every case) held to shard (I, N) of `--shard`: the cases of the
    specs' suites (the sweep's shapes, else the bench cases) split by `shard_names`, a name shared
    by several specs weighing their sizes together."""
    if shard is None:
        return chosen
    from kspec.codegen.verify import case_selected, shard_names

    weights: dict = {}
    for r in results:
        if r.spec is None:
            continue
        suite = r.spec.sweep if sweep else (r.spec.bench or r.spec.cases)
        for c in suite:
            if case_selected(c.name, chosen):
                weights[c.name] = weights.get(c.name, 0) + c.size
    mine = shard_names(weights, *shard)
    if not mine:
        typer.echo(f"error: --shard {shard[0]}/{shard[1]} holds none of the {len(weights)} case(s)", err=True)
        raise typer.Exit(2)
    return mine


def _chosen_cases(results, cases, families) -> list:
    """The case names a run is held to ([]: every case): those named with --case, those of the
    families named with --family, and with both, the named cases of those families."""
    if not families:
        return list(cases or [])
    in_families = [c.name for r in results if r.spec is not None for f in r.spec.families if f.name in families
                   for c in f.cases]
    from kspec.codegen.verify import case_selected

    return [c for c in in_families if case_selected(c, cases)]


def _start_run(paths, backends, seed, timeout, devices=None, cases=None, case_kind="cases", out=None,
               families=None, sweep=False):
    """Shared start of verify/bench/tune: check specs, case names and drift, start a worker, print the seed."""
    import secrets

    from kspec.codegen import verify as v
    from kspec.codegen.backends import BACKENDS

    unknown = [b for b in backends or [] if b not in BACKENDS]
    if unknown:
        typer.echo(f"error: unknown backend {unknown[0]!r}; known: {', '.join(BACKENDS)}", err=True)
        raise typer.Exit(2)
    results = _compile_all(paths, out)
    code = _summary(results)
    if code:
        raise typer.Exit(code)
    unknown_case = _unknown_cases(results, cases, case_kind)
    if unknown_case:
        typer.echo(f"error: {unknown_case}", err=True)
        raise typer.Exit(2)
    if sweep:
        declared = sorted({f.name for r in results if r.spec is not None for f in r.spec.families})
        if not declared:
            typer.echo("error: --sweep needs specs with `families:`; none of the selected specs declares one", err=True)
            raise typer.Exit(2)
        missing = [f for f in families or [] if f not in declared]
        if missing:
            typer.echo(f"error: no family named {missing[0]!r} in the selected specs; known: {', '.join(declared)}",
                       err=True)
            raise typer.Exit(2)
        if cases and families and not _chosen_cases(results, cases, families):
            typer.echo(f"error: no case named {', '.join(cases)} in the families {', '.join(families)}", err=True)
            raise typer.Exit(2)
    drift = v.stale(results)
    if drift:
        for path, reason in drift:
            typer.echo(f"{_shown(path)}: {reason}")
        typer.echo("generated/ is out of date: run `kspec generate` first")
        raise typer.Exit(1)
    seed = seed if seed is not None else secrets.randbelow(2**31)
    typer.echo(f"seed: {seed}  (reproduce with --seed {seed})")
    from kspec.codegen.run import pool

    session = pool.Workers(devices, timeout)
    info = session.info
    typer.echo(f"jax {info['jax_version']} on {info['platform']} ({info['device']})")
    return results, session, seed


def _run_with_progress(session, tasks: list, on_row=None, budget: float | None = None, clock=None) -> list:
    """Run tasks, with a progress bar on a terminal and a line per finished task otherwise;
    `on_row(rows)` is called with the rows so far after each task. `budget`: seconds (by `clock`,
    time.monotonic) after which no new task starts; the rows of those that ran are returned."""
    import time

    clock = clock or time.monotonic
    started = clock()
    spent = lambda: budget is not None and clock() - started >= budget  # noqa: E731
    out = []
    if sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            bar = progress.add_task("verifying", total=len(tasks))
            for task in tasks:
                if spent():
                    break
                progress.update(bar, description=task.label)
                out.append(session.run(task))
                progress.advance(bar)
                if on_row:
                    on_row(out)
        return out
    for i, task in enumerate(tasks, 1):
        if spent():
            break
        out.append(session.run(task))
        typer.echo(f"[{i}/{len(tasks)}] {out[-1].status:5} {task.label}", err=True)
        if on_row:
            on_row(out)
    return out


def _rows(results) -> list:
    """The JSON rows of results, as the reports read them."""
    return [r.to_json() for r in results]


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2e}" if isinstance(value, float) else str(value)


def _table(rows: list, whole: bool = False) -> str:
    """A plain-text summary table, one row per task; messages follow failed rows."""
    head = ("kernel", "backend", "mode", "case", "dtype", "status", "max_abs_err", "rel_err", "seconds")
    body = [
        (r["kernel"], r["backend"], r["mode"], r["case"], r["dtype"], r["status"],
         _fmt(r["max_abs_err"]), _fmt(r["rel_err"]), "-" if r["seconds"] is None else f"{r['seconds']:.2f}")
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)).rstrip()]
    for r, row in zip(rows, body):
        lines.append("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
        if r["status"] in ("fail", "error") and r["message"]:
            shown = r["message"].splitlines()
            lines += ["    " + ln for ln in (shown if whole else shown[:6])]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """A path as the user sees it: relative to the working directory when below it (links are
    not followed), with control characters escaped so that a file name cannot drive the terminal."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return printable(relative if not relative.startswith("..") else absolute)


def run() -> None:
    """Console-script entry point."""
    import os

    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # a bug in kspec itself: say so plainly, traceback on request
        if os.environ.get("KSPEC_DEBUG"):
            raise
        typer.echo(f"kspec internal error: {type(e).__name__}: {e}", err=True)
        typer.echo("this is a bug in kspec; rerun with KSPEC_DEBUG=1 for the traceback and report it", err=True)
        sys.exit(3)


if __name__ == "__main__":
    run()
