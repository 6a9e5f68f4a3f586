"""Does alternating two power-bound kernels change their times? The persistent Mosaic GPU
matmul and XLA's cuBLAS matmul (bf16 8192³), timed (a) each alone, (b) in alternation, the way
`kspec bench` samples them, and (c) in alternation with an idle gap before every sample, while
`nvidia-smi` logs the SM clock and board power every 20 ms; each sample gets the mean clock and
power of the log lines inside it.

  python3 scripts/power_alternation.py [--samples 30] [--json FILE]

Needs a GPU with nvidia-smi. Timing: codegen/timing.py (the same helpers as bench and tune).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _log_lines(path: Path) -> list:
    """[(unix time, SM MHz, watts)] from an nvidia-smi CSV log."""
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[1].split()[0].isdigit():
            continue
        stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        out.append((stamp, float(parts[1].split()[0]), float(parts[2].split()[0])))
    return out


def _timed(calls: dict, order: list, reps: dict, gap_s: float) -> list:
    """[(name, start, end, seconds per call)] for each sample, in `order`."""
    import jax

    rows = []
    for name in order:
        if gap_s:
            time.sleep(gap_s)
        start = time.time()
        out = None
        for _ in range(reps[name]):
            out = calls[name]()
        jax.block_until_ready(out)
        end = time.time()
        rows.append((name, start, end, (end - start) / reps[name]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from kspec.codegen.run import timing
    from generated.matmul_persistent import matmul_persistent

    n = 8192
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    kspec_fn = jax.jit(lambda x, y: matmul_persistent(x, y, backend="mosaic_gpu"))
    xla_fn = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype))
    calls = {"kspec": lambda: kspec_fn(a, b), "xla": lambda: xla_fn(a, b)}
    err = float(jnp.max(jnp.abs(calls["kspec"]().astype(jnp.float32) - calls["xla"]().astype(jnp.float32))))
    timing.warm_up(calls, 2.0)
    reps = {k: timing.calibrate(c, 0.02) for k, c in calls.items()}

    log = Path(tempfile.mkdtemp()) / "smi.csv"
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader", "-lms", "20"],
        stdout=log.open("w"), stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        phases = {}
        phases["kspec alone"] = _timed(calls, ["kspec"] * args.samples, reps, 0.0)
        time.sleep(2.0)
        phases["xla alone"] = _timed(calls, ["xla"] * args.samples, reps, 0.0)
        time.sleep(2.0)
        order = [name for s in range(args.samples) for name in (["kspec", "xla"] if s % 2 == 0 else ["xla", "kspec"])]
        phases["alternating (bench)"] = _timed(calls, order, reps, 0.0)
        time.sleep(2.0)
        phases["alternating, 0.2 s idle before each sample"] = _timed(calls, order, reps, 0.2)
        time.sleep(0.5)
    finally:
        smi.terminate()
        smi.wait()
    lines = _log_lines(log)

    report = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "max_abs_diff": err,
              "reps_per_sample": reps, "phases": {}}
    print(f"jax {jax.__version__} on {report['device']}; bf16 {n}^3; {args.samples} samples per kernel and phase")
    print("| phase | kernel | median ms | p10-p90 ms | mean SM MHz | mean W |")
    print("|---|---|---|---|---|---|")
    for phase, rows in phases.items():
        report["phases"][phase] = {}
        for name in ("kspec", "xla"):
            mine = [r for r in rows if r[0] == name]
            if not mine:
                continue
            st = timing.stats([r[3] for r in mine])
            inside = [ln for ln in lines for r in mine if r[1] <= ln[0] <= r[2]]
            mhz = statistics.mean(ln[1] for ln in inside) if inside else float("nan")
            watts = statistics.mean(ln[2] for ln in inside) if inside else float("nan")
            report["phases"][phase][name] = dict(st, sm_mhz=mhz, watts=watts, smi_lines=len(inside))
            print(f"| {phase} | {name} | {st['median_ms']:.3f} | {st['p10_ms']:.3f}-{st['p90_ms']:.3f} | {mhz:.0f} | {watts:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
