"""`kspec bench`: plan bench tasks and write the reports (markdown, JSON, PNG plot).

Timing itself happens in the worker (codegen/run/bench.py); this side only plans
and formats, so it does not import jax.
"""

from __future__ import annotations

from kspec.codegen import project as pipeline
from kspec.codegen.run.tasks import Task, result
from kspec.codegen.verify import _dtype_reason, _skip_reason, matrix


def plan(compiled: list, *, backends: list, cases: list, seed: int, samples: int, platform: str,
         ceilings: tuple = ()) -> tuple:
    """(tasks, skipped) for every spec's bench cases (its verify cases if it has none)."""
    tasks, skipped = [], []
    for c, name, i, case, assign, label in matrix(compiled, backends=backends, cases=cases, suite="bench"):
        suite = "bench" if c.spec.bench else "cases"
        task = Task(
            str(c.path), c.spec.name, name, case.name, i, tuple(assign.items()), label, seed,
            "bench", str(pipeline.out_root_for(c.path)), suite=suite, samples=samples, ceilings=ceilings,
        )
        why = _skip_reason(name, platform, False) or _dtype_reason(c.spec.variants[name], assign)
        if name == "mosaic_tpu" and platform != "tpu":
            why = "TPU interpret mode is a simulator: timing it means nothing"
        if why:
            skipped.append(result(task, "skip", why))
        else:
            tasks.append(task)
    return tasks, skipped


def ceilings_task() -> Task:
    return Task("", "ceilings", "", "", 0, (), "", 0, "ceilings", "")


