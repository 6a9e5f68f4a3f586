"""Flash attention forward: kspec's generated Triton kernel side by side with jax's Pallas
Triton `mha` and cuDNN (`jax.nn.dot_product_attention(implementation="cudnn")`), one process,
sampled in alternation (codegen/run/timing.py), after a correctness check of each against a
float32 reference. bf16, B4 S4096 H32 D128, causal and not. kspec's speedup over each is the
median of the per-round ratios, with a 95% interval.

    python3 scripts/bench_attention.py [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kspec.codegen.run import timing  # noqa: E402
from generated.flash_attention import flash_attention  # noqa: E402

B, S, H, D = 4, 4096, 32, 128


def competitors(causal: bool) -> dict:
    out = {"kspec triton": jax.jit(functools.partial(flash_attention, causal=causal, backend="triton"))}
    try:
        from jax.experimental.pallas.ops.gpu.attention import mha

        out["jax pallas mha"] = jax.jit(functools.partial(mha, segment_ids=None, causal=causal, sm_scale=D**-0.5))
    except Exception as e:  # noqa: BLE001 - report what is missing, time the rest
        print(f"jax pallas mha unavailable: {e}")
    out["cudnn"] = jax.jit(
        functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="cudnn")
    )
    out["xla"] = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="xla"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (B, S, H, D), jnp.float32).astype(jnp.bfloat16) for key in keys)
    rows = []
    for causal in (False, True):
        flops = 4 * B * H * S * S * D // (2 if causal else 1)
        with jax.default_matmul_precision("highest"):
            ref = jax.nn.dot_product_attention(
                q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), is_causal=causal
            )
        fns = competitors(causal)
        errs = {}
        for name, fn in list(fns.items()):
            try:
                out = fn(q, k, v).astype(jnp.float32)
                errs[name] = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed: {type(e).__name__}: {str(e)[:200]}")
                fns.pop(name)
        times = timing.sample({n: functools.partial(f, q, k, v) for n, f in fns.items()}, samples=args.samples)
        for name in fns:
            st = timing.stats(times[name])
            # kspec's speedup over it round by round, with a 95% interval (codegen/run/timing.py).
            speedup, lo, hi = timing.ratio(times[name], times["kspec triton"])
            rows.append({
                "causal": causal, "impl": name, "ms": st["median_ms"], "p10_ms": st["p10_ms"], "p90_ms": st["p90_ms"],
                "tflops": flops / (st["median_ms"] / 1e3) / 1e12, "rel_err": errs[name],
                "kspec_speedup_vs": speedup, "kspec_speedup_vs_ci95": [lo, hi],
                "samples_ms": [t * 1e3 for t in times[name]],
            })
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B{B} S{S} H{H} D{D} bf16")
    print("| causal | implementation | ms (p10-p90) | TFLOP/s | rel err | kspec speedup vs it (95% CI) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["kspec_speedup_vs_ci95"]
        print(f"| {r['causal']} | {r['impl']} | {r['ms']:.3f} ({r['p10_ms']:.3f}-{r['p90_ms']:.3f}) | "
              f"{r['tflops']:.1f} | {r['rel_err']:.2e} | {r['kspec_speedup_vs']:.3f}x ({lo:.3f}-{hi:.3f}) |")
    if args.json:
        args.json.write_text(json.dumps({"jax": jax.__version__, "device": jax.devices()[0].device_kind,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
