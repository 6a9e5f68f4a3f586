"""kspec's Mosaic GPU matmuls against XLA and against jax's own Hopper matmul, in the same rounds.

Timed one after the other in short bursts, each at the clock it finds, two GPU kernels compare
differently than in the same rounds under sustained load. This script samples XLA's `jnp.dot` (in
two forms: float32 accumulation then a cast to bf16, and a plain bf16 `jnp.dot`), the generated
`matmul_persistent` and `matmul_pingpong` (tuned configs) and jax's `hopper_matmul_mgpu` at a few
configs in alternation, the way `kspec bench` does, after checking each against XLA, and reports
every median and the paired ratios (round by round, with a 95% interval for their median:
codegen/run/timing.py).

    python3 scripts/bench_hopper_matmul.py [--size 8192] [--samples 40] [--json out.json]

Needs a Hopper GPU and jax with Mosaic GPU; the repo root on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# hopper_matmul_mgpu's best published config (128x128 per warpgroup, warpgroups side by side in N: a 128x256 CTA tile,
# planar snake along N, 4 wide), then the same with 2-CTA clusters sharing B as kspec's kernels do.
_BASE = {"tile_m": 128, "tile_n": 128, "grid_minor_dim": "N", "wg_dimension": "N"}
HOPPER_CONFIGS = {
    "hopper 128x256 snake4": {**_BASE, "grid_tile_width": 4},
    "hopper 128x256 snake4 cluster-M": {**_BASE, "grid_tile_width": 4, "cluster_dimension": "M"},
    "hopper 128x256 snake16 cluster-M": {**_BASE, "grid_tile_width": 16, "cluster_dimension": "M"},
}


def hopper(config: dict):
    import jax
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    dims = {k: getattr(hm.MatmulDimension, v) for k, v in config.items() if k.endswith("_dimension")
            or k == "grid_minor_dim"}
    cfg = hm.TuningConfig(tile_k=64, max_concurrent_steps=4, epi_tile_n=64, epi_tile_m=64,
                          **dict(config, **dims))
    return jax.jit(functools.partial(hm.matmul, c=None, config=cfg))


def checked_matmuls(n: int, only=None) -> tuple:
    """(calls, errors, failed) for the n^3 bf16 matmuls, each checked against XLA's first: calls
    {name: a no-argument call on shared inputs} of those that ran right, errors {name: relative error},
    failed {name: why not}. `only` keeps the names it lists."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from generated.matmul_persistent import matmul_persistent
    from generated.matmul_pingpong import matmul_pingpong

    a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (n, n), jnp.float32).astype(jnp.bfloat16)
    xla = jax.jit(lambda p, q: jnp.dot(p, q, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    want = np.asarray(xla(a, b), np.float32)
    # What XLA makes of the f32-accumulate competitor (f32 accumulate, bf16 out): a cuBLAS call that writes
    # float32, then a convert kernel. `jnp.dot` of two bf16 arrays also accumulates in float32 on the
    # GPU but has cuBLAS write bf16 itself: one kernel. Both are timed; ratios are to the first.
    impls = {"xla": xla, "xla bf16 out": jax.jit(lambda p, q: jnp.dot(p, q)),
             "kspec matmul_persistent": jax.jit(matmul_persistent), "kspec matmul_pingpong": jax.jit(matmul_pingpong)}
    failed = {}
    for name, config in HOPPER_CONFIGS.items():
        try:
            impls[name] = hopper(config)
        except Exception as e:  # noqa: BLE001 - a config this jax does not take is reported, not fatal
            failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
    if only:
        impls = {k: v for k, v in impls.items() if k in only}
        failed = {k: why for k, why in failed.items() if k in only}
    calls, errors = {}, {}
    for name, fn in impls.items():
        try:
            got = np.asarray(fn(a, b), np.float32)
        except Exception as e:  # noqa: BLE001
            failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        errors[name] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        if errors[name] > 1e-2:
            failed[name] = f"wrong result: relative error {errors[name]:.2e}"
            continue
        calls[name] = functools.partial(fn, a, b)
    return calls, errors, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import jax

    from kspec.codegen.run import timing

    n = args.size
    calls, errors, failed = checked_matmuls(n)
    times = timing.sample(calls, samples=args.samples, warm_s=2.0)
    flops = 2 * n**3
    device = jax.devices()[0].device_kind
    print(f"{device}, jax {jax.__version__}, {n}^3 bf16, {args.samples} samples each, in alternation")
    rows = {}
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        speedup, lo, hi = timing.ratio(times["xla"], ts)
        rows[name] = {"ms": ms, "tflops": flops / (ms / 1e3) / 1e12, "vs_xla": speedup, "vs_xla_ci95": [lo, hi],
                      "rel_err": errors[name], "samples_ms": [t * 1e3 for t in ts]}
        print(f"{name:36s} {ms:7.3f} ms {rows[name]['tflops']:6.1f} TFLOP/s  vs XLA {speedup:.3f}x "
              f"({lo:.3f}-{hi:.3f})  rel err {errors[name]:.1e}")
    for name in [k for k in times if k.startswith("hopper") or k == "xla bf16 out"]:
        for mine in [k for k in times if k.startswith("kspec")]:
            r, lo, hi = timing.ratio(times[name], times[mine])
            rows[mine].setdefault("vs", {})[name] = {"ratio": r, "ci95": [lo, hi]}
            print(f"{mine} vs {name}: {r:.3f}x ({lo:.3f}-{hi:.3f})")
    for name, why in failed.items():
        print(f"{name}: not timed: {why}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "jax_version": jax.__version__, "size": n,
                                         "samples": args.samples, "results": rows, "not_timed": failed},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
