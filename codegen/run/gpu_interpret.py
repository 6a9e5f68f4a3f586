"""Mosaic GPU bodies off a GPU: jax's Mosaic GPU interpret mode.

jax (0.10.2 and later) can run a Mosaic GPU kernel (`plgpu.kernel`) on the CPU: it simulates the GPU's global and
shared memory, the CTAs of the grid and their warpgroups, barriers and TMA copies, and it raises where a load,
a store or a copy reaches outside its buffer. `kspec verify --backend mosaic_gpu` on a machine without a GPU runs
the generated Mosaic GPU functions under it (worker.py). The generated code itself stays as it is: the mode is
switched on around the call, by a context jax reads while it traces the kernel.

The mode lives in jax's private modules (`jax._src.pallas.mosaic_gpu.interpret`); where a jax has none,
`available()` is False and verify skips those tasks, saying why.
"""

from __future__ import annotations

import contextlib
import functools
import re

MISSING = "this jax has no Mosaic GPU interpret mode (jax._src.pallas.mosaic_gpu.interpret)"
PIPELINED = ("Mosaic GPU interpret mode runs the mesh kernels (kind: mesh) here: a pipelined kernel's partial blocks, "
             "which TMA clips on a GPU, raise there as out-of-bounds reads")


def unrun(spec) -> str | None:
    """Why Mosaic GPU interpret mode does not run this spec's Mosaic GPU body here, or None. It runs the mesh kernels:
    their bodies make their own copies (a copy past the array is the body's fault). The grid specs are rendered with
    plgpu.emit_pipeline, whose ragged last blocks TMA clips on a GPU and the simulator does not."""
    from kspec.codegen.spec.model import SpecKind

    return None if spec.kind == SpecKind.MESH else PIPELINED


def causes(e: BaseException | None):
    """`e` and the exceptions it was raised from or during, innermost last, each once."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def unsupported(e: BaseException) -> str | None:
    """A skip's reason where jax's simulator lacks a primitive the body uses (NotImplementedError), else None."""
    for x in causes(e):
        if isinstance(x, NotImplementedError):
            what = str(x).strip().splitlines()[0] if str(x).strip() else type(x).__name__
            return f"Mosaic GPU interpret mode of this jax does not run this body: {what}"
    return None


def _modules():
    from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, params

    return params, gpu_callbacks


def available() -> bool:
    try:
        _modules()
    except ImportError:
        return False
    return True


def reset() -> None:
    """Clear the simulator's state: after a kernel raised, jax leaves it for inspection, and the next kernel
    would find it."""
    with contextlib.suppress(Exception):
        _modules()[1].reset_gpu_interpret_mode_state()


def interpreted(fn):
    """`fn` (a generated Mosaic GPU function, or a function that calls them) traced in Mosaic GPU interpret mode:
    reads outside a buffer raise, uninitialised shared memory reads NaN."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        params, _ = _modules()
        settings = params.InterpretGPUParams(out_of_bounds_reads="raise", uninitialized_memory="nan")
        with params.force_gpu_interpret_mode(settings):
            return fn(*args, **kwargs)

    return run


# jax's own words for an access outside a buffer (gpu_callbacks.py), and the slices it prints
_OUTSIDE = re.compile(r"Out-of-bounds (read|swap|masked swap|block index \S+) of [^\n]*?: (?:reading|swapping) "
                      r"\[(.*?)\] but (?:buffer|input) has shape \(([^)]*)\)")
_SLICE = re.compile(r"slice\((-?\d+|None), (-?\d+|None), (?:-?\d+|None)\)")


def out_of_bounds(e: BaseException) -> str | None:
    """What an exception of a kernel run in Mosaic GPU interpret mode says of an access outside a buffer, in
    kspec's words (`reads [600:601, 0:256] of a (600, 256) buffer`), or None if it is of something else."""
    for x in causes(e):
        found = _OUTSIDE.search(str(x))
        if found:
            kind, where, shape = found.groups()
            spans = ", ".join(f"{a}:{b}" for a, b in _SLICE.findall(where)) or where
            verb = "reads" if kind == "read" or kind.startswith("block") else "writes"
            dims = ", ".join(d.strip() for d in shape.split(",") if d.strip())
            return f"{verb} [{spans}] of a ({dims}) buffer"
    return None


NOTE = ("(Mosaic GPU interpret mode raises on it; compiled, a TMA copy that promises to stay in bounds, or a load, "
        "reads or writes whatever lies past the array)")
