"""Autodiff (`vjp:`): generated jax.custom_vjp functions against jax.vjp of the reference.

In process: the shipped layer_norm and softmax, on interpret and in TPU interpret mode,
under jax.jit, jax.vmap and jax.grad. Through the CLI, in throwaway projects: verify's grad
rows, a planted wrong backward kernel, a spec that uses every part of the section (two
outputs, an output saved as a residual, an integer input, a `no_grad` input, partial sums),
second derivatives through a backward kernel with a vjp of its own, and a cycle.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO, invoke_kspec
from jax.experimental.pallas import tpu as pltpu

PLANTED = Path(__file__).resolve().parent / "planted"
INTERPRETERS = {"interpret": None, "mosaic_tpu": pltpu.InterpretParams()}


def _normal(key, *shapes):
    return [jax.random.normal(k, s, jnp.float32) for k, s in zip(jax.random.split(jax.random.key(key), len(shapes)), shapes)]


def _assert_grads(got, want, rtol=1e-4, atol=1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", sorted(INTERPRETERS))
@pytest.mark.parametrize("rows", [64, 37])
def test_layer_norm_gradients_match_the_reference(backend, rows):
    from generated.layer_norm import _vjp, layer_norm_reference

    x, gamma, beta, ct = _normal(rows, (rows, 256), (1, 256), (1, 256), (rows, 256))
    y, pullback = jax.vjp(_vjp.differentiable(backend, (), INTERPRETERS[backend]), x, gamma, beta)
    want_y, want_pullback = jax.vjp(layer_norm_reference, x, gamma, beta)
    _assert_grads([y], [want_y])
    _assert_grads(pullback(ct), want_pullback(ct))


@pytest.mark.parametrize("backend", sorted(INTERPRETERS))
def test_softmax_gradient_from_its_saved_output(backend):
    from generated.softmax import _vjp, softmax_reference

    x, ct = _normal(3, (40, 256), (40, 256))
    _, pullback = jax.vjp(_vjp.differentiable(backend, (("bm", 8),), INTERPRETERS[backend]), x)
    _, want_pullback = jax.vjp(softmax_reference, x)
    _assert_grads(pullback(ct), want_pullback(ct), rtol=1e-5, atol=1e-6)


def test_grad_through_the_package_function_under_jit_and_vmap():
    from generated.layer_norm import layer_norm, layer_norm_reference

    x, gamma, beta, w = _normal(7, (16, 128), (1, 128), (1, 128), (16, 128))

    def loss(fn):
        return lambda x, gamma, beta: jnp.sum(fn(x, gamma, beta) * w)

    want = jax.grad(loss(layer_norm_reference), argnums=(0, 1, 2))(x, gamma, beta)
    def kernel(x, gamma, beta):
        return layer_norm(x, gamma, beta, backend="interpret", bm=8)

    _assert_grads(jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(x, gamma, beta), want)
    batch = jnp.stack([x, 2 * x, -x])
    mapped = jax.vmap(jax.grad(loss(kernel)), in_axes=(0, None, None))(batch, gamma, beta)
    expected = jnp.stack([jax.grad(loss(layer_norm_reference))(b, gamma, beta) for b in batch])
    _assert_grads([mapped], [expected])
    # without differentiation the function is the plain kernel, also under vmap
    _assert_grads([jax.vmap(kernel, in_axes=(0, None, None))(batch, gamma, beta)],
                  [jnp.stack([layer_norm_reference(b, gamma, beta) for b in batch])])


def _results(path: Path) -> list:
    return json.loads(path.read_text())["results"]


def test_verify_shows_forward_and_grad_rows(tmp_path):
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "specs/layer_norm.yaml", "--case", "ragged", "--seed", "4", "--json", report,
                  cwd=REPO, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    rows = {(x["kernel"], x["backend"], x["mode"]): x["status"] for x in _results(report)}
    for backend in ("interpret", "mosaic_tpu"):
        assert rows[("layer_norm", backend, "run")] == rows[("layer_norm", backend, "grad")] == "pass"
        # the backward kernels are verified as the specs they are
        assert rows[("layer_norm_bwd", backend, "run")] == "pass"
    assert rows[("layer_norm", "triton", "grad")] == "skip"
    assert re.search(r"^layer_norm +interpret +grad +ragged +float32 +pass ", r.out, re.MULTILINE)
    r = invoke_kspec("verify", "--lower", "specs/layer_norm.yaml", "--case", "ragged", "--json", report, cwd=REPO,
                  timeout=600)
    assert r.rc == 0, r.both[-3000:]
    lowered = {(x["kernel"], x["backend"]) for x in _results(report) if x["mode"] == "lower-grad"
               and x["status"] == "pass"}
    assert lowered == {("layer_norm", "triton"), ("layer_norm", "mosaic_tpu")}


def _project(tmp_path: Path, specs: dict) -> Path:
    """A throwaway project with specs/<name>.yaml for each entry (text or a path to copy), generated."""
    (tmp_path / "specs").mkdir()
    for name, text in specs.items():
        if isinstance(text, Path):
            shutil.copy(text, tmp_path / "specs" / f"{name}.yaml")
        else:
            (tmp_path / "specs" / f"{name}.yaml").write_text(textwrap.dedent(text))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    return tmp_path


def test_a_wrong_backward_kernel_fails_verify_naming_the_input(tmp_path):
    proj = _project(tmp_path, {n: PLANTED / f"{n}.yaml" for n in ("wrong_grad", "wrong_grad_dx")})
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--seed", "3", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 1, r.both
    rows = _results(report)
    failed = {(x["kernel"], x["backend"], x["mode"]) for x in rows if x["status"] == "fail"}
    assert failed == {("wrong_grad", "interpret", "grad"), ("wrong_grad", "mosaic_tpu", "grad")}
    assert all(x["status"] == "pass" for x in rows if x["mode"] == "run")
    message = next(x["message"] for x in rows if x["status"] == "fail")
    assert re.match(r"grad of x: \d+ of 2048 elements outside tolerance; worst at \(", message), message


BLOCK = '{block_shape: [bm, N], index_map: "i -> (i, 0)"}'
ROW = '{block_shape: [1, N], index_map: "i -> (0, 0)"}'
PARTIAL = '{block_shape: [null, 1, N], index_map: "i -> (i, 0, 0)"}'

# o = x * s + k + t and e = exp(x): two outputs, e saved as a residual, an integer input k,
# t without a gradient, and s's gradient as per-program partial sums.
MIXED = f"""\
    kspec: 1
    name: mixed
    params: {{bm: 8}}
    inputs:
      x: {{shape: [M, N], dtype: float32}}
      s: {{shape: [1, N], dtype: x}}
      k: {{shape: [M, N], dtype: int32}}
      t: {{shape: [M, N], dtype: float32}}
    outputs:
      o: {{shape: [M, N], dtype: x}}
      e: {{shape: [M, N], dtype: x}}
    grid: {{i: "cdiv(M, bm)"}}
    blocks: {{x: {BLOCK}, s: {ROW}, k: {BLOCK}, t: {BLOCK}, o: {BLOCK}, e: {BLOCK}}}
    body: |
      o_ref[...] = x_ref[...] * s_ref[...] + k_ref[...].astype(jnp.float32) + t_ref[...]
      e_ref[...] = jnp.exp(x_ref[...])
    reference: |
      return x * s + k.astype(jnp.float32) + lax.stop_gradient(t), jnp.exp(x)
    cases: [{{M: 20, N: 128}}]
    backends: {{interpret: null, mosaic_tpu: null}}
    vjp:
      residuals: [x, s, e]
      no_grad: [t]
      backward:
        - spec: mixed_bwd.yaml
          inputs: {{x: x, s: s, e: e, go: grad(o), ge: grad(e)}}
          grads: {{dx: x, ds: {{input: s, reduce: sum}}}}
