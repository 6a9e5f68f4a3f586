"""Tuning one backend x case x dtype: key the trials, prune, search batch by batch, choose.

`kspec tune` (cli.py) walks the specs, cases and dtypes and hands each to `tune_case`
with a way to run a task (`run`, the worker session with its progress display) and a
way to report (`say`); everything else, from the table's key to the fastest config, is
here. Every trial is appended to the store as it comes, so a run cut short keeps what
it measured, and a rerun skips what is recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from kspec.codegen import tune as tn
from kspec.codegen.backends.devices import peak_for
from kspec.codegen.run.tasks import BenchTask, Result, TuneTask
from kspec.codegen.spec import tuning as tg
from kspec.templates import runtime as _runtime


@dataclasses.dataclass(frozen=True)
class CaseJob:
    """One backend x case x dtype assignment to tune, and how."""

    spec: object
    variant: object
    index: int  # the case's index in its suite
    case: object
    assign: dict  # operand -> dtype
    suite: str  # "bench", "cases" or "sweep"
    out_root: str
    device: str  # the worker's device kind
    jax_version: str
    strategy: str = "exhaustive"
    budget: int | None = None  # most configs to try (guided: default_budget)
    samples: int = 10
    seed: int = 0
    sustained: bool = False

    @property
    def label(self) -> str:
        return tg.case_dtype_label(self.spec, self.case, self.assign)

    def base(self) -> dict:
        """The fields every trial of this job records: what a tuned config is keyed by."""
        dims = tuple(self.case.dims[d] for d in self.spec.dims)
        untuned = {p.name: self.case.params.get(p.name, p.default) for p in self.variant.params if not p.resolved}
        base = {"backend": self.variant.backend, "bucket": list(tg.bucket(dims)), "dtype": self.label,
                "fixed": untuned, "jax_version": self.jax_version, "kernel_sha": self.spec.kernel_sha,
                "case": self.case.name}
        if self.sustained:  # timed against the reference: which one is part of the key
            base.update(load="sustained", reference_sha=self.spec.reference_sha)
        return base

    def task(self, configs: list) -> TuneTask:
        return TuneTask(spec_path=str(self.spec.path), kernel=self.spec.name, backend=self.variant.backend,
                        case=self.case.name, case_index=self.index, dtypes=tuple(self.assign.items()),
                        dtype_label=self.label, seed=self.seed, out_root=str(self.out_root), suite=self.suite,
                        samples=self.samples, configs=tuple(tn.key(c) for c in configs), sustained=self.sustained)


def first_shapes_first(items: list, job: Callable = lambda item: item) -> list:
    """The items (jobs, or what `job(item)` finds one in) in their order, except that every table's
    bucket (kernel, backend, dtype, bucket, untuned params) has its first case before any has its
    second, and so on: a sweep under --budget-seconds tunes each bucket at one shape before it
    spends time on other shapes of buckets it has tuned."""
    seen: dict = {}
    ranked = []
    for i, item in enumerate(items):
        j = job(item)
        where = (j.spec.name, *tg.table_key(j.base()))
        seen[where] = seen.get(where, -1) + 1
        ranked.append((seen[where], i))
    return [items[i] for _, i in sorted(ranked)]


def tune_case(job: CaseJob, store, done: set, run: Callable[[TuneTask, int, int], Iterable[Result]],
              say: Callable[[str], None]) -> bool:
    """Tune one job: statically pruned configs are recorded once (`done`: the keys recorded
    already), the others searched by the job's strategy, batch by batch, each batch a tune task
    that `run(task, started, planned)` answers with one row per config. Returns True if no
    config passed."""
    spec, variant, base = job.spec, job.variant, job.base()
    kept, pruned = tn.prune(spec, variant, job.case, job.assign, tn.space(variant))
    for cfg, why in pruned:
        entry = dict(base, params=cfg, status="pruned", ms=None, message=why)
        if tg.key(entry) not in done:
            store.append(entry)
    wanted = {tg.key(dict(base, params=cfg)): tn.key(cfg) for cfg in kept}
    tried = {wanted[tg.key(e)]: tg.cost(e) for e in store.entries if tg.key(e) in wanted}
    scores = (tn.scores(spec, variant, job.case, job.assign, kept, peak_for(job.device))
              if job.strategy == "guided" else None)
    neighbours = _neighbours(job, store, base) if job.strategy == "guided" else None
    next_batch = tn.search(kept, strategy=job.strategy, budget=job.budget, seed=job.seed, scores=scores,
                           neighbours=neighbours)
    todo = next_batch(tried)  # exhaustive and random name all their configs at once
    planned = len(todo)
    if job.strategy == "guided":  # one batch at a time, up to its budget
        planned = max(0, min(job.budget or tn.default_budget(job.strategy, len(kept)), len(kept)) - len(tried))
    say(f"{spec.name}[{variant.backend}] {job.case.name} {job.label}: {len(kept) + len(pruned)} configs, "
        f"{len(pruned)} pruned statically, {planned} to try")
    started = 0
    while todo:
        for row in run(job.task(todo), started, planned):
            figures = row.extra
            entry = dict(base, params=figures.get("params", {}), status=row.status.value, ms=figures.get("ms"),
                         message=row.message.splitlines()[0] if row.message else "")
            if job.sustained and figures.get("speedup") is not None:
                entry.update(ref_ms=figures["ref_ms"], speedup=figures["speedup"], speedup_ci95=figures["speedup_ci95"])
            if figures.get("calls_per_executable") is not None:  # how it was timed (short calls: several)
                entry["calls_per_executable"] = figures["calls_per_executable"]
            store.append(entry)
            if figures.get("params"):
                tried[tn.key(figures["params"])] = tg.cost(entry)
            if not row.passed:
                say(f"  rejected {entry['params']}: {row.status}: {entry['message']}")
        for cfg in todo:  # a config left without a result (its worker died) counts as tried
            tried.setdefault(tn.key(cfg), None)
        started += len(todo)
        todo = next_batch(tried)
    return _report(job, store, base, say)


def _neighbours(job: CaseJob, store, base: dict) -> list:
    """The configs chosen at the other tuned buckets of this job's table (backend, dtypes and untuned
    params; timed the same way), nearest bucket first by the distance a generated package looks
    configs up by: where a family is tuned bucket by bucket, the guided search starts from them."""
    offered = tg.choices_of({job.variant.backend: job.variant})
    backend, dtype, here, fixed = tg.table_key(base)
    others = [e for e in store.entries if tg.table_key(e)[:2] == (backend, dtype) and tg.fixed(e) == fixed
              and tuple(e["bucket"]) != here and tg.usable(e, job.spec.kernel_sha, offered)
              and tg.how_timed(e) == tg.how_timed(base)]
    chosen = tg.picks(others, job.spec.kernel_sha, offered, base.get("reference_sha"))
    return [p.params for k, p in sorted(chosen.items(), key=lambda kp: (_runtime.distance(kp[0][2], here), kp[0][2]))]


def _report(job: CaseJob, store, base: dict, say) -> bool:
    """Say the fastest current config at this job's case (and how the default compares), and, where
    the bucket has other cases timed the same way, the config chosen over all of them (what `kspec
    generate` embeds, unless entries timed otherwise decide); True if none passed at this case."""
    offered = tg.choices_of({job.variant.backend: job.variant})
    bucket = [e for e in store.entries if tg.table_key(e) == tg.table_key(base)
              and tg.usable(e, job.spec.kernel_sha, offered) and tg.how_timed(e) == tg.how_timed(base)
              and e.get("reference_sha") == base.get("reference_sha")]
    current = [e for e in bucket if e.get("case") == base["case"]]
    if not current:
        say("  no config passed")
        return True
    fastest = min(current, key=tg.cost)
    defaults = job.variant.defaults_at(job.case.dims)
    default = next((e for e in current if all(e["params"].get(p.name) == defaults[p.name]
                                              for p in job.variant.params if p.choices)), None)
    if job.sustained:
        lo, hi = fastest["speedup_ci95"]
        figure = f"{fastest['speedup']:.3f}x the reference ({lo:.3f}-{hi:.3f}), {fastest['ms']:.3f} ms"
        versus = f"; the default's: {default['speedup']:.3f}x" if default else ""
    else:
        figure = f"{fastest['ms']:.3f} ms"
        versus = f", {default['ms'] / fastest['ms']:.2f}x the default's {default['ms']:.3f} ms" if default else ""
    say(f"  best {fastest['params']}: {figure}{versus} -> {store.path}")
    if len({e.get("case") for e in bucket}) > 1:
        say(_bucket_line(base, bucket, job.spec.kernel_sha))
    return False


def _bucket_line(base: dict, bucket: list, sha: str) -> str:
    """The config picked for the bucket (`tg.picks`) over the cases its entries of this job's kind
    were timed at, and how it does at the worst of them."""
    pick, cases = tg.picks(bucket, sha)[tg.table_key(base)], {e.get("case") for e in bucket}
    if tg.how_timed(base) == "sustained":
        case, worst = min(((c, e["speedup"]) for c, e in pick.at.items()), key=lambda ce: ce[1])
        figure = f"{worst:.3f}x the reference at worst ({case})"
    else:
        figure = f"within {pick.score:.2f}x of the fastest config at each"
    timed = "" if len(pick.at) == len(cases) else f" (timed at {len(pick.at)})"
    return f"  bucket {base['bucket']} over {len(cases)} cases: {pick.params}{timed}, {figure}"


def tune_grad(job: CaseJob, store, gradient_sha: str, run: Callable[[BenchTask], Result],
              say: Callable[[str], None]) -> bool:
    """Time one job's forward and backward pass as backend="auto" runs it, the backward kernels
    included, against the reference's autodiff, round by round (a grad bench task), and record it:
    where it is slower, `kspec generate` makes auto differentiate the reference at this bucket. A case
    recorded already (any forward config) is skipped, unless its last entry was faster by its median
    but too noisy to count so (`tg.grad_figure`): that one is measured again. Another case of its
    bucket is measured, since the bucket counts as slower where any of its cases is. Returns True if
    the measurement failed."""
    # keyed as a tuning entry, but for the kernel and its backward kernels together (`gradient_sha`);
    # its params are the forward config that ran, recorded, not searched
    base = dict(job.base(), kernel_sha=gradient_sha, load=tg.GRAD)
    recorded = [e for e in store.entries if all(e.get(k) == base[k] for k in
                                                 ("backend", "bucket", "dtype", "kernel_sha", "load", "case"))
                and tg.fixed(e) == tg.fixed(base)]
    shown = f"{job.spec.name}[{job.variant.backend}] {job.case.name} {job.label}"
    last = recorded[-1] if recorded else None
    noisy = (last is not None and tg.cost(last) is not None and last["speedup"] >= 1.0
             and tg.grad_figure(last) < 1.0)
    if last is not None and not noisy:
        say(f"{shown}: recorded already ({last.get('speedup') or 0:.3f}x the reference's autodiff)")
        return False
    if noisy:
        lo, hi = last["speedup_ci95"]
        say(f"{shown}: measured again: {last['speedup']:.3f}x the reference's autodiff, but {lo:.3f}-{hi:.3f}")
    task = BenchTask(spec_path=str(job.spec.path), kernel=job.spec.name, backend=job.variant.backend,
                     case=job.case.name, case_index=job.index, dtypes=tuple(job.assign.items()),
                     dtype_label=job.label, seed=job.seed, out_root=str(job.out_root), suite=job.suite,
                     samples=job.samples, grad=True, grad_kernels=True)
    row = run(task)
    figures, tuned = row.extra, {p.name for p in job.variant.params if p.choices}
    entry = dict(base, params={k: v for k, v in (figures.get("params") or {}).items() if k in tuned},
                 status=row.status.value, ms=figures.get("ms"), message=row.message.splitlines()[0] if row.message else "")
    timed = row.passed and figures.get("speedup") is not None
    if timed:
        entry.update(ref_ms=figures["ref_ms"], speedup=figures["speedup"], speedup_ci95=figures["speedup_ci95"])
        if figures.get("calls_per_executable") is not None:
            entry["calls_per_executable"] = figures["calls_per_executable"]
        lo, hi = figures["speedup_ci95"]
        say(f"{shown}: forward and backward {figures['speedup']:.3f}x the reference's autodiff ({lo:.3f}-{hi:.3f})"
            + ("; auto will differentiate the reference here" if tg.grad_figure(entry) < 1.0 else ""))
    else:
        say(f"{shown}: {row.status}: {entry['message']}")
    store.append(entry)
    return not row.passed
