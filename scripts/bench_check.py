"""How long `kspec check` and `kspec generate --check` take, with and without the check cache.

    python scripts/bench_check.py [--repeat 5] [--specs 100]

Two projects, each timed as a user runs kspec (a fresh process per command, median of --repeat):
- the library (this repository's specs/ and generated/, copied);
- a project of --specs specs (the library's specs under new kernel names, generated), in which
  one spec changes before each timed run.
For each: the cold time (no cache), the warm time (nothing changed) and the time after one spec
changed. Prints a Markdown table; nothing is asserted (the figures depend on the machine).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def kspec(root: Path, *args: str) -> float:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "kspec", *args], cwd=root, capture_output=True, text=True)
    took = time.perf_counter() - start
    if r.returncode not in (0, 1):
        raise SystemExit(f"kspec {' '.join(args)} failed in {root}:\n{r.stdout}{r.stderr}")
    return took


def library(into: Path) -> Path:
    root = into / "library"
    root.mkdir()
    for name in ("specs", "generated", "tuning"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", ".kspec.lock"))
    (root / "kspec.toml").write_text('specs = "specs"\nout = "generated"\npackage = "generated"\ntuning = "tuning"\n')
    kspec(root, "generate")
    return root


def many(into: Path, count: int) -> Path:
    """`count` specs: the library's forward specs without `vjp:`, renamed kernel_0 ... kernel_{count-1}."""
    root = into / "many"
    (root / "specs").mkdir(parents=True)
    sources = [p for p in sorted((REPO / "specs").glob("*.yaml")) if "\nvjp:" not in p.read_text()]
    for i in range(count):
        text = sources[i % len(sources)].read_text()
        text = re.sub(r"(?m)^name: .*$", f"name: kernel_{i}", text, count=1)
        (root / "specs" / f"kernel_{i}.yaml").write_text(text)
    (root / "kspec.toml").write_text('specs = "specs"\nout = "generated"\npackage = "generated"\ntuning = "tuning"\n')
    kspec(root, "generate")
    return root


def timings(root: Path, args: tuple, repeat: int, change: Path) -> tuple:
    cold, warm, changed = [], [], []
    for n in range(repeat):
        shutil.rmtree(root / ".kspec" / "cache", ignore_errors=True)
        cold.append(kspec(root, *args))
        warm.append(kspec(root, *args))
        change.write_text(change.read_text() + f"# edit {n}\n")
        changed.append(kspec(root, *args))
    return tuple(statistics.median(t) for t in (cold, warm, changed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--specs", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        projects = [("the library", library(Path(tmp))), (f"{args.specs} specs", many(Path(tmp), args.specs))]
        print("| project | specs | command | no cache | unchanged | one spec changed |")
        print("|---|---|---|---|---|---|")
        for label, root in projects:
            count = len(list((root / "specs").glob("*.yaml")))
            change = sorted((root / "specs").glob("*.yaml"))[0]
            for command in (("check",), ("generate", "--check")):
                cold, warm, changed = timings(root, command, args.repeat, change)
                print(f"| {label} | {count} | `kspec {' '.join(command)}` | {cold:.2f} s | {warm:.2f} s | {changed:.2f} s |")


if __name__ == "__main__":
    main()
