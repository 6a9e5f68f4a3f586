"""A sharded kspec kernel across processes: jax.distributed on localhost, CPU devices.

    python3 scripts/distributed_verify.py [--processes 2] [--devices-per-process 4] [--kernel softmax_rows]

Starts that many copies of itself (process ids 0..n-1), each with its own CPU devices
(forced host devices) and the gloo CPU collectives, joined by jax.distributed. Every
process builds the same global mesh over all processes' devices, makes the global inputs
with jax.make_array_from_callback (each process supplies only its own shards), runs
generated/<kernel>/sharded.py, and checks its own shards of the result against the
reference run on the whole inputs. Exit status 0 when every process passed.
Multi-host deployment is the same program with a real coordinator address, one process
per host, and NCCL (GPU) or ICI (TPU) carrying the collectives instead of gloo.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Global input shapes per kernel (sized for 8 devices in all). Only specs with check_vma off can
# run across processes on the CPU: see the comment in worker().
SHAPES = {"softmax_rows": [(128, 512)]}


def worker(process_id: int, args) -> int:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_process}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, str(ROOT))
    import importlib

    import jax
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on the CPU
    jax.distributed.initialize(
        coordinator_address=args.coordinator, num_processes=args.processes, process_id=process_id
    )
    package = importlib.import_module(f"generated.{args.kernel}")
    sharded = importlib.import_module(f"generated.{args.kernel}.sharded")
    mesh = sharded.make_mesh()  # over jax.devices(): every process's
    rng = np.random.default_rng(0)  # the same seed everywhere: every process knows the global inputs
    whole = [rng.standard_normal(s).astype(np.float32) for s in SHAPES[args.kernel]]
    inputs = [
        jax.make_array_from_callback(x.shape, jax.sharding.NamedSharding(mesh, spec), lambda index, x=x: x[index])
        for x, spec in zip(whole, sharded.IN_SPECS)
    ]
    # The interpret backend: TPU interpret mode (mosaic_tpu) simulates all devices in one process,
    # so it waits forever for the other process's devices; interpret=True needs check_vma off.
    out = getattr(sharded, f"{args.kernel}_sharded")(*inputs, mesh=mesh, backend="interpret")
    want = np.asarray(getattr(package, f"{args.kernel}_reference")(*whole))
    worst = max(float(np.max(np.abs(np.asarray(s.data) - want[s.index]))) for s in out.addressable_shards)
    ok = worst <= 1e-3 * max(1.0, float(np.max(np.abs(want))))
    line = (f"process {process_id}/{jax.process_count()}: {jax.local_device_count()} local of {jax.device_count()} "
            f"devices, mesh {dict(mesh.shape)}, {args.kernel}: max abs err {worst:.2e} {'pass' if ok else 'FAIL'}\n")
    # One write of the whole line: the processes share the parent's stdout pipe, and print() writes
    # the text and its newline separately, so two lines could interleave ("...passprocess 1/2...").
    sys.stdout.write(line)
    sys.stdout.flush()
    jax.distributed.shutdown()
    return 0 if ok else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=4)
    parser.add_argument("--kernel", default="softmax_rows", choices=sorted(SHAPES))
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is not None:
        return worker(args.process_id, args)
    coordinator = f"127.0.0.1:{_free_port()}"
    common = [sys.executable, __file__, "--processes", str(args.processes), "--kernel", args.kernel,
              "--devices-per-process", str(args.devices_per_process), "--coordinator", coordinator]
    procs = [subprocess.Popen(common + ["--process-id", str(i)]) for i in range(args.processes)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=args.timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"timed out after {args.timeout:g} s", file=sys.stderr)
            return 1
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
