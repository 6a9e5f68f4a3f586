"""`kspec bench`: plan bench tasks and write the reports (markdown, JSON, PNG plot).

Timing itself happens in the worker (codegen/run/bench.py); this side only plans
and formats, so it does not import jax.
"""

from __future__ import annotations

from kspec.codegen import project as pipeline
from kspec.codegen.backends import BACKENDS
from kspec.codegen.run import timing
from kspec.codegen.run.tasks import BenchTask, CeilingsTask, result
from kspec.codegen.verify import _dtype_reason, _skip_reason, matrix


def plan(compiled: list, *, backends: list, cases: list, seed: int, samples: int, platform: str,
         ceilings: tuple = (), suite: str = "bench", grad: bool = False) -> tuple:
    """(tasks, skipped) for every spec's bench cases (its verify cases if it has none), or with
    `suite` "sweep" every shape of its families. `grad`: the tasks time the forward and backward
    pass through the spec's `vjp:` against the reference's autodiff (specs without one are skipped)."""
    tasks, skipped = [], []
    wanted = suite
    for c, name, i, case, assign, label in matrix(compiled, backends=backends, cases=cases, suite=wanted):
        suite = "sweep" if wanted == "sweep" else "bench" if c.spec.bench else "cases"
        task = BenchTask(
            spec_path=str(c.path), kernel=c.spec.name, backend=name, case=case.name, case_index=i,
            dtypes=tuple(assign.items()), dtype_label=label, seed=seed,
            out_root=str(pipeline.out_root_for(c.path)), suite=suite, samples=samples, ceilings=ceilings,
            grad=grad,
        )
        why = _skip_reason(name, platform, False) or _dtype_reason(c.spec.variants[name], assign, None if wanted == "sweep" else case)
        if BACKENDS[name].simulated_on(platform):
            why = "TPU interpret mode is a simulator: timing it means nothing"
        if grad and c.spec.vjp is None and not why:
            why = "no `vjp:`: the spec declares no backward pass to time"
        if why:
            skipped.append(result(task, "skip", why))
        else:
            tasks.append(task)
    return tasks, skipped


