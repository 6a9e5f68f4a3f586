"""The calibration of `kspec verify`'s tolerances (docs/verify.md, "Tolerances"), on the CPU.

    python scripts/calibrate_tolerances.py [--seeds 20] [--first-seed 0] [--spec specs/softmax.yaml ...]
                                           [--mutant NAME ...] [--no-library] [--no-mutants] [--backend NAME ...]

Two halves, both with the `interpret` backend (or --backend's) on standard normal inputs (no other input kinds):

- the library: every task (case x dtype x run/grad) of every spec in specs/ that has the backend, on
  the seeds first-seed ... first-seed + seeds - 1; each must pass;
- mutants: library kernels with a planted bug (MUTANTS below), each a copy of its spec with one line of
  the base body changed, generated into a project of its own in a temporary folder; on every seed,
  the mutant's `run` tasks of the listed dtypes must fail (except where `expect` says the bug is below
  the dtype's resolution).

For each it reports how close the outputs came to the rule's bounds: the worst element's
|out - ref| / (atol * s + rtol * |ref|) and rel_err over the tolerance's rel_err, as compare() measures
them (an output passes when both are at most 1). The library's figures are the largest over the seeds, the
mutants' the smallest. Prints markdown tables; exits 1 if a library task fails, or a mutant passes
where it should fail.

It runs verify's own worker code (kspec.codegen.run.worker.run_task) in this process, one task after
another, with verify's numerics (every bfloat16 rounding kept, as in verify's worker for simulated
kernels), and records every comparison compare() makes. The inputs of a task depend on the seed, the
kernel's name, the case and the dtypes, so a mutant, which keeps its kernel's name, runs on the same
data as the kernel. The whole run (20 seeds, library and mutants) takes several minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))  # the repository root is the `kspec` package

from kspec.codegen.run import pool  # noqa: E402

# verify's numerics for the interpret and TPU interpret tasks on the CPU (codegen/run/pool.py): XLA keeps
# every bfloat16 rounding the kernel asks for. Set before jax is imported, in this process that runs them.
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), pool.TPU_NUMERICS]).strip()

from kspec.codegen import project as pipeline  # noqa: E402
from kspec.codegen import verify as v  # noqa: E402
from kspec.codegen.run import compare, kinds, worker  # noqa: E402
from kspec.codegen.spec import dtypes as dt  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    spec: str  # the library spec it copies
    bug: str  # what is wrong, for the table
    old: str  # the text of the base body it replaces (exactly one occurrence)
    new: str
    dtypes: tuple = ("bfloat16",)  # the dtypes whose run tasks are judged
    expect: dict = dataclasses.field(default_factory=dict)  # dtype -> "pass" where the bug is below its resolution


MUTANTS = (
    Mutant("softmax_zeros", "softmax", "returns all zeros",
           "o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)",
           "o_ref[...] = jnp.zeros_like(o_ref)"),
    Mutant("softmax_sum_plus_one", "softmax", "divides by the sum + 1",
           "o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True))",
           "o_ref[...] = (e / (jnp.sum(e, axis=-1, keepdims=True) + 1))"),
    Mutant("flash_attention_scores_bf16", "flash_attention", "rounds the scores s to bfloat16 before the softmax",
           "      ) * scale\n", "      ) * scale\n      s = s.astype(jnp.bfloat16).astype(jnp.float32)\n"),
    Mutant("flash_attention_no_rescale", "flash_attention", "does not rescale the accumulator by alpha",
           "acc = acc * alpha[:, None] + pv", "acc = acc + pv"),
    Mutant("rms_norm_n_minus_1", "rms_norm", "takes the mean square over N - 1",
           "lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)",
           "lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) / (N - 1) + eps)",
           dtypes=("float32", "bfloat16"), expect={"bfloat16": "pass"}),
)


class Recorder:
    """Wraps compare.compare (which compare_all calls) to keep each output's verdict."""

    def __init__(self):
        self.seen: list = []
        self._compare = compare.compare

    def __enter__(self):
        def recording(out, ref, atol, rtol, normwise=None, **kw):
            verdict = self._compare(out, ref, atol, rtol, normwise, **kw)
            if "worst_ratio" in verdict:
                self.seen.append(verdict)
            return verdict

        compare.compare = recording
        return self

    def __exit__(self, *exc):
        compare.compare = self._compare


