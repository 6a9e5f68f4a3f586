"""Plot `kspec bench --json` results from several runs into one figure (needs matplotlib).

    python3 scripts/plot_bench.py full.json later.json -o bench.png

A kernel's rows come from the last file that has it, so a later run of a few kernels replaces
their panels and keeps every other kernel's from the earlier run. Prints which run each
kernel's panel came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kspec.codegen import bench  # noqa: E402


def merge(paths: list) -> tuple[list, dict]:
    """The rows to plot, and the file each kernel's rows came from."""
    by_kernel: dict = {}
    source: dict = {}
    for path in paths:
        rows = json.loads(Path(path).read_text())["results"]
        for kernel in {r["kernel"] for r in rows}:
            by_kernel[kernel] = [r for r in rows if r["kernel"] == kernel]
            source[kernel] = str(path)
    return [r for kernel in sorted(by_kernel) for r in by_kernel[kernel]], source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="bench JSON files, earliest first")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = parser.parse_args()
    rows, source = merge(args.runs)
    bench.plot(rows, args.output)
    for kernel in sorted(source):
        print(f"{kernel}: {source[kernel]}")
    print(f"plotted {len(rows)} rows -> {args.output}")


if __name__ == "__main__":
    main()