"""
MIXED_BWD = f"""\
    kspec: 1
    name: mixed_bwd
    params: {{bm: 8}}
    inputs:
      x: {{shape: [M, N], dtype: float32}}
      s: {{shape: [1, N], dtype: x}}
      e: {{shape: [M, N], dtype: x}}
      go: {{shape: [M, N], dtype: x}}
      ge: {{shape: [M, N], dtype: x}}
    outputs:
      dx: {{shape: [M, N], dtype: x}}
      ds: {{shape: ["cdiv(M, bm)", 1, N], dtype: float32}}
    grid: {{i: "cdiv(M, bm)"}}
    blocks: {{x: {BLOCK}, s: {ROW}, e: {BLOCK}, go: {BLOCK}, ge: {BLOCK}, dx: {BLOCK}, ds: {PARTIAL}}}
    body: |
      dx_ref[...] = go_ref[...] * s_ref[...] + ge_ref[...] * e_ref[...]
      valid = i * bm + lax.broadcasted_iota(jnp.int32, (bm, 1), 0) < M
      ds_ref[...] = jnp.sum(jnp.where(valid, go_ref[...] * x_ref[...], 0.0), axis=0, keepdims=True)
    reference: |
      blocks = (M + bm - 1) // bm
      partial = jnp.pad(go * x, ((0, blocks * bm - M), (0, 0))).reshape(blocks, bm, N)
      return go * s + ge * e, partial.sum(axis=1, keepdims=True)
    cases: [{{M: 20, N: 128}}]
    backends: {{interpret: null, mosaic_tpu: null}}