def _f(value, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = ("kernel", "backend", "case", "dtype", "ms (p10-p90)", "XLA ms", "speedup (95% CI)", "vs competitors",
           "TFLOP/s", "GB/s", "% roofline", "XLA % roofline", "% of copy", "compile s", "params")


def _speedup(r: dict) -> str:
    """The median of the per-round ratios, with its 95% interval (reports from before it: the ratio alone),
    and the case's min_speedup when it has one (_floor_mark)."""
    ci = r.get("speedup_ci95")
    text = f"{r['speedup']:.3f}x" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
    return text + _floor_mark(r["speedup"], ci[1] if ci else r["speedup"], r.get("min_speedup"))


def _floor_mark(speedup: float, hi: float, least) -> str:
    """`< min 1.2` when the whole interval is below the floor (the task failed on it), `~ min 1.2` when the
    median is below but the interval reaches it (not failed, not shown to meet it either), `>= min 1.2`
    otherwise; nothing without a floor."""
    if least is None:
        return ""
    return f" {'<' if hi < least else '>=' if speedup >= least else '~'} min {least:g}"


def _competitors(r: dict) -> str:
    """The kernel's speedup over each competitor timed here, `; `-separated (those that do not run on
    this platform left out, those that ran wrong or failed named with their status)."""
    parts = []
    for name, c in (r.get("competitors") or {}).items():
        if c["status"] == "pass":
            lo, hi = c["speedup_ci95"]
            parts.append(f"{name} {c['speedup']:.3f}x ({lo:.3f}-{hi:.3f})"
                         + _floor_mark(c["speedup"], hi, c.get("min_speedup")))
        elif c["status"] != "skip":
            parts.append(f"{name}: {c['status']}")
    return "; ".join(parts) or "-"


def row(r: dict) -> tuple:
    if r.get("ms") is None:  # not timed: the status, and why in the last column
        blank = ("",) * (len(COLUMNS) - 6)  # the figures' columns, between status and the message
        return (r["kernel"], r["backend"], r["case"], r["dtype"], r["status"], *blank,
                r["message"].splitlines()[0][:80] if r["message"] else "")
    return (
        r["kernel"], r["backend"], r["case"], r["dtype"],
        f"{r['ms']:.3f} ({r['ms_p10']:.3f}-{r['ms_p90']:.3f})",
        _f(r["ref_ms"]), _speedup(r), _competitors(r), _f(r["tflops"], ".1f"), _f(r["gbs"], ".0f"),
        _f(r["roofline_pct"], ".0f"), _f(r["ref_roofline_pct"], ".0f"), _f(r["copy_pct"], ".0f"),
        _f(r["compile_s"], ".2f"),
        " ".join(f"{k}={v}" for k, v in sorted(r["params"].items())),
    )


def markdown(rows: list, *, meta: dict) -> str:
    lines = [
        "# kspec bench",
        "",
        f"- device: {meta['device']}",
        f"- jax: {meta['jax_version']}, kspec: {meta['kspec_version']}",
        f"- date: {meta['date']}",
        f"- seed: {meta['seed']}, samples per figure: {meta['samples']}",
        f"- roofline: {meta['roofline']}",
        "",
        ("Each figure is the median per-call time over the samples (10th-90th percentile in brackets), "
        "the kernel and its XLA reference sampled in alternation in one process after a warm-up and a "
        "correctness check against the reference, inputs rotated across up to 8 copies (together larger "
        "than L2 where memory allows; `input_copies` in the JSON). Each round samples every function "
        "once: `speedup` is the median over the rounds of the reference's time over the kernel's, with "
        "a distribution-free 95% confidence interval for that median. A memory-bound kernel (or any "
        "kernel on a device without peaks) has a copy of as many bytes in its rounds too: `% of copy` "
        "is the median over the rounds of the copy's time over the kernel's."),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(str(x) for x in row(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


PLOT_COLUMNS = 4  # panels per row of the plot; a library of two dozen kernels wraps onto rows


def _series(ax, points: list, style: str, marker: str, label: str) -> None:
    """A marker at every (size, figure) point, and the line through the mean figure at each size:
    two cases of one size (8192^3 and 8192 x 4096 -> 16384 do the same FLOPs) would otherwise
    join into a vertical segment."""
    by_size: dict = {}
    for x, y in points:
        by_size.setdefault(x, []).append(y)
    sizes = sorted(by_size)
    (line,) = ax.plot(sizes, [sum(by_size[x]) / len(by_size[x]) for x in sizes], style, label=label)
    ax.plot([x for x, _ in points], [y for _, y in points], linestyle="none", marker=marker, color=line.get_color())


def plot(rows: list, path: str) -> None:
    """Throughput against problem size, one panel per kernel (PLOT_COLUMNS to a row), one
    line per backend, XLA dashed; memory-bound kernels in GB/s with the copy timed alongside them dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.get("ms") is not None]  # timed, including any below its min_speedup
    kernels = sorted({r["kernel"] for r in done})
    cols = min(PLOT_COLUMNS, max(len(kernels), 1))
    grid_rows = max(-(-len(kernels) // cols), 1)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(5 * cols, 4 * grid_rows), squeeze=False)
    for ax in axes.flat[len(kernels):]:
        ax.set_visible(False)
    for ax, kernel in zip(axes.flat, kernels):
        mine = [r for r in done if r["kernel"] == kernel]
        # Memory-bound kernels (by the roofline) in GB/s, against the copy timed in their rounds.
        use_flops = all(r["tflops"] for r in mine) and all(r.get("bound") != "memory" for r in mine)
        key, ref_key, unit = ("tflops", "ref_tflops", "TFLOP/s") if use_flops else ("gbs", "ref_gbs", "GB/s")
        size = "flops" if use_flops else "bytes"
        for backend in sorted({r["backend"] for r in mine}):
            _series(ax, [(r[size], r[key]) for r in mine if r["backend"] == backend], "-", "o", backend)
        refs = {(r[size], r[ref_key]) for r in mine}
        _series(ax, list(refs), "k--", "x", "XLA reference")
        copies = {}  # bytes per call -> the copies' GB/s (one per backend's row)
        for r in ([] if use_flops else mine):
            if r.get("copy_gbs"):
                copies.setdefault(r["bytes"], []).append(r["copy_gbs"])
        if copies:
            sizes = sorted(copies)
            ax.plot(sizes, [sum(copies[b]) / len(copies[b]) for b in sizes], ":", color="0.5", marker=".",
                    label="copy, same rounds")
        ax.set_xscale("log")
        ax.set_title(kernel)
        ax.set_xlabel("FLOPs per call" if use_flops else "bytes per call")
        ax.set_ylabel(unit)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