def run(tasks: list) -> list:
    """(task, result, [per-output verdicts]) for each task, run in this process."""
    out = []
    for task in tasks:
        with Recorder() as rec:
            row = worker.run_task(task)
        out.append((task, row, rec.seen))
    return out


def plan(compiled: list, seeds: range, backends: list) -> list:
    """The tasks verify would run (skipped ones left out), one schedule each in TPU interpret mode."""
    import jax

    tasks = []
    for seed in seeds:
        got, _ = v.plan(compiled, backends=backends, cases=[], seed=seed, lower=False, platform=jax.default_backend(),
                        schedules=1, inputs=(kinds.NORMAL,))
        tasks += got
    return tasks


def ratios(verdicts: list) -> tuple:
    """(worst element / bound, rel_err / bound) over the outputs a task compared."""
    return (max((x["worst_ratio"] for x in verdicts), default=0.0),
            max((x["norm_ratio"] for x in verdicts), default=0.0))


def key_dtype(task) -> str:
    """The dtype whose tolerance the task uses: the least precise float dtype of its operands."""
    return dt.least_precise([d for _, d in task.dtypes]) or task.dtype_label


def library(specs: list, seeds: range, backends: list) -> tuple:
    compiled = [c for c in pipeline.compile_all(specs) if c.spec is not None]
    done = run(plan(compiled, seeds, backends))
    groups: dict = {}
    for task, row, seen in done:
        kernel = task.kernel if backends == ["interpret"] else f"{task.kernel} ({task.backend})"
        tol = tuple((row.tolerance or {}).get(k) for k in ("atol", "rtol", "rel_err"))
        g = groups.setdefault((kernel, key_dtype(task), tol), {"tasks": set(), "runs": 0, "passed": 0, "worst": (0, ""),
                                                                  "norm": (0, ""), "failures": []})
        label = f"{task.case} {task.mode}"
        g["tasks"].add(label)
        g["runs"] += 1
        g["passed"] += row.passed
        if not row.passed:
            g["failures"].append(f"{task.label} seed {task.seed}: {row.status}: {row.message}")
        worst, norm = ratios(seen)
        g["worst"] = max(g["worst"], (worst, label))
        g["norm"] = max(g["norm"], (norm, label))
    lines = ["| kernel | dtype | atol, rtol, rel_err | tasks | passed | worst element / bound | rel_err / bound |",
             "|---|---|---|---|---|---|---|"]
    failures = []
    for (kernel, dtype, tol), g in sorted(groups.items(), key=lambda item: (item[0][:2], str(item[0][2]))):
        lines.append(f"| {kernel} | {dtype} | {', '.join(map(_g, tol))} | {len(g['tasks'])} | "
                     f"{g['passed']}/{g['runs']} | {g['worst'][0]:.2f} ({g['worst'][1]}) | "
                     f"{g['norm'][0]:.2f} ({g['norm'][1]}) |")
        failures += g["failures"]
    return "\n".join(lines), failures, len(done)


def _g(x) -> str:
    return "-" if x is None else f"{x:g}"


def build(mutant: Mutant, root: Path) -> Path:
    """A project in `root` holding the mutant (its kernel's name kept) and the specs its vjp names."""
    specs = root / "specs"
    specs.mkdir(parents=True)
    (root / "kspec.toml").write_text(f'out = "mutant_{mutant.name}"\n')
    text = (REPO / "specs" / f"{mutant.spec}.yaml").read_text()
    body = text.split("\nbody: |\n", 1)[1].split("\nreference: |\n", 1)[0]
    if body.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: the body of specs/{mutant.spec}.yaml does not hold {mutant.old!r} once")
    text = text.replace(body, body.replace(mutant.old, mutant.new))
    (specs / f"{mutant.spec}.yaml").write_text(text)
    wanted = set(re.findall(r"spec:\s*(\S+\.yaml)", text))
    while wanted:  # the backward specs, and theirs
        name = wanted.pop()
        if not (specs / name).exists():
            linked = (REPO / "specs" / name).read_text()
            (specs / name).write_text(linked)
            wanted |= set(re.findall(r"spec:\s*(\S+\.yaml)", linked))
    r = subprocess.run([sys.executable, "-m", "kspec", "generate"], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO.parent)})
    if r.returncode != 0:
        raise SystemExit(f"{mutant.name}: kspec generate failed:\n{r.stdout}{r.stderr}")
    return specs / f"{mutant.spec}.yaml"