"""


def _python(proj: Path, source: str) -> str:
    """Run `source` with the project's generated/ importable (as an application would)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=proj, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_part_of_the_section_verifies_and_differentiates(tmp_path):
    proj = _project(tmp_path, {"mixed": MIXED, "mixed_bwd": MIXED_BWD})
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--seed", "5", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    modes = {(x["kernel"], x["backend"], x["mode"]) for x in _results(report) if x["status"] == "pass"}
    assert {("mixed", b, m) for b in ("interpret", "mosaic_tpu") for m in ("run", "grad")} <= modes
    r = invoke_kspec("verify", "--lower", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    out = _python(proj, """
        import jax, jax.numpy as jnp
        from generated.mixed import mixed
        x, s, t = jnp.ones((20, 128)), jnp.full((1, 128), 3.0), jnp.ones((20, 128))
        k = jnp.ones((20, 128), jnp.int32)
        loss = lambda x, s, k, t: jnp.sum(mixed(x, s, k, t)[0]) + jnp.sum(mixed(x, s, k, t)[1])
        gx, gs, gk, gt = jax.grad(loss, argnums=(0, 1, 2, 3), allow_int=True)(x, s, k, t)
        print(float(gx[0, 0]), float(gs[0, 0]), gk.dtype == jax.dtypes.float0, float(jnp.abs(gt).max()))
    """)
    gx, gs, gk, gt = out.split()
    assert (float(gx), float(gs), gk, float(gt)) == (pytest.approx(3 + np.e), 20.0, "True", 0.0)


def _elementwise(name: str, inputs: list, outputs: list, body: str, reference: str, vjp: str = "") -> str:
    """A float32 [M, N] elementwise spec in row blocks."""
    operands = "\n".join(f"  {n}: {{shape: [M, N], dtype: float32}}" for n in inputs)
    results = "\n".join(f"  {n}: {{shape: [M, N], dtype: float32}}" for n in outputs)
    blocks = ", ".join(f"{n}: {BLOCK}" for n in inputs + outputs)
    return (f"kspec: 1\nname: {name}\nparams: {{bm: 8}}\ninputs:\n{operands}\noutputs:\n{results}\n"
            f'grid: {{i: "cdiv(M, bm)"}}\nblocks: {{{blocks}}}\nbody: |\n  {body}\nreference: |\n  {reference}\n'
            f"cases: [{{M: 16, N: 128}}]\n{vjp}")


def _vjp(spec: str, inputs: str, grads: str, residuals: str) -> str:
    return (f"vjp:\n  residuals: [{residuals}]\n  backward:\n    - spec: {spec}.yaml\n"
            f"      inputs: {{{inputs}}}\n      grads: {{{grads}}}\n")


def test_second_derivatives_through_a_backward_kernel_with_its_own_vjp(tmp_path):
    specs = {
        "sq": _elementwise("sq", ["x"], ["o"], "o_ref[...] = x_ref[...] * x_ref[...]", "return x * x",
                           _vjp("sq_dx", "x: x, g: grad(o)", "dx: x", "x")),
        "sq_dx": _elementwise("sq_dx", ["x", "g"], ["dx"], "dx_ref[...] = 2 * x_ref[...] * g_ref[...]",
                              "return 2 * x * g", _vjp("sq_dx2", "x: x, g: g, h: grad(dx)", "dxx: x, dg: g", "x, g")),
        "sq_dx2": _elementwise("sq_dx2", ["x", "g", "h"], ["dxx", "dg"],
                               "dxx_ref[...] = 2 * g_ref[...] * h_ref[...]; dg_ref[...] = 2 * x_ref[...] * h_ref[...]",
                               "return 2 * g * h, 2 * x * h"),
    }
    proj = _project(tmp_path, specs)
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--seed", "6", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    assert {x["kernel"] for x in _results(report) if x["mode"] == "grad"} == {"sq", "sq_dx"}
    out = _python(proj, """
        import jax, jax.numpy as jnp
        from generated.sq import sq
        x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128)
        first = jax.grad(lambda x: jnp.sum(sq(x)))
        second = jax.grad(lambda x: jnp.sum(first(x) * x))  # d/dx sum(2x * x) = 4x
        print(float(jnp.abs(first(x) - 2 * x).max()), float(jnp.abs(second(x) - 4 * x).max()))
    """)
    assert [float(v) for v in out.split()] == [0.0, 0.0]


def test_a_cycle_of_backward_specs_is_refused(tmp_path):
    specs = {
        "a": _elementwise("a", ["x"], ["o"], "o_ref[...] = x_ref[...]", "return x", _vjp("b", "x: grad(o)", "o: x", "")),
        "b": _elementwise("b", ["x"], ["o"], "o_ref[...] = x_ref[...]", "return x", _vjp("a", "x: grad(o)", "o: x", "")),
    }
    for name, text in specs.items():
        (tmp_path / "specs").mkdir(exist_ok=True)
        (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    r = invoke_kspec("check", "specs/a.yaml", cwd=tmp_path)
    assert r.rc == 2
    assert r.out.splitlines() == [
        "specs/a.yaml:18:13: error[E420]: backward spec `b.yaml` has 1 error(s), reported in that file",
        "  = help: fix the backward spec first",
        "specs/b.yaml:18:13: error[E426]: backward spec `a.yaml` closes a cycle: a.yaml -> b.yaml -> a.yaml",
        "  = help: a backward kernel may have a vjp of its own, but no spec can be its own backward kernel, directly or not",
        "2 error(s) in 2 of 2 spec(s)",
    ]


def test_a_backward_spec_outside_the_folder_is_refused(tmp_path):
    text = _elementwise("a", ["x"], ["o"], "o_ref[...] = x_ref[...]", "return x", _vjp("../b", "x: grad(o)", "o: x", ""))
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "a.yaml").write_text(text)
    r = invoke_kspec("check", "specs/a.yaml", cwd=tmp_path)
    refusal = ("specs/a.yaml:18:13: error[E200]: vjp.backward.0.spec must be the name of a spec file in this spec's "
               "folder, such as `layer_norm_bwd.yaml`")
    assert (r.rc, r.out.splitlines()) == (2, [refusal, "1 error(s) in 1 of 1 spec(s)"])


def test_grad_of_a_kernel_without_vjp_says_how_to_add_one():
    import jax
    import jax.numpy as jnp

    from generated.add import NoGradientError, add

    x = jnp.ones((256, 512))
    assert float(add(x, x).sum()) == 2 * 256 * 512  # the forward pass is the kernel's
    with pytest.raises(NoGradientError) as raised:
        jax.grad(lambda a: add(a, x).sum())(x)
    assert str(raised.value) == (
        "add: the kernel declares no gradient, so jax.grad and jax.vjp cannot differentiate it; add a `vjp:` "
        "section to its spec that names the backward kernels (`kspec docs spec`: Autodiff), or differentiate add_reference")
    assert jax.jit(add)(x, x).shape == (256, 512) and jax.vmap(add)(x[None], x[None]).shape == (1, 256, 512)


def test_under_auto_a_backward_kernel_runs_its_reference_where_tuning_measured_it_slower(tmp_path):
    """The forward chosen by backend="auto" chooses its backward kernels so too: a backward spec with
    `dispatch: {reference_when_faster: true}` runs its reference (XLA's fusion) at a bucket where
    `kspec tune --sustained` measured its kernel slower, and says so once. A backend asked for by
    name runs the backward kernel there."""
    from conftest import build_spec

    backward = _elementwise("sq_dx", ["x", "g"], ["dx"], "dx_ref[...] = 2 * x_ref[...] * g_ref[...]",
                            "return 2 * x * g") + "dispatch: {reference_when_faster: true}\n"
    specs = {"sq": _elementwise("sq", ["x"], ["o"], "o_ref[...] = x_ref[...] * x_ref[...]", "return x * x",
                                _vjp("sq_dx", "x: x, g: grad(o)", "dx: x", "x")),
             "sq_dx": backward}
    (tmp_path / "specs").mkdir()
    for name, text in specs.items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    kind = jax.devices()[0].device_kind
    entry = {"backend": "interpret", "bucket": [16, 128], "case": "case0", "dtype": "float32", "fixed": {"bm": 8},
             "jax_version": jax.__version__, "kernel_sha": build_spec(backward).kernel_sha, "load": "sustained",
             "reference_sha": build_spec(backward).reference_sha,
             "message": "", "ms": 2.0, "params": {}, "ref_ms": 1.0, "speedup": 0.5,
             "speedup_ci95": [0.45, 0.55], "status": "pass"}
    (tmp_path / "tuning" / "sq_dx").mkdir(parents=True)
    (tmp_path / "tuning" / "sq_dx" / f"{kind}.json").write_text(
        json.dumps({"kernel": "sq_dx", "device_kind": kind, "entries": [entry]}))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    out = _python(tmp_path, """
        import warnings
        import jax, jax.numpy as jnp
        from generated.sq import sq
        x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128)
        for backend in ("auto", "interpret"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                g = jax.grad(lambda x: jnp.sum(sq(x, backend=backend)))(x)
            print(backend, float(jnp.abs(g - 2 * x).max()), [str(w.message) for w in caught])
    """)
    assert out.splitlines() == [
        "auto 0.0 [\"sq_dx: calling the reference instead of backend 'interpret': kspec tune measured interpret "
        "at 0.5x the reference at this shape bucket\"]",
        "interpret 0.0 []",
    ]


def test_under_auto_a_forward_on_the_reference_keeps_its_backward_kernels(tmp_path):
    """Where backend="auto" runs the reference's forward pass (tuning measured the kernel slower),
    jax.grad still runs the backward kernel: the forward has no pallas_call, the gradient has one."""
    from conftest import build_spec

    forward = _elementwise("sq", ["x"], ["o"], "o_ref[...] = x_ref[...] * x_ref[...]", "return x * x",
                           _vjp("sq_dx", "x: x, g: grad(o)", "dx: x", "x")) + "dispatch: {reference_when_faster: true}\n"
    specs = {"sq": forward, "sq_dx": _elementwise("sq_dx", ["x", "g"], ["dx"], "dx_ref[...] = 2 * x_ref[...] * g_ref[...]",
                                                  "return 2 * x * g")}
    (tmp_path / "specs").mkdir()
    for name, text in specs.items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(text)
    kind = jax.devices()[0].device_kind
    entry = {"backend": "interpret", "bucket": [16, 128], "case": "case0", "dtype": "float32", "fixed": {"bm": 8},
             "jax_version": jax.__version__, "kernel_sha": build_spec(forward).kernel_sha, "load": "sustained",
             "reference_sha": build_spec(forward).reference_sha,
             "message": "", "ms": 2.0, "params": {}, "ref_ms": 1.0, "speedup": 0.5,
             "speedup_ci95": [0.45, 0.55], "status": "pass"}
    (tmp_path / "tuning" / "sq").mkdir(parents=True)
    (tmp_path / "tuning" / "sq" / f"{kind}.json").write_text(
        json.dumps({"kernel": "sq", "device_kind": kind, "entries": [entry]}))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    out = _python(tmp_path, """
        import warnings
        import jax, jax.numpy as jnp
        from generated.sq import sq
        warnings.simplefilter("ignore")
        x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128)
        grad = jax.grad(lambda x: jnp.sum(sq(x)))
        print("pallas_call" in str(jax.make_jaxpr(sq)(x)), "pallas_call" in str(jax.make_jaxpr(grad)(x)),
              float(jnp.abs(grad(x) - 2 * x).max()))
    """)
    assert out.split() == ["False", "True", "0.0"]


def _sq_project(tmp_path) -> tuple:
    """sq (forward, reference_when_faster) and its backward kernel sq_dx, with a bench case; the
    hash `kspec tune --grad` records its entries for."""
    from conftest import build_spec

    from kspec.codegen.spec import tuning

    forward = _elementwise("sq", ["x"], ["o"], "o_ref[...] = x_ref[...] * x_ref[...]", "return x * x",
                           _vjp("sq_dx", "x: x, g: grad(o)", "dx: x", "x")) + \
        "dispatch: {reference_when_faster: true}\nbench: [{name: b, M: 16, N: 128}]\n"
    backward = _elementwise("sq_dx", ["x", "g"], ["dx"], "dx_ref[...] = 2 * x_ref[...] * g_ref[...]", "return 2 * x * g")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "sq.yaml").write_text(forward)
    (tmp_path / "specs" / "sq_dx.yaml").write_text(backward)
    f = build_spec(forward)
    return tuning.grad_sha(f.kernel_sha, [build_spec(backward).kernel_sha], f.reference_sha)


