"""Hardware counters of the 8192³ bf16 matmuls: XLA's (cuBLAS), kspec's and jax's own Hopper matmul.

XLA's is profiled twice: as the f32-accumulate competitor (`jnp.dot` with float32 accumulation, then cast
to bf16) and as a plain `jnp.dot` of bf16 arrays ("xla bf16 out"). Compiles and checks each first,
then runs each once between `cuProfilerStart` and `cuProfilerStop`, so that Nsight Compute, started
with `--profile-from-start off`, profiles those calls and none of XLA's autotuning or the warm-up:

    ncu --profile-from-start off --clock-control none --set full -o OUT/matmul \\
        python3 scripts/profile_matmul.py [--size 8192]
    ncu -i OUT/matmul.ncu-rep --page details --csv > OUT/matmul-details.csv

(`--clock-control none` leaves the clocks alone: by default ncu locks them to the base clock.)
Without ncu it runs the same calls and prints which ran. Needs a Hopper GPU; the repo root on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# What is profiled unless --only says otherwise: XLA's two forms, kspec's two matmuls, jax's Hopper matmul.
PROFILED = ("xla", "xla bf16 out", "kspec matmul_persistent", "kspec matmul_pingpong", "hopper 128x256 snake4")


def _profiler(cuda, on: bool) -> int:
    """Start or stop the profiler on the device's primary context (jax's), from this thread."""
    ctx = ctypes.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    return cuda.cuProfilerStart() if on else cuda.cuProfilerStop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--only", action="append", help="Profile only these (repeatable), e.g. 'xla'.")
    args = parser.parse_args()

    import jax

    from scripts.bench_hopper_matmul import checked_matmuls

    calls, errors, failed = checked_matmuls(args.size, args.only or PROFILED)
    for label, call in calls.items():
        print(f"{label}: compiled, relative error {errors[label]:.1e}", flush=True)
        for _ in range(3):
            jax.block_until_ready(call())
    for label, why in failed.items():
        print(f"{label}: not profiled: {why}", flush=True)
    cuda = ctypes.CDLL("libcuda.so.1")
    print("cuProfilerStart:", _profiler(cuda, True), flush=True)
    for label, call in calls.items():
        jax.block_until_ready(call())
        print(f"profiled: {label}", flush=True)
    print("cuProfilerStop:", _profiler(cuda, False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