def mutants(seeds: range, chosen: list, backends: list) -> tuple:
    lines = ["| kernel | planted bug (--mutant) | dtype | seeds failed | lowest worst element / bound "
             "| lowest rel_err / bound |", "|---|---|---|---|---|---|"]
    wrong = []
    with tempfile.TemporaryDirectory(prefix="kspec-mutants-") as tmp:
        for mutant in chosen:
            path = build(mutant, Path(tmp) / mutant.name)
            compiled = [c for c in pipeline.compile_all([path])
                        if c.spec is not None and c.path.resolve() == path.resolve()]
            tasks = [t for t in plan(compiled, seeds, backends) if t.mode == "run"]
            done = run([t for t in tasks if key_dtype(t) in mutant.dtypes])
            for dtype in mutant.dtypes:
                per_seed: dict = {}
                for task, row, seen in done:
                    if key_dtype(task) != dtype:
                        continue
                    failed, worst, norm = per_seed.get(task.seed, (False, 0.0, 0.0))
                    w, n = ratios(seen)
                    per_seed[task.seed] = (failed or not row.passed, max(worst, w), max(norm, n))
                failed = sum(f for f, _, _ in per_seed.values())
                expect = mutant.expect.get(dtype, "fail")
                if (expect == "fail" and failed < len(per_seed)) or (expect == "pass" and failed):
                    wrong.append(f"{mutant.name} {dtype}: failed on {failed} of {len(per_seed)} seeds, "
                                 f"expected to {expect}")
                note = "" if expect == "fail" else " (below the dtype's resolution)"
                lowest = [min(x[i] for x in per_seed.values()) for i in (1, 2)]
                lines.append(f"| {mutant.spec} | {mutant.bug} (`{mutant.name}`) | {dtype}{note} | "
                             f"{failed}/{len(per_seed)} | {lowest[0]:.2f} | {lowest[1]:.2f} |")
            shutil.rmtree(Path(tmp) / mutant.name, ignore_errors=True)
    return "\n".join(lines), wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--spec", action="append", type=Path, help="only these library specs (default: specs/)")
    parser.add_argument("--mutant", action="append", choices=[m.name for m in MUTANTS], help="only these mutants")
    parser.add_argument("--no-library", action="store_true", help="skip the library")
    parser.add_argument("--no-mutants", action="store_true", help="skip the mutants")
    parser.add_argument("--backend", action="append", help="these backends instead of interpret (repeatable)")
    args = parser.parse_args()
    logging.getLogger("jax._src.callback").setLevel(logging.CRITICAL)
    import jax

    backends = args.backend or ["interpret"]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    start = time.monotonic()
    bad = []
    print(f"seeds {seeds.start}..{seeds.stop - 1}, backends {', '.join(backends)}, jax {jax.__version__} on "
          f"{jax.devices()[0].device_kind}\n")
    if not args.no_library:
        table, failures, count = library(pipeline.discover(args.spec or [REPO / "specs"]), seeds, backends)
        print(f"Library ({count} tasks):\n\n{table}\n")
        bad += failures
    if not args.no_mutants:
        chosen = [m for m in MUTANTS if not args.mutant or m.name in args.mutant]
        table, wrong = mutants(seeds, chosen, backends)
        print(f"Mutants:\n\n{table}\n")
        bad += wrong
    print(f"{time.monotonic() - start:.0f} s")
    for line in bad:
        print(f"NOT AS CALIBRATED: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
