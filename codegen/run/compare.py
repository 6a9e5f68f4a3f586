"""Comparison of a kernel's output with its reference: the metrics verify reports."""

from __future__ import annotations

import numpy as np

from kspec.codegen.run.tasks import Result, Status, Task, result


def _as_f64(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fc" and a.dtype != np.bool_ and a.dtype.kind not in "iu":
        a = a.astype(np.float32)  # bfloat16, float8: numpy sees them as void-like extension types
    return a.astype(np.float64) if a.dtype.kind != "c" else a.astype(np.complex128)


DEVICE_THRESHOLD = 1 << 22  # elements; larger outputs are compared on the device
# The scale of a reference whose finite values are all zero (float32's smallest normal number):
# such a reference is matched only by zeros, within atol x SCALE_FLOOR.
SCALE_FLOOR = float(np.finfo(np.float32).tiny)


def scale(ref) -> float:
    """An output's scale: the root mean square of the reference's finite values, at least
    SCALE_FLOOR. The tolerance's atol is a fraction of it (see compare)."""
    r = _as_f64(ref)
    finite = np.isfinite(r)
    count = int(np.sum(finite))
    rms = float(np.linalg.norm(np.where(finite, r, 0.0))) / np.sqrt(count) if count else 0.0
    return max(rms, SCALE_FLOOR)


def row_scales(ref) -> np.ndarray:
    """Each element's scale under a tolerance's `scale: rows`: the larger of the RMS of the finite
    values of its row (the last axis) and the output's scale. A row whose values are far above the
    output's RMS (the first query rows of causal attention, which average a handful of keys) keeps
    its errors in proportion to its own size; no row is held tighter than under the output's scale."""
    r = _as_f64(ref)
    whole = scale(r)
    if r.ndim == 0:
        return np.asarray(whole)
    finite = np.isfinite(r)
    count = np.maximum(np.sum(finite, axis=-1, keepdims=True), 1)
    rms = np.sqrt(np.sum(np.where(finite, np.abs(r) ** 2, 0.0), axis=-1, keepdims=True) / count)
    return np.maximum(rms, whole)


def norm_bound(atol: float, rtol: float, rel_err: float | None = None) -> float:
    """The bound on an output's rel_err: the tolerance's `rel_err` (codegen/spec/dtypes.py); without
    one, the larger of atol and rtol (no more than the elements' own bounds imply)."""
    return max(atol, rtol) if rel_err is None else rel_err


def compare(out, ref, atol: float, rtol: float, normwise: float | None = None, *, rel_err: float | None = None,
            rows: bool = False) -> dict:
    """Metrics and a verdict. With s the output's scale (`scale`: the RMS of the reference's
    finite values; with `rows`, each element's `row_scales`), an element passes when
    |out - ref| <= atol * s + rtol * |ref|, and the output
    passes when every element passes and its rel_err = ||out - ref|| / ||ref|| is at most `rel_err`
    (`norm_bound`: without it, max(atol, rtol)); a NaN or Inf where the reference is finite never
    passes. With `normwise` (the input kinds other than normal, whose data can be ill-conditioned)
    the elements are not judged one by one: the output passes when no element breaks the NaN/Inf
    rule and rel_err is at most `normwise`.

    Besides the metrics verify reports, the verdict holds how close the output came to the rule's
    bounds (scripts/calibrate_tolerances.py reports them): `worst_ratio`, the largest
    |out - ref| / (atol * s + rtol * |ref|) over the elements finite in both, and `norm_ratio`,
    rel_err over its bound; an output with no NaN/Inf trouble passes when both are at most 1."""
    bound = norm_bound(atol, rtol, rel_err)
    if getattr(out, "size", 0) > DEVICE_THRESHOLD and getattr(out, "shape", None) == getattr(ref, "shape", None):
        return _normwise(_compare_on_device(out, ref, atol, rtol, bound, rows), normwise)
    o, r = _as_f64(out), _as_f64(ref)
    if o.shape != r.shape:
        return {"passed": False, "message": f"shape {o.shape} differs from the reference's {r.shape}"}
    finite_ref = np.isfinite(r)
    finite_out = np.isfinite(o)
    both = finite_ref & finite_out
    floor = atol * (row_scales(r) if rows else scale(r))
    with np.errstate(invalid="ignore"):  # inf - inf where neither is finite: not compared
        diff = np.where(both, np.abs(o - r), 0.0)
    within = np.where(both, diff <= floor + rtol * np.abs(r), False)
    # Where the reference itself is not finite, the kernel must agree exactly (NaN with NaN).
    same_nonfinite = ~finite_ref & ((np.isnan(o) & np.isnan(r)) | (o == r))
    within |= same_nonfinite
    bad_nonfinite = int(np.sum(finite_ref & ~finite_out))
    denom = np.maximum(np.abs(r), np.where(floor > 0, floor, np.finfo(np.float64).tiny))
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
    bounds = np.where(both, floor + rtol * np.abs(r), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(diff > 0, diff / bounds, 0.0)  # diff > 0 with a bound of 0: inf
    metrics["worst_ratio"] = float(ratios.max()) if o.size else 0.0
    metrics["norm_ratio"] = _ratio(metrics["rel_err"], bound)
    outside = o.size - int(np.sum(within))
    if o.size:
        # The worst element: the largest error among those outside the tolerance, else the largest.
        key = np.where(within, -1.0, diff + 1.0) if outside else diff
        worst = np.unravel_index(int(np.argmax(key)), o.shape) if o.ndim else ()
        shown = f"worst at {tuple(int(i) for i in worst)}: got {o[worst].item():.6g}, expected {r[worst].item():.6g}"
    else:
        shown = "no elements"
    unlike = bad_nonfinite + int(np.sum(~finite_ref & ~same_nonfinite))
    verdict = dict(metrics, nonfinite=unlike, worst=shown)
    return _normwise(_judged(verdict, outside, o.size, bad_nonfinite, bound), normwise)


def _ratio(value: float, bound: float) -> float:
    """value / bound, with 0 / 0 = 0 and x / 0 = inf."""
    return value / bound if bound > 0 else (float("inf") if value > 0 else 0.0)


def _judged(verdict: dict, outside: int, n: int, bad_nonfinite: int, bound: float) -> dict:
    """The verdict of the rule in compare, from its counts and metrics, with its message."""
    if bad_nonfinite:
        message = f"{bad_nonfinite} element(s) are NaN/Inf where the reference is finite"
    elif outside:
        message = f"{outside} of {n} elements outside tolerance; {verdict['worst']}"
    elif verdict["rel_err"] > bound:
        message = f"rel_err {verdict['rel_err']:.3g} is above {bound:.3g}; {verdict['worst']}"
    else:
        message = ""
    return dict(verdict, passed=not message, message=message)


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


def compare_all(named: list, atol: float, rtol: float, normwise: float | None = None, *,
                rel_err: float | None = None, rows: bool = False) -> dict:
    """compare() over (name, value, reference) triples, the verdict verify reports: the first
    failing one's, else the one with the largest rel_err; its message starts with the name.
    A verdict without metrics (shapes that differ) ends the comparison. An entry may carry a fourth
    element, a tolerance table ({"atol", "rtol", "rel_err", "scale"}) of its own (a gradient's bounds)."""
    worst: dict = {}
    for name, got, want, *own in named:
        bounds = _bounds(own[0]) if own else (atol, rtol, rel_err, rows)
        verdict = compare(got, want, bounds[0], bounds[1], normwise, rel_err=bounds[2], rows=bounds[3])
        if "max_abs_err" not in verdict:
            return dict(verdict, message=f"{name}: {verdict['message']}")
        if not worst or not verdict["passed"] or verdict["rel_err"] > worst["rel_err"]:
            worst = dict(verdict, message=f"{name}: {verdict['message']}" if verdict["message"] else "")
        if not verdict["passed"]:
            break
    return worst


def compare_within(named: list, tol: dict, normwise: float | None = None) -> dict:
    """compare_all under a tolerance table ({"atol", "rtol", "rel_err", "scale"}, dtypes.tolerance's)."""
    atol, rtol, rel_err, rows = _bounds(tol)
    return compare_all(named, atol, rtol, normwise, rel_err=rel_err, rows=rows)


def _bounds(tol: dict) -> tuple:
    """(atol, rtol, rel_err, rows) of a tolerance table; rows: its `scale` is "rows"."""
    return tol["atol"], tol["rtol"], tol.get("rel_err"), tol.get("scale") == "rows"


def _compare_on_device(out, ref, atol: float, rtol: float, bound: float, rows: bool = False) -> dict:
    """compare() for big arrays, in float32 on the arrays' device: same rule, same metrics."""
    import jax
    import jax.numpy as jnp

    # Counts are summed as uint32 and the finite elements as float32: an int32 count, jax's default,
    # wraps at 2**31 elements, and a Python int of the size is no int32 argument either.
    @jax.jit
    def metrics(o, r):
        o, r = o.astype(jnp.float32), r.astype(jnp.float32)
        finite_ref, finite_out = jnp.isfinite(r), jnp.isfinite(o)
        both = finite_ref & finite_out
        ref_norm = jnp.linalg.norm(jnp.where(finite_ref, r, 0.0))
        rms = ref_norm / jnp.sqrt(jnp.maximum(jnp.sum(finite_ref, dtype=jnp.float32), 1.0))
        floor = atol * jnp.maximum(rms, SCALE_FLOOR)
        if rows and r.ndim:  # each row's RMS over the last axis, where it is above the output's
            count = jnp.maximum(jnp.sum(finite_ref, axis=-1, keepdims=True, dtype=jnp.float32), 1.0)
            row = jnp.sqrt(jnp.sum(jnp.where(finite_ref, r * r, 0.0), axis=-1, keepdims=True) / count)
            floor = jnp.maximum(floor, atol * row)
        diff = jnp.where(both, jnp.abs(o - r), 0.0)
        within = jnp.where(both, diff <= floor + rtol * jnp.abs(r), False)
        within |= ~finite_ref & ((jnp.isnan(o) & jnp.isnan(r)) | (o == r))
        denom = jnp.maximum(jnp.abs(r), jnp.where(floor > 0, floor, jnp.finfo(jnp.float32).tiny))
        n_outside = jnp.sum(~within, dtype=jnp.uint32)
        worst = jnp.where(n_outside == 0, jnp.argmax(diff), jnp.argmax(jnp.where(within, -1.0, diff + 1.0)))
        unlike = (jnp.sum(finite_ref & ~finite_out, dtype=jnp.uint32)
                  + jnp.sum(~finite_ref & ~((jnp.isnan(o) & jnp.isnan(r)) | (o == r)), dtype=jnp.uint32))
        bounds = jnp.where(both, floor + rtol * jnp.abs(r), 1.0)
        ratio = jnp.max(jnp.where(diff > 0, diff / bounds, 0.0))
        return (jnp.max(diff), jnp.max(jnp.where(both, diff / denom, 0.0)), jnp.linalg.norm(diff),
                ref_norm, n_outside, jnp.sum(finite_ref & ~finite_out, dtype=jnp.uint32), worst, o.ravel()[worst], r.ravel()[worst],
                unlike, ratio)

    max_abs, max_rel, err_norm, ref_norm, n_outside, bad, worst, got, want, unlike, ratio = (
        v.item() for v in metrics(out, ref)
    )
    n = int(out.size)
    n_within = n - int(n_outside)
    index = tuple(int(i) for i in np.unravel_index(worst, out.shape))
    rel_err = float(err_norm / ref_norm) if ref_norm > 0 else float(err_norm)
    verdict = {
        "nonfinite": int(unlike),
        "worst": f"worst at {index}: got {got:.6g}, expected {want:.6g}",
        "max_abs_err": float(max_abs),
        "max_rel_err": float(max_rel),
        "rel_err": rel_err,
        "frac_within_tol": n_within / n,
        "worst_ratio": float(ratio),
        "norm_ratio": _ratio(rel_err, bound),
    }
    return _judged(verdict, n - int(n_within), n, int(bad), bound)


def verdict_result(task: Task, verdict: dict, seconds: float, tol: dict) -> Result:
    """The result of a compare_all verdict."""
    if "max_abs_err" not in verdict:
        return result(task, Status.FAIL, verdict["message"], seconds=seconds, tolerance=tol)
    metrics = {k: verdict[k] for k in ("max_abs_err", "max_rel_err", "rel_err", "frac_within_tol")}
    return result(task, Status.PASS if verdict["passed"] else Status.FAIL, verdict["message"], seconds=seconds,
                  tolerance=tol, **metrics)
