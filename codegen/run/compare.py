"""Comparison of a kernel's output with its reference: the metrics verify reports."""

from __future__ import annotations

import numpy as np

from kspec.codegen.run.tasks import Task, result


def _as_f64(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fc" and a.dtype != np.bool_ and a.dtype.kind not in "iu":
        a = a.astype(np.float32)  # bfloat16, float8: numpy sees them as void-like extension types
    return a.astype(np.float64) if a.dtype.kind != "c" else a.astype(np.complex128)


DEVICE_THRESHOLD = 1 << 22  # elements; larger outputs are compared on the device


def compare(out, ref, atol: float, rtol: float, normwise: float | None = None) -> dict:
    """Metrics and a verdict. An element passes when |out - ref| <= atol + rtol * |ref|;
    a NaN or Inf where the reference is finite never passes. With `normwise` (the input kinds
    other than normal, whose data can be ill-conditioned) the elements are not judged one by one:
    the output passes when no element breaks the NaN/Inf rule and rel_err is at most `normwise`."""
    if getattr(out, "size", 0) > DEVICE_THRESHOLD and getattr(out, "shape", None) == getattr(ref, "shape", None):
        return _normwise(_compare_on_device(out, ref, atol, rtol), normwise)
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
    worst = np.unravel_index(int(np.argmax(np.where(within, -1.0, diff + 1.0))), o.shape) if o.ndim else ()
    shown = f"worst at {tuple(int(i) for i in worst)}: got {o[worst].item():.6g}, expected {r[worst].item():.6g}"
    if passed:
        message = ""
    elif bad_nonfinite:
        message = f"{bad_nonfinite} element(s) are NaN/Inf where the reference is finite"
    else:
        message = f"{n - int(np.sum(within))} of {n} elements outside tolerance; {shown}"
    unlike = bad_nonfinite + int(np.sum(~finite_ref & ~same_nonfinite))
    return _normwise(dict(metrics, passed=passed, message=message, nonfinite=unlike, worst=shown), normwise)


def _normwise(verdict: dict, bound: float | None) -> dict:
    """A compare() verdict judged by the NaN/Inf rule and rel_err <= bound instead (see compare)."""
    if bound is None:
        return verdict
    if verdict["nonfinite"]:
        return dict(verdict, passed=False, message=verdict["message"] if "NaN/Inf" in verdict["message"] else
                    f"{verdict['nonfinite']} element(s) are not NaN/Inf as the reference's are")
    if verdict["rel_err"] > bound:
        return dict(verdict, passed=False, message=f"rel_err {verdict['rel_err']:.3g} is above {bound:.3g}; {verdict['worst']}")
    return dict(verdict, passed=True, message="")


def compare_all(named: list, atol: float, rtol: float, normwise: float | None = None) -> dict:
    """compare() over (name, value, reference) triples, the verdict verify reports: the first
    failing one's, else the one with the largest rel_err; its message starts with the name.
    A verdict without metrics (shapes that differ) ends the comparison."""
    worst: dict = {}
    for name, got, want in named:
        verdict = compare(got, want, atol, rtol, normwise)
        if "max_abs_err" not in verdict:
            return dict(verdict, message=f"{name}: {verdict['message']}")
        if not worst or not verdict["passed"] or verdict["rel_err"] > worst["rel_err"]:
            worst = dict(verdict, message=f"{name}: {verdict['message']}" if verdict["message"] else "")
        if not verdict["passed"]:
            break
    return worst


def _compare_on_device(out, ref, atol: float, rtol: float) -> dict:
    """compare() for big arrays, in float32 on the arrays' device: same rule, same metrics."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def metrics(o, r):
        o, r = o.astype(jnp.float32), r.astype(jnp.float32)
        finite_ref, finite_out = jnp.isfinite(r), jnp.isfinite(o)
        both = finite_ref & finite_out
        diff = jnp.where(both, jnp.abs(o - r), 0.0)
        within = jnp.where(both, diff <= atol + rtol * jnp.abs(r), False)
        within |= ~finite_ref & ((jnp.isnan(o) & jnp.isnan(r)) | (o == r))
        denom = jnp.maximum(jnp.abs(r), atol if atol > 0 else jnp.finfo(jnp.float32).tiny)
        worst = jnp.argmax(jnp.where(within, -1.0, diff + 1.0))
        unlike = jnp.sum(finite_ref & ~finite_out) + jnp.sum(~finite_ref & ~((jnp.isnan(o) & jnp.isnan(r)) | (o == r)))
        return (jnp.max(diff), jnp.max(jnp.where(both, diff / denom, 0.0)), jnp.linalg.norm(diff),
                jnp.linalg.norm(jnp.where(finite_ref, r, 0.0)), jnp.sum(within), jnp.sum(finite_ref & ~finite_out),
                worst, o.ravel()[worst], r.ravel()[worst], unlike)

    max_abs, max_rel, err_norm, ref_norm, n_within, bad, worst, got, want, unlike = (
        v.item() for v in metrics(out, ref)
    )
    n = int(out.size)
    passed = n_within == n
    index = tuple(int(i) for i in np.unravel_index(worst, out.shape))
    shown = f"worst at {index}: got {got:.6g}, expected {want:.6g}"
    if passed:
        message = ""
    elif bad:
        message = f"{bad} element(s) are NaN/Inf where the reference is finite"
    else:
        message = f"{n - n_within} of {n} elements outside tolerance; {shown}"
    return {
        "nonfinite": int(unlike),
        "worst": shown,
        "max_abs_err": float(max_abs),
        "max_rel_err": float(max_rel),
        "rel_err": float(err_norm / ref_norm) if ref_norm > 0 else float(err_norm),
        "frac_within_tol": n_within / n,
        "passed": bool(passed),
        "message": message,
    }


def verdict_result(task: Task, verdict: dict, seconds: float, tol: dict) -> dict:
    """The result row of a compare_all verdict."""
    if "max_abs_err" not in verdict:
        return result(task, "fail", verdict["message"], seconds=seconds, tolerance=tol)
    metrics = {k: verdict[k] for k in ("max_abs_err", "max_rel_err", "rel_err", "frac_within_tol")}
    return result(task, "pass" if verdict["passed"] else "fail", verdict["message"], seconds=seconds, tolerance=tol,
                  **metrics)