def test_under_auto_jax_grad_differentiates_the_reference_where_tune_grad_measured_the_kernels_slower(tmp_path):
    """A `kspec tune --grad` entry below 1x at a bucket: there backend="auto" runs the forward kernel
    for a call without a derivative, and jax.grad differentiates the reference (no pallas_call at
    all). A bucket not measured takes the verdict of the nearest measured one (a tie goes to the
    larger). A backend named explicitly keeps its backward kernel; a grad entry for another version
    of the kernels is stale (W900) and not embedded."""
    sha = _sq_project(tmp_path)
    kind = jax.devices()[0].device_kind
    entry = {"backend": "interpret", "bucket": [16, 128], "case": "b", "dtype": "float32", "fixed": {"bm": 8},
             "jax_version": jax.__version__, "kernel_sha": sha, "load": "grad", "message": "", "ms": 2.0,
             "params": {}, "ref_ms": 1.0, "speedup": 0.5, "speedup_ci95": [0.45, 0.55], "status": "pass"}
    folder = tmp_path / "tuning" / "sq"
    folder.mkdir(parents=True)
    faster = dict(entry, bucket=[64, 128], case="c", ms=1.0, ref_ms=1.5, speedup=1.5, speedup_ci95=[1.4, 1.6])
    (folder / f"{kind}.json").write_text(json.dumps({"kernel": "sq", "device_kind": kind, "entries": [entry, faster]}))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0 and "W900" not in r.both, r.both
    out = _python(tmp_path, """
        import jax, jax.numpy as jnp
        from generated.sq import sq
        from generated.sq import _tuning
        x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128)
        grad = jax.grad(lambda x: jnp.sum(sq(x)))
        named = jax.grad(lambda x: jnp.sum(sq(x, backend="interpret")))
        print(len(_tuning.GRAD_SPEEDUP), "pallas_call" in str(jax.make_jaxpr(sq)(x)),
              "pallas_call" in str(jax.make_jaxpr(grad)(x)), "pallas_call" in str(jax.make_jaxpr(named)(x)),
              float(jnp.abs(grad(x) - 2 * x).max()))
        # rows 8: nearest measured bucket (16, 128), slower; rows 32: (16, 128) and (64, 128) tie
        print(*("pallas_call" in str(jax.make_jaxpr(grad)(jnp.ones((m, 128)))) for m in (8, 32, 64)))
    """)
    assert out.split() == ["2", "True", "False", "True", "0.0", "False", "True", "True"]
    (folder / f"{kind}.json").write_text(json.dumps(
        {"kernel": "sq", "device_kind": kind, "entries": [dict(entry, kernel_sha="0" * 64)]}))
    r = invoke_kspec("generate", cwd=tmp_path)
    assert r.rc == 0, r.both
    assert f"warning[W900]: 1 of 1 tuning entries for {kind} were recorded for another version of the kernel" in r.both
    assert "GRAD_SPEEDUP = {\n}" in (tmp_path / "generated" / "sq" / "_tuning.py").read_text()


