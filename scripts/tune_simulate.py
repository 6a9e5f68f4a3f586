"""Replay recorded `kspec tune` tables under each search strategy, without a device.

A table from an exhaustive run (tuning/<kernel>/<device>.json, see codegen/spec/tuning.py) holds
the time of every config of a space. For each backend x case x dtype in it, this runs the
strategies of codegen/tune/ (the code `kspec tune` runs) over many seeds, answering each
config with its recorded time, optionally times a log-normal noise of sigma `--noise` (a fresh
draw per config and seed: a rerun's spread), and counts how often the fastest config a strategy
timed is within `--within` percent of the recorded best, and how many configs it timed.

    python3 scripts/tune_simulate.py tuning/matmul/NVIDIA_H200.json [--seeds 1000] [--noise 0,0.02]

The spec is specs/<kernel>.yaml (`--specs DIR`); the device kind, for the roofline in the static
score, is the table's. Besides kspec's strategies it runs two halves of guided, for comparison:
`guided, no score` (flat static score) and `score order` (the best-scored configs only).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kspec.codegen.checks import instances  # noqa: E402
from kspec.codegen import project as pipeline
from kspec.codegen.spec import tuning
from kspec.codegen import tune as tn  # noqa: E402
from kspec.codegen.backends.devices import peak_for  # noqa: E402


def groups(spec, entries: list):
    """(variant, case, dtypes, how timed, {key(config): cost or None}) per backend x case x dtype in the
    table and way of timing: the time alone, or 1 / speedup under load (`kspec tune --sustained`)."""
    found: dict = {}
    for e in entries:
        if e["status"] != "pruned":
            where = (e["backend"], e["case"], e["dtype"], tuning.how_timed(e))
            found.setdefault(where, {})[tn.key(e["params"])] = tuning.cost(e)
    for (backend, name, label, how), times in sorted(found.items()):
        case = next((c for c in spec.bench + spec.cases if c.name == name), None)
        if case is None or backend not in spec.variants:
            print(f"skipped {backend} {name}: not in the spec")
            continue
        assign = next(a for a in instances.dtype_assignments(spec, case)
                      if ",".join(dict.fromkeys(a[o.name] for o in spec.inputs)) == label)
        yield spec.variants[backend], case, assign, how, times


def simulate(times, run, *, seeds: int, noise: float, within: float) -> tuple:
    """(share of seeds whose fastest timed config is within `within` of the best, mean configs timed)."""
    best = min(t for t in times.values() if t is not None)
    hits, tried_counts = 0, []
    for seed in range(seeds):
        draw = random.Random(f"noise {seed}")
        noisy = {k: t * math.exp(draw.gauss(0.0, noise)) if t is not None else None for k, t in times.items()}
        tried = run(seed, noisy)
        timed = {k: ms for k, ms in tried.items() if ms is not None}
        hits += bool(timed) and times[min(timed, key=timed.get)] <= best * (1 + within)
        tried_counts.append(len(tried))
    return hits / seeds, statistics.mean(tried_counts)


def replay(next_batch, noisy: dict) -> dict:
    tried: dict = {}
    while batch := next_batch(tried):
        tried.update((tn.key(c), noisy[tn.key(c)]) for c in batch)
    return tried


def strategies(configs, scores, budget):
    """name -> run(seed, noisy times) -> {key: ms or None} of the configs it timed."""
    def kspec(strategy, **kw):
        return lambda seed, noisy: replay(tn.search(configs, strategy=strategy, seed=seed, **kw), noisy)

    def score_order(seed, noisy):
        ties = random.Random(seed)
        ranked = sorted(zip(scores, (ties.random() for _ in configs), range(len(configs))))
        return {tn.key(configs[i]): noisy[tn.key(configs[i])] for *_, i in ranked[:budget]}

    return {
        "exhaustive": kspec("exhaustive", budget=None),
        "random": kspec("random", budget=budget),
        "guided": kspec("guided", budget=budget, scores=scores),
        "guided, no score": kspec("guided", budget=budget, scores=None),
        "score order": score_order,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", type=Path, help="tuning/<kernel>/<device>.json files")
    ap.add_argument("--specs", type=Path, default=ROOT / "specs", help="where <kernel>.yaml is (default: specs/)")
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--noise", default="0,0.02", help="sigmas of the log-normal timing noise, comma-separated")
    ap.add_argument("--within", type=float, default=3.0, help="percent from the best that counts as found")
    ap.add_argument("--budget", type=int, help="configs per search (default: a third of the space)")
    a = ap.parse_args()
    sigmas = [float(x) for x in a.noise.split(",")]
    for table in a.tables:
        doc = json.loads(table.read_text(encoding="utf-8"))
        compiled = pipeline.compile_spec(a.specs / f"{doc['kernel']}.yaml")
        if compiled.spec is None:
            print(f"{table}: specs/{doc['kernel']}.yaml does not load")
            return 2
        peak = peak_for(doc["device_kind"])
        for variant, case, assign, how, times in groups(compiled.spec, doc["entries"]):
            kept, _ = tn.prune(compiled.spec, variant, case, assign, tn.space(variant))
            configs = [c for c in kept if tn.key(c) in times]
            if not any(times[tn.key(c)] for c in configs):
                continue
            budget = a.budget or tn.default_budget("guided", len(configs))
            scores = tn.scores(compiled.spec, variant, case, assign, configs, peak)
            best = min(times[tn.key(c)] for c in configs if times[tn.key(c)] is not None)
            near = sum(1 for c in configs if (times[tn.key(c)] or math.inf) <= best * (1 + a.within / 100))
            print(f"\n{table}: {doc['kernel']}[{variant.backend}] {case.name} {assign[compiled.spec.inputs[0].name]} "
                  f"on {doc['device_kind']}, timed {how}: {len(configs)} configs ({len(kept) - len(configs)} of the pruned space "
                  f"not in the table), {near} within {a.within:g}% of the best, budget {budget}, {a.seeds} seeds\n")
            print("| strategy | configs timed | " + " | ".join(f"P(within {a.within:g}%), noise {s:g}" for s in sigmas)
                  + " |")
            print("|---|---|" + "---|" * len(sigmas))
            for name, run in strategies(configs, scores, budget).items():
                figures = [simulate(times, run, seeds=a.seeds, noise=s, within=a.within / 100) for s in sigmas]
                print(f"| {name} | {figures[0][1]:.1f} | " + " | ".join(f"{p:.3f}" for p, _ in figures) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
