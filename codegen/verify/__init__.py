"""`kspec verify`: run every generated kernel against its reference.

The parent process plans tasks (spec x backend x case x dtype) and hands them to the
worker pool (kspec.codegen.run.pool), which runs them one at a time in worker processes
(kspec.codegen.run.worker): a task that crashes its worker, hangs past the timeout or
exhausts memory fails alone. Only the workers import jax and the generated modules.
"""

from __future__ import annotations

import dataclasses
import fnmatch

from kspec.codegen.checks import instances, semantic
from kspec.codegen import project as pipeline
from kspec.codegen.emit import writer
from kspec.codegen.spec import dtypes as dt
from kspec.codegen.spec import tuning
from kspec.codegen.backends import BACKENDS
from kspec.codegen.run import gpu_interpret, kinds
from kspec.codegen.run.tasks import DEFAULT_SCHEDULES, STATUSES, GradTask, LowerTask, RunTask, ShardedTask, result

def case_selected(name: str, patterns) -> bool:
    """Whether a case named `name` is among `patterns` (--case): names, or shell-style patterns
    such as `llm_M1000_*`. No patterns select every case."""
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def shard_names(weights: dict, index: int, count: int) -> list:
    """The case names of shard `index` of `count` ({name: weight}): the heaviest first, each to the
    shard with the least weight so far (ties to the lower shard), so that shards of one family
    take about equal work and every process of a split run computes the same split."""
    loads, mine = [0] * count, []
    for name, weight in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
        least = loads.index(min(loads))
        loads[least] += weight
        if least == index:
            mine.append(name)
    return sorted(mine)


def matrix(compiled: list, *, backends: list, cases: list, suite: str = "cases"):
    """Every (compiled spec, backend, case index, case, dtype assignment, input-dtype label) the
    filters keep: the one loop behind verify, sharded verify and bench plans. `suite`
    "bench" takes a spec's bench cases (its verify cases when it has none)."""
    for c in compiled:
        spec = c.spec
        chosen = spec.sweep if suite == "sweep" else spec.bench if suite == "bench" and spec.bench else spec.cases
        for name in spec.backends:
            if backends and name not in backends:
                continue
            for i, case in enumerate(chosen):
                if not case_selected(case.name, cases):
                    continue
                for assign in instances.dtype_assignments(spec, case):
                    label = tuning.case_dtype_label(spec, case, assign)
                    yield c, name, i, case, assign, label


def derived_matrix(compiled: list, *, backends: list, cases: list, exhaustive: bool):
    """Like `matrix`, for the cases verify derives from each spec (codegen/checks/derive.py), with
    the `derive.Derived` in place of the case index: by default each runs its first dtype
    assignment on a backend; `exhaustive`, every one."""
    for c in compiled:
        spec = c.spec
        index = {case.name: i for i, case in enumerate(spec.cases)}
        for d in semantic.derived_cases(spec, exhaustive):
            if not case_selected(d.case.name, cases):
                continue
            for name in spec.backends:
                if backends and name not in backends:
                    continue
                assigns = list(instances.dtype_assignments(spec, d.case))
                if not exhaustive:
                    variant = spec.variants[name]
                    assigns = [next((a for a in assigns if variant.supports(a)), assigns[0])]
                for assign in assigns:
                    label = tuning.case_dtype_label(spec, d.case, assign)
                    yield c, name, index[d.base], d, assign, label


