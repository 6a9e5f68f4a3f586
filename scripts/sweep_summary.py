"""Sum up `kspec bench --sweep --json` results of several runs as one sweep: kspec's sweep table
(geomean and worst speedup per kernel x backend x dtype) over their rows together, and its plot.

    python3 scripts/sweep_summary.py gpu0.json gpu1.json [--plot sweep.png] [--markdown sweep.md]

For a family split between runs, one per GPU of a host, say (`--case` names each run's shapes,
`CUDA_VISIBLE_DEVICES` its GPU). A shape measured in several files counts once, as the last file has
it. The runs must come from one device kind, jax version and seed: the script says where not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kspec.codegen import bench  # noqa: E402

SAME = ("device", "jax_version", "seed", "samples", "grad")


def merge(paths: list) -> tuple[list, dict]:
    """The rows of every file (one per kernel x backend x case x dtype, the last file's), and the
    metadata they share; raises ValueError where the files' metadata differ."""
    rows: dict = {}
    meta: dict = {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        for key in SAME:
            if key in meta and report.get(key) != meta[key]:
                raise ValueError(f"{path}: {key} {report.get(key)!r} differs from the earlier files' {meta[key]!r}")
            meta[key] = report.get(key)
        meta.setdefault("dates", set()).add(report.get("date"))
        for r in report["results"]:
            rows[(r["kernel"], r["backend"], r["case"], r["dtype"])] = r
    return list(rows.values()), meta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="kspec bench --sweep --json files")
    parser.add_argument("--plot", help="the PNG to write (needs matplotlib)")
    parser.add_argument("--markdown", help="the markdown file to write (default: standard output only)")
    args = parser.parse_args()
    try:
        rows, meta = merge(args.runs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dates = ", ".join(sorted(d for d in meta.pop("dates") if d))
    head = ", ".join(f"{k} {meta[k]}" for k in SAME if meta.get(k) is not None)
    text = f"{len(rows)} rows from {len(args.runs)} runs ({head}; {dates})\n\n"
    text += bench.sweep_markdown(bench.sweep_summary(rows))
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.plot and not bench.plot_sweep(rows, args.plot):
        print(f"no plot: no row has a size ({args.plot} not written)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
