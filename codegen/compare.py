"""Comparison of a kernel's output with its reference: the metrics verify reports."""

from __future__ import annotations

import numpy as np


def _as_f64(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fc" and a.dtype != np.bool_ and a.dtype.kind not in "iu":
        a = a.astype(np.float32)  # bfloat16, float8: numpy sees them as void-like extension types
    return a.astype(np.float64) if a.dtype.kind != "c" else a.astype(np.complex128)


def compare(out, ref, atol: float, rtol: float) -> dict:
    """Metrics and a verdict. An element passes when |out - ref| <= atol + rtol * |ref|;
    a NaN or Inf where the reference is finite never passes."""
    o, r = _as_f64(out), _as_f64(ref)
    if o.shape != r.shape:
        return {"passed": False, "message": f"shape {o.shape} differs from the reference's {r.shape}"}
    finite_ref = np.isfinite(r)
    finite_out = np.isfinite(o)
    both = finite_ref & finite_out
    diff = np.where(both, np.abs(o - r), 0.0)
    within = np.where(both, diff <= atol + rtol * np.abs(r), False)
    # Where the reference itself is not finite, the kernel must agree exactly (NaN with NaN).
    same_nonfinite = ~finite_ref & ((np.isnan(o) & np.isnan(r)) | (o == r))
    within |= same_nonfinite
    bad_nonfinite = int(np.sum(finite_ref & ~finite_out))
    denom = np.maximum(np.abs(r), atol if atol > 0 else np.finfo(np.float64).tiny)
    rel = np.where(both, diff / denom, 0.0)
    ref_norm = float(np.linalg.norm(np.where(finite_ref, r, 0.0)))
    err_norm = float(np.linalg.norm(diff))
    n = max(o.size, 1)
    metrics = {
        "max_abs_err": float(diff.max()) if o.size else 0.0,
        "max_rel_err": float(rel.max()) if o.size else 0.0,
        "rel_err": err_norm / ref_norm if ref_norm > 0 else err_norm,
        "frac_within_tol": float(np.sum(within)) / n,
    }
    passed = bool(within.all())
    if passed:
        message = ""
    elif bad_nonfinite:
        message = f"{bad_nonfinite} element(s) are NaN/Inf where the reference is finite"
    else:
        worst = np.unravel_index(int(np.argmax(np.where(within, -1.0, diff + 1.0))), o.shape) if o.ndim else ()
        message = (
            f"{n - int(np.sum(within))} of {n} elements outside tolerance; "
            f"worst at {tuple(int(i) for i in worst)}: got {o[worst].item():.6g}, expected {r[worst].item():.6g}"
        )
    return dict(metrics, passed=passed, message=message)
