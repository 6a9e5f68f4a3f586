"""Random vs exhaustive tuning, compared side by side in one process.

Loads two `kspec tune` result tables (tuning/<kernel>/<device>.json format, see
codegen/tuning.py), one from an exhaustive run and one from a random run, takes each run's
best config (plus the exhaustive run's runners-up and the spec's default), and re-times them
all through the generated module, interleaved, with kspec's own sampler (codegen/timing.py:
back-to-back calls per sample, one block at the end, names alternated and reversed every
round, inputs rotated past the L2). The exhaustive best is timed twice under two names (an
A/A control: the noise floor of the method). Prints medians, spreads and paired ratios.

    python3 scripts/tune_compare.py --exhaustive /tmp/tune-exh --random /tmp/tune-rnd \
        [--kernel matmul --backend triton --case b8192 --rounds 40 --json out.json]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kspec.codegen.run import timing
from kspec.codegen.spec import tuning as tg


def entries(root: Path, kernel: str, backend: str, case: str) -> list:
    out = []
    for es in tg.tables(root, kernel)[0].values():
        out += [e for e in es if e["backend"] == backend and e.get("case") == case]
    return out


def summary(es: list) -> dict:
    timed = sorted((e for e in es if e["status"] == "pass" and e.get("ms") is not None), key=lambda e: e["ms"])
    return {
        "tried": sum(1 for e in es if e["status"] != "pruned"),
        "timed": len(timed),
        "rejected": sum(1 for e in es if e["status"] not in ("pass", "pruned")),
        "pruned": sum(1 for e in es if e["status"] == "pruned"),
        "ranked": [(dict(sorted(e["params"].items())), e["ms"]) for e in timed],
    }


def key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def pct(values, q):
    v = sorted(values)
    if len(v) < 10:
        return v[0] if q < 50 else v[-1]
    qs = statistics.quantiles(v, n=10)
    return qs[0] if q < 50 else qs[-1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exhaustive", type=Path, required=True)
    ap.add_argument("--random", type=Path, required=True)
    ap.add_argument("--kernel", default="matmul")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--case", default="b8192")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--runners-up", type=int, default=2, help="exhaustive configs after the best to re-time too")
    ap.add_argument("--target-s", type=float, default=0.025, help="seconds per sample (calls back to back)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dims", help="M,K,N instead of the bench case's (smoke tests)")
    ap.add_argument("--dry-run", action="store_true", help="load the tables and print the plan only")
    a = ap.parse_args()

    exh, rnd = (summary(entries(p, a.kernel, a.backend, a.case)) for p in (a.exhaustive, a.random))
    if not exh["ranked"] or not rnd["ranked"]:
        print("error: a table has no timed config", exh["timed"], rnd["timed"])
        return 1
    space = exh["tried"] + exh["pruned"]
    print(f"exhaustive: {exh['tried']} tried ({exh['pruned']} pruned), {exh['timed']} timed, "
          f"{exh['rejected']} rejected; best {exh['ranked'][0][0]} {exh['ranked'][0][1]:.3f} ms")
    print(f"random:     {rnd['tried']} tried of a {space}-config space ({rnd['tried'] / space:.0%}), "
          f"{rnd['timed']} timed, {rnd['rejected']} rejected; best {rnd['ranked'][0][0]} {rnd['ranked'][0][1]:.3f} ms")
    in_tune = rnd["ranked"][0][1] / exh["ranked"][0][1]
    exh_ms = {key(p): ms for p, ms in exh["ranked"]}
    print(f"tune-time ratio random/exhaustive (two processes): {in_tune:.4f}; the random best as timed in the "
          f"exhaustive run: {exh_ms.get(key(rnd['ranked'][0][0]), float('nan')):.3f} ms")

    mod = importlib.import_module(f"generated.{a.kernel}.{a.backend}")
    spec_defaults = importlib.import_module(f"generated.{a.kernel}._tuning").DEFAULTS[a.backend]
    plan = [("exh_best", exh["ranked"][0][0]), ("exh_best_AA", exh["ranked"][0][0]), ("rnd_best", rnd["ranked"][0][0])]
    plan += [(f"exh_#{i + 2}", p) for i, (p, _) in enumerate(exh["ranked"][1 : 1 + a.runners_up])]
    plan += [("default", dict(spec_defaults))]
    for name, p in plan:
        print(f"  {name:12} {p}")
    if a.dry_run:
        return 0

    import jax
    import jax.numpy as jnp

    fn = getattr(mod, a.kernel)
    spec_case = {"b8192": (8192, 8192, 8192), "b4096": (4096, 4096, 4096), "b2048": (2048, 2048, 2048)}.get(a.case)
    M, K, N = spec_case if not a.dims else map(int, a.dims.split(","))
    dtype = jnp.bfloat16
    nbytes = (M * K + K * N) * 2
    copies = timing.copies_needed(nbytes, 60 << 20)
    arg_sets = []
    for c in range(copies):
        kx, ky = jax.random.split(jax.random.key(1000 + c))
        arg_sets.append([jax.random.normal(kx, (M, K), jnp.float32).astype(dtype),
                         jax.random.normal(ky, (K, N), jnp.float32).astype(dtype)])
    x0, y0 = arg_sets[0]
    ref = jnp.dot(x0, y0, preferred_element_type=jnp.float32)
    compiled, calls, check = {}, {}, {}
    t0 = time.perf_counter()
    for name, p in plan:
        k = key(p)
        if k not in compiled:
            compiled[k] = jax.jit(functools.partial(fn, **p)).lower(x0, y0).compile()
            out = compiled[k](x0, y0)
            check[k] = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
        calls[name] = timing.rotating(compiled[k], arg_sets)
    print(f"compiled {len(compiled)} configs in {time.perf_counter() - t0:.1f} s; input copies: {copies}; "
          f"rel err vs XLA dot: {', '.join(f'{v:.1e}' for v in check.values())}")
    del ref
    t0 = time.perf_counter()
    times = timing.sample(calls, samples=a.rounds, target_s=a.target_s, warm_s=2.0)
    print(f"timed {a.rounds} rounds of {len(calls)} configs in {time.perf_counter() - t0:.1f} s")

    flops = 2 * M * N * K
    rows = {}
    print(f"\n{'config':12} {'median ms':>9} {'p10':>7} {'p90':>7} {'TFLOP/s':>8}  params")
    for name, p in plan:
        s = timing.stats(times[name])
        rows[name] = dict(s, params=p, tflops=flops / (s["median_ms"] / 1e3) / 1e12, rel_err=check[key(p)])
        print(f"{name:12} {s['median_ms']:9.4f} {s['p10_ms']:7.4f} {s['p90_ms']:7.4f} {rows[name]['tflops']:8.1f}  {p}")

    def paired(num, den):
        r = [n / d for n, d in zip(times[num], times[den])]
        return {"median": statistics.median(r), "p10": pct(r, 10), "p90": pct(r, 90)}

    exh_names = ["exh_best"] + [f"exh_#{i + 2}" for i in range(min(a.runners_up, len(exh["ranked"]) - 1))]
    fastest_exh = min(exh_names, key=lambda n: rows[n]["median_ms"])
    ratios = {
        "rnd_best/exh_best": paired("rnd_best", "exh_best"),
        "exh_best_AA/exh_best": paired("exh_best_AA", "exh_best"),
        f"rnd_best/{fastest_exh} (fastest exhaustive re-timed)": paired("rnd_best", fastest_exh),
        "default/exh_best": paired("default", "exh_best"),
    }
    print("\npaired per-round ratios (median [p10, p90]):")
    for k, v in ratios.items():
        print(f"  {k:55} {v['median']:.4f} [{v['p10']:.4f}, {v['p90']:.4f}]")
    ratio = rows["rnd_best"]["median_ms"] / rows["exh_best"]["median_ms"]
    verdict = "MET" if ratio <= 1.03 and rnd["tried"] <= space / 3 else "NOT MET"
    print(f"\nissue 7: random best / exhaustive best (side by side, medians) = {ratio:.4f} "
          f"({(ratio - 1) * 100:+.2f}%); random tried {rnd['tried']}/{space} configs -> {verdict} "
          f"(target: within 3%, at most a third of the space)")
    if a.json:
        doc = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "kernel": a.kernel,
               "backend": a.backend, "case": a.case, "rounds": a.rounds, "target_s": a.target_s,
               "exhaustive": exh, "random": rnd, "space": space, "tune_time_ratio": in_tune,
               "retimed": rows, "paired_ratios": ratios, "ratio_medians": ratio, "verdict": verdict,
               "samples_ms": {n: [t * 1e3 for t in v] for n, v in times.items()}}
        a.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"-> {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