def plan(
    compiled: list, *, backends: list, cases: list, seed: int, lower: bool, platform: str | None, repeat: int = 1,
    schedules: int = DEFAULT_SCHEDULES, inputs: tuple = ("default",), exhaustive: bool = False,
) -> tuple:
    """(tasks, skipped results) for every valid spec; `repeat` runs it all with seeds seed, seed+1, ...;
    `schedules`: how many schedules each mosaic_tpu task runs under in TPU interpret mode;
    `inputs`: the --inputs selection, the input kinds each `run` task runs (kinds.chosen).
    A spec with `vjp:` also gets a grad task (its gradients against the reference's) for each
    combination with a floating-point input.

    Then the derived cases: by default those that add coverage the declared cases lack, each on
    its first dtype assignment, normal inputs only, under one schedule and without grad tasks;
    `exhaustive`: every derived case, dtype assignment and grad task, with the declared cases' inputs
    and schedules (and every input kind under `--inputs default`)."""
    tasks, skipped = [], []
    for k in range(repeat):
        for c, name, i, case, assign, label in matrix(compiled, backends=backends, cases=cases):
            for task, why in _tasks(c, name, i, case, assign, label, seed + k, lower, platform, schedules,
                                    kinds.chosen(inputs, c.spec, assign, i), True, tuple(backends)):
                if not why:
                    tasks.append(task)
                elif k == 0:
                    skipped.append(_skipped(task, why))
        for c, name, i, d, assign, label in derived_matrix(compiled, backends=backends, cases=cases,
                                                           exhaustive=exhaustive):
            chosen = (kinds.NORMAL,)
            if exhaustive:
                chosen = kinds.chosen(("all",) if inputs == ("default",) else inputs, c.spec, assign, i)
            for task, why in _tasks(c, name, i, d.case, assign, label, seed + k, lower, platform,
                                    schedules if exhaustive else 1, chosen, exhaustive, tuple(backends)):
                task = dataclasses.replace(task, case_dims=tuple(d.case.dims.items()))
                if not why:
                    tasks.append(task)
                elif k == 0:
                    skipped.append(_skipped(task, why))
    return tasks, skipped


def _skipped(task, why: str):
    """A skipped task's row: a run task's names the input kinds it would have run, as a run row does."""
    return result(task, "skip", why, **({"inputs": list(task.inputs)} if isinstance(task, RunTask) else {}))


def _tasks(c, name: str, i: int, case, assign: dict, label: str, seed: int, lower: bool, platform: str | None,
           schedules: int, chosen: tuple, grad: bool, asked: tuple = ()) -> list:
    """[(task, skip reason or None)] for one case x backend x dtype assignment: a run (or lower)
    task, and a grad task when the spec has `vjp:`, `grad` asks for it and an input is floating-point.
    `asked`: the backends named by --backend (off a GPU, a Triton body runs interpreted only if named)."""
    common = dict(spec_path=str(c.path), kernel=c.spec.name, backend=name, case=case.name, case_index=i,
                  dtypes=tuple(assign.items()), dtype_label=label, seed=seed,
                  out_root=str(pipeline.out_root_for(c.path)))
    planned = [LowerTask(**common) if lower else RunTask(**common, schedules=schedules, inputs=chosen)]
    if grad and c.spec.vjp is not None and any(dt.is_float(assign[o.name]) for o in c.spec.inputs):
        planned.append(LowerTask(**common, grad=True) if lower else GradTask(**common))
    why = (_mesh_only_reason(c.spec) or _skip_reason(name, platform, lower, asked=name in asked)
           or _dtype_reason(c.spec.variants[name], assign, case))
    return [(task, why) for task in planned]


def plan_sharded(
    compiled: list, *, devices: int, device_count: int, backends: list, cases: list, seed: int, platform: str | None,
    lower: bool = False,
) -> tuple:
    """(tasks, results) for `kspec verify --devices N`: each spec with `sharding:` runs its
    sharded function on a mesh of N devices, per backend x case x dtype, against the reference;
    with `lower` (`--lower --devices N`), lowers it on that mesh for the backend's platform instead.
    A mesh axis sized by the device count gets its size only now, so the split dims and the
    per-shard rules (E804, E806) are checked here too; a failure is an error result."""
    from kspec.codegen.checks import sharding

    tasks, done = [], []
    sharded = [c for c in compiled if c.spec.sharding is not None]
    for c, name, i, case, assign, label in matrix(sharded, backends=backends, cases=cases):
        spec, sh = c.spec, c.spec.sharding
        found = sharding.case_checks(spec, case, sh.sizes(devices))
        task = ShardedTask(spec_path=str(c.path), kernel=spec.name, backend=name, case=case.name, case_index=i,
                           dtypes=tuple(assign.items()), dtype_label=label, seed=seed,
                           out_root=str(pipeline.out_root_for(c.path)), devices=devices, lower=lower)
        why = (
            _sharded_skip_reason(name, sh, devices, device_count, platform, lower)
            or _dtype_reason(spec.variants[name], assign, case)
        )
        if why:
            done.append(result(task, "skip", why))
        elif found:
            done.append(result(task, "error", "\n".join(d.format() for d in found)))
        else:
            tasks.append(task)
    return tasks, done