def test_where_auto_runs_the_reference_forward_the_gradient_verdict_still_holds(tmp_path):
    """A bucket where tuning measured the forward kernel slower runs the reference's forward pass;
    its backward kernels still run unless `kspec tune --grad` measured the pass slower there too,
    and then jax.grad differentiates the reference: no pallas_call anywhere."""
    from conftest import build_spec

    sha = _sq_project(tmp_path)
    forward = build_spec((tmp_path / "specs" / "sq.yaml").read_text())
    kind = jax.devices()[0].device_kind
    common = {"backend": "interpret", "bucket": [16, 128], "case": "b", "dtype": "float32", "fixed": {"bm": 8},
              "jax_version": jax.__version__, "message": "", "ms": 2.0, "params": {}, "ref_ms": 1.0,
              "speedup": 0.5, "speedup_ci95": [0.45, 0.55], "status": "pass"}
    slow_forward = dict(common, kernel_sha=forward.kernel_sha, reference_sha=forward.reference_sha, load="sustained")
    folder = tmp_path / "tuning" / "sq"
    folder.mkdir(parents=True)
    seen = []
    for grad_speedup in (0.5, 1.5):
        grad_entry = dict(common, kernel_sha=sha, load="grad", speedup=grad_speedup,
                          speedup_ci95=[grad_speedup - 0.05, grad_speedup + 0.05])
        (folder / f"{kind}.json").write_text(json.dumps(
            {"kernel": "sq", "device_kind": kind, "entries": [slow_forward, grad_entry]}))
        r = invoke_kspec("generate", cwd=tmp_path)
        assert r.rc == 0, r.both
        seen.append(_python(tmp_path, """
            import warnings
            import jax, jax.numpy as jnp
            from generated.sq import sq
            warnings.simplefilter("ignore")
            x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128)
            grad = jax.grad(lambda x: jnp.sum(sq(x)))
            print("pallas_call" in str(jax.make_jaxpr(sq)(x)), "pallas_call" in str(jax.make_jaxpr(grad)(x)),
                  float(jnp.abs(grad(x) - 2 * x).max()))
        """).split())
    assert seen == [["False", "False", "0.0"], ["False", "True", "0.0"]]