def ceilings_task() -> CeilingsTask:
    """The task that measures copy bandwidth and bf16 matmul throughput (`--measure-ceilings`)."""
    return CeilingsTask()


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
        *([("- timed: the forward and backward pass, jax.vjp through the spec's `vjp:` kernels, against "
            "XLA's autodiff of the reference and of each competitor (no roofline: the cost estimate "
            "counts the forward pass)")] if meta.get("grad") else []),
        "",
        ("Each figure is the median per-call time over the samples (10th-90th percentile in brackets), "
        "the kernel and its XLA reference sampled in alternation in one process after a warm-up and a "
        "correctness check against the reference, inputs rotated across up to 8 copies (together larger "
        "than L2 where memory allows; `input_copies` in the JSON). Where one call of the fastest function "
        f"of a row takes under {timing.SHORT_S * 1e3:g} ms, every function of the row is timed up to "
        f"{timing.MAX_CALLS_PER_EXECUTABLE} calls to one executable, each on its own input set, as a model's "
        "jit runs it (`calls_per_executable` in the JSON): one executable per call would time the host's "
        "dispatch, not the device. Each round samples every function "
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


def _panels(rows: list) -> tuple:
    """(pyplot, figure, [(axes, kernel)]): one panel per kernel of `rows`, PLOT_COLUMNS to a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = sorted({r["kernel"] for r in rows})
    cols = min(PLOT_COLUMNS, max(len(kernels), 1))
    grid_rows = max(-(-len(kernels) // cols), 1)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(5 * cols, 4 * grid_rows), squeeze=False)
    for ax in axes.flat[len(kernels):]:
        ax.set_visible(False)
    return plt, fig, list(zip(axes.flat, kernels))


def plot(rows: list, path: str) -> None:
    """Throughput against problem size, one panel per kernel (PLOT_COLUMNS to a row), one
    line per backend, XLA dashed; memory-bound kernels in GB/s with the copy timed alongside them dotted."""
    done = [r for r in rows if r.get("ms") is not None]  # timed, including any below its min_speedup
    plt, fig, panels = _panels(done)
    for ax, kernel in panels:
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


# -- sweeps (`kspec bench --sweep`): a family of shapes, summed up -------------------------------


def _geomean(values: list) -> float | None:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def sweep_summary(results: list) -> list:
    """Per kernel x backend x dtype over a sweep's results: how many shapes, how many auto ran on the
    reference instead (`fallbacks`, counted at 1.0x), how many failed or crashed (`errors`), the
    geomean and the worst speedup over XLA (and the shape of the worst), the same over each
    competitor, and the slowest first compile. Shapes skipped for want of a device are left out."""
    groups: dict = {}
    for r in results:
        counted = r["status"] != "skip" or r.get("fallback")
        if not counted:
            continue
        g = groups.setdefault((r["kernel"], r["backend"], r["dtype"]), {
            "shapes": 0, "fallbacks": 0, "errors": 0, "speedups": [], "competitors": {}, "compile_s": []})
        g["shapes"] += 1
        if r.get("ms") is not None and r.get("fallback"):  # a gradient XLA differentiates: XLA against itself
            g["fallbacks"] += 1
            g["speedups"].append((1.0, r["case"]))
            g["compile_s"].append(r.get("compile_s") or 0.0)
        elif r.get("ms") is not None:
            g["speedups"].append((r["speedup"], r["case"]))
            g["compile_s"].append(r.get("compile_s") or 0.0)
            for name, c in (r.get("competitors") or {}).items():
                if c["status"] == "pass":
                    g["competitors"].setdefault(name, []).append((c["speedup"], r["case"]))
        elif r.get("fallback"):
            g["fallbacks"] += 1
            g["speedups"].append((1.0, r["case"]))
        else:
            g["errors"] += 1
    out = []
    for (kernel, backend, dtype), g in sorted(groups.items()):
        worst = min(g["speedups"], default=None)
        out.append({
            "kernel": kernel, "backend": backend, "dtype": dtype, "shapes": g["shapes"],
            "fallbacks": g["fallbacks"], "errors": g["errors"],
            "geomean": _geomean([s for s, _ in g["speedups"]]),
            "worst": worst[0] if worst else None, "worst_case": worst[1] if worst else None,
            "competitors": {
                name: {"geomean": _geomean([s for s, _ in v]), "worst": min(v)[0], "worst_case": min(v)[1],
                       "shapes": len(v)}
                for name, v in g["competitors"].items()
            },
            "compile_s_max": max(g["compile_s"], default=None),
        })
    return out


SWEEP_COLUMNS = ("kernel", "backend", "dtype", "shapes", "auto on the reference", "errors",
                 "speedup over XLA: geomean", "worst (shape)", "over competitors: geomean / worst", "slowest compile s")


def sweep_markdown(summary: list) -> str:
    lines = [
        "## Sweep",
        "",
        ("Each shape of the spec's families, timed as above. Where backend=\"auto\" would pass the backend over "
         "(its _dispatch.py rules it out at that shape, or tuning measured it slower there), the call runs the reference: "
         "counted at 1.0x; for a gradient, where XLA differentiates the reference, timed but counted so too. `errors`: "
         "shapes that failed or crashed."),
        "",
        "| " + " | ".join(SWEEP_COLUMNS) + " |",
        "|" + "---|" * len(SWEEP_COLUMNS),
    ]
    for s in summary:
        comps = "; ".join(f"{n} {c['geomean']:.3f}x / {c['worst']:.3f}x ({c['worst_case']})"
                          for n, c in s["competitors"].items()) or "-"
        lines.append("| " + " | ".join((
            s["kernel"], s["backend"], s["dtype"], str(s["shapes"]), str(s["fallbacks"]), str(s["errors"]),
            _f(s["geomean"]) + ("x" if s["geomean"] else ""),
            (f"{s['worst']:.3f}x ({s['worst_case']})" if s["worst"] is not None else "-"),
            comps, _f(s["compile_s_max"], ".1f"))) + " |")
    return "\n".join(lines) + "\n"


def _size(row: dict):
    """A row's problem size: the bytes its cost estimate counts, else (a gradient) its inputs'."""
    return row.get("bytes") or row.get("input_bytes")


def plot_sweep(rows: list, path: str) -> bool:
    """Speedup over XLA against problem size, one panel per kernel, one line per backend x dtype
    (and dotted, over each competitor); where auto runs the reference, a cross at 1.0. Rows of
    no known size (a gradient's, from a kspec that did not record its inputs' bytes) are left out;
    False (and no file) when none is left."""
    done = [r for r in rows if (r.get("ms") is not None or r.get("fallback")) and _size(r)]
    if not done:
        return False
    plt, fig, panels = _panels(done)
    for ax, kernel in panels:
        mine = [r for r in done if r["kernel"] == kernel]
        for backend, dtype in sorted({(r["backend"], r["dtype"]) for r in mine}):
            series = [r for r in mine if r["backend"] == backend and r["dtype"] == dtype]
            timed = sorted((_size(r), r["speedup"]) for r in series if r.get("ms") is not None)
            (line,) = ax.plot([b for b, _ in timed], [s for _, s in timed], "o-", label=f"{backend} {dtype}")
            names = sorted({n for r in series for n, c in (r.get("competitors") or {}).items() if c["status"] == "pass"})
            for name in names:
                pts = sorted((_size(r), r["competitors"][name]["speedup"]) for r in series
                             if r.get("ms") is not None and r["competitors"].get(name, {}).get("status") == "pass")
                ax.plot([b for b, _ in pts], [s for _, s in pts], ":", marker=".", color=line.get_color(),
                        label=f"over {name}")
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(kernel)
        ax.set_xlabel("bytes per call")
        ax.set_ylabel("speedup (x)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