def _sharded_skip_reason(
    backend: str, sh, devices: int, device_count: int, platform: str | None, lower: bool = False
) -> str | None:
    if lower and _skip_reason(backend, platform, lower=True):
        return _skip_reason(backend, platform, lower=True)
    if backend == "interpret" and sh.check_vma and not lower:
        return "interpret=True pallas_calls fail inside shard_map(check_vma=True) in jax 0.10.2; mosaic_tpu covers it"
    if device_count < devices:
        return f"needs {devices} devices; jax sees {device_count} {platform} device(s)"
    return sh.unfit(devices) or _skip_reason(backend, platform, lower=lower)


def _mesh_only_reason(spec) -> str | None:
    """Why a single-device run or lowering skips the spec: it is `sharding.mesh_only`."""
    if spec.sharding is not None and spec.sharding.mesh_only:
        return "mesh-only spec (sharding.mesh_only): it runs on a device mesh only; kspec verify --devices N runs it"
    return None


def _skip_reason(backend: str, platform: str | None, lower: bool, asked: bool | None = None) -> str | None:
    """Why a task of `backend` does not run here, or None. `asked`: whether --backend named it (None: a
    sharded task, which runs Triton on a GPU only)."""
    info = BACKENDS[backend]
    if lower:
        return None if info.lowering_platform else "nothing to lower: runs in interpret mode"
    if platform in info.platforms or info.simulated:  # runs here, or in TPU interpret mode
        return None
    if info.interprets_off_device and asked:  # its body in an interpret mode, as asked
        if info.off_device_mode == "mosaic_gpu" and not gpu_interpret.available():
            return gpu_interpret.MISSING
        return None
    why = f"needs a {'/'.join(info.platforms)} device; this machine's jax platform is {platform}"
    if info.interprets_off_device and asked is not None:
        why += f" (`--backend {backend}` runs it here in {info.off_device_name})"
    return why


def _dtype_reason(variant, assign: dict, case=None) -> str | None:
    if variant.supports(assign):
        return instances.unmet(variant, case) if case is not None else None
    allowed = "; ".join(f"{k}: {', '.join(v)}" for k, v in variant.dtypes.items())
    return f"{variant.backend} takes only {allowed}"


def stale(compiled: list) -> list:
    """(path, reason) for generated files that do not match their spec.

    _tuning.py is left out: runs pass every param explicitly, and `kspec tune`
    itself outdates it until the next `kspec generate`."""
    out = []
    for c in compiled:
        kernel_dir, planned = pipeline.plan(c, pipeline.out_root_for(c.path))
        out += [(p, why) for p, why in writer.compare(planned, kernel_dir) if p.name != "_tuning.py"]
    return out


def summary(results: list) -> dict:
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r["status"]] += 1
    return counts


def to_json(results: list, *, seed: int, jax_version: str, device: str) -> dict:
    from kspec import __version__

    return {
        "kspec_version": __version__,
        "jax_version": jax_version,
        "device": device,
        "seed": seed,
        "summary": summary(results),
        "results": results,
    }


def to_junit(results: list) -> str:
    import xml.etree.ElementTree as ET

    counts = summary(results)
    suite = ET.Element(
        "testsuite",
        name="kspec verify",
        tests=str(len(results)),
        failures=str(counts["fail"]),
        errors=str(counts["error"]),
        skipped=str(counts["skip"]),
        time=f"{sum(r['seconds'] or 0 for r in results):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"{r['kernel']}.{r['backend']}",
            name=f"{r['case']}[{r['dtype']}]{'' if r['mode'] in ('run', 'sharded') else '(' + r['mode'] + ')'}",
            time=f"{r['seconds'] or 0:.3f}",
        )
        if r["status"] in ("fail", "error", "skip"):
            tag = {"fail": "failure", "error": "error", "skip": "skipped"}[r["status"]]
            ET.SubElement(case, tag, message=r["message"][:500]).text = r["message"]
    return ET.tostring(suite, encoding="unicode")