def test_tune_grad_records_the_forward_and_backward_pass_against_the_references_autodiff(tmp_path):
    """`kspec tune --grad` times the bench case's forward and backward pass and appends one `load:
    grad` entry per backend, case and dtype, for the hash of the kernel and its backward kernels;
    a rerun skips what is recorded."""
    sha = _sq_project(tmp_path)
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    r = invoke_kspec("tune", "--grad", "--samples", "3", "--seed", "1", cwd=tmp_path, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    assert "sq_dx: skipped: --grad tunes specs with `vjp:`" in r.both
    assert re.search(r"sq\[interpret\] b float32: forward and backward [0-9.]+x the reference's autodiff", r.both), r.both
    kind = jax.devices()[0].device_kind
    doc = json.loads((tmp_path / "tuning" / "sq" / f"{kind.replace(' ', '_')}.json").read_text())
    (entry,) = doc["entries"]
    assert (entry["load"], entry["kernel_sha"], entry["status"], entry["bucket"], entry["case"]) == \
        ("grad", sha, "pass", [16, 128], "b")
    assert entry["speedup"] > 0 and entry["ref_ms"] > 0
    r = invoke_kspec("tune", "--grad", "--samples", "3", "--seed", "1", cwd=tmp_path, timeout=600)
    assert r.rc == 0 and "sq[interpret] b float32: recorded already" in r.both, r.both
    assert len(json.loads((tmp_path / "tuning" / "sq" / f"{kind.replace(' ', '_')}.json").read_text())["entries"]) == 1


def test_an_optional_backward_input_may_be_left_unbound(tmp_path):
    """flash attention's backward specs take optional segment ids: a forward pass that binds none of them
    checks, and its backward pass passes None for them; a required input left unbound is still E422."""
    (tmp_path / "specs").mkdir()
    for name in ("flash_attention", "flash_attention_dq", "flash_attention_dkdv"):
        shutil.copy(REPO / "specs" / f"{name}.yaml", tmp_path / "specs")
    forward = tmp_path / "specs" / "flash_attention.yaml"
    text = forward.read_text()
    assert text.count(", q_segment_ids: q_segment_ids, kv_segment_ids: kv_segment_ids}") == 2
    forward.write_text(text.replace(", q_segment_ids: q_segment_ids, kv_segment_ids: kv_segment_ids}", "}")
                       .replace("residuals: [q, k, v, o, lse, o_err, q_segment_ids, kv_segment_ids]",
                                "residuals: [q, k, v, o, lse, o_err]"))
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    vjp = (tmp_path / "generated" / "flash_attention" / "_vjp.py").read_text()
    assert "_grad_q = _flash_attention_dq(q, k, v, o, _grad_o, lse, o_err, None, None)" in vjp
    forward.write_text(forward.read_text().replace("o: o, do: grad(o), lse: lse, o_err: o_err}", "o: o, do: grad(o), o_err: o_err}", 1))
    r = invoke_kspec("check", "specs/flash_attention.yaml", cwd=tmp_path)
    assert r.rc == 2 and "error[E422]: flash_attention_dq.yaml: input `lse` of flash_attention_dq is not bound" in r.out, r.out


def test_flash_attention_reference_differentiates_by_recomputed_blocks_past_s_4096():
    """Past S = 4096 the reference attends in blocks of queries under jax.checkpoint (at S 32768 the
    whole score matrix fits in no GPU): its outputs and gradients are the one-block formula's."""
    from generated.flash_attention.reference import flash_attention_reference as reference

    B, S, H, D = 1, 4608, 1, 16  # blocks of gcd(4608, 1024) = 512 queries
    q, k, v, do = (jax.random.normal(key, (B, S, H, D), jnp.float32) for key in jax.random.split(jax.random.key(3), 4))

    def whole(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D)
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)

    with jax.default_matmul_precision("highest"):
        out, pullback = jax.vjp(lambda *a: reference(*a, causal=True), q, k, v)
        want, want_pullback = jax.vjp(whole, q, k, v)
        grads, want_grads = pullback(do), want_pullback(do)
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda q: reference(q, k, v, causal=True).sum()))(q))
    assert "checkpoint" in jaxpr or "remat" in jaxpr
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)
