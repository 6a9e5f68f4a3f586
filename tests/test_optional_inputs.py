"""Optional inputs (`optional: true`) and cases that leave them out (`absent:`): the function, the
prologue and the reference take None; the prologue makes the kernel's inputs either way. verify runs
each variant a case selects; the misuse of either key is E442."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import declared, invoke_kspec, mutate

# o = x + bias, the bias optional: the prologue passes the kernel a row of zeros in its place.
BIASED = """\
kspec: 1
name: biased
params: {bm: 16}
inputs:
  x: {shape: [M, N], dtype: [float32, bfloat16]}
  bias: {shape: [N], dtype: x, optional: true}
outputs:
  o: {shape: [M, N], dtype: x}
kernel:
  inputs:
    x: {shape: [M, N], dtype: x}
    b: {shape: [1, N], dtype: x}
prologue: |
  return x, (jnp.zeros((N,), x.dtype) if bias is None else bias).reshape(1, N)
grid: {i: "cdiv(M, bm)"}
blocks:
  x: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
  b: {block_shape: [1, N], index_map: "i -> (0, 0)"}
  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...] + b_ref[...]
reference: |
  return x if bias is None else x + bias
cases:
  - {name: with_bias, M: 32, N: 128}
  - {name: without, M: 40, N: 128, absent: [bias]}
backends: {interpret: null, mosaic_tpu: null}
"""


def _write(tmp_path, text: str):
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "biased.yaml").write_text(text)


def _verify(tmp_path) -> set:
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    report = tmp_path / "r.json"
    invoke_kspec("verify", "--backend", "interpret", "--seed", "4", "--json", report, cwd=tmp_path, timeout=600)
    return {(x["case"], x["dtype"], x["status"]) for x in declared(json.loads(report.read_text())["results"])}


def test_each_variant_verifies_and_the_absent_one_gets_none(tmp_path):
    _write(tmp_path, BIASED)
    both = {(c, d) for c in ("with_bias", "without") for d in ("float32", "bfloat16")}
    assert _verify(tmp_path) == {(c, d, "pass") for c, d in both}
    # a prologue that mishandles None fails the case that leaves the bias out, and only that one
    _write(tmp_path, mutate(BIASED, ("jnp.zeros((N,), x.dtype)", "jnp.ones((N,), x.dtype)")))
    assert _verify(tmp_path) == {(c, d, "pass" if c == "with_bias" else "fail") for c, d in both}


def test_the_functions_take_the_optional_input_as_a_keyword(tmp_path):
    _write(tmp_path, BIASED)
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    source = textwrap.dedent("""
        import jax.numpy as jnp
        from generated.biased import biased, biased_reference, interpret
        x = jnp.linspace(-1.0, 1.0, 40 * 128).reshape(40, 128)
        bias = jnp.linspace(0.0, 2.0, 128)
        print(float(jnp.abs(biased(x, backend="interpret") - x).max()),
              float(jnp.abs(interpret.biased(x, bias=bias) - (x + bias)).max()),
              float(jnp.abs(biased_reference(x, bias) - (x + bias)).max()))
        try:
            interpret.biased(x, bias[:64])
        except ValueError as e:
            print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    errors, shape = proc.stdout.splitlines()
    assert [float(e) for e in errors.split()] == [0.0, 0.0, 0.0]
    assert shape == "biased: bias must have shape (128,), got (64,)"
    assert "def biased(x, bias=None, *, bm=16):" in (tmp_path / "generated" / "biased" / "interpret.py").read_text()


def test_the_body_knows_whether_the_call_gave_the_input(tmp_path):
    """`has_bias`: a static boolean in the body. A body that adds the bias only under it never reads the
    stand-in of a bias the call left out (NaNs here), in both backends; a body reading `has_x` for a
    required input is E602."""
    spec = mutate(BIASED, ("jnp.zeros((N,), x.dtype)", "jnp.full((N,), jnp.nan, x.dtype)"),
                  ("o_ref[...] = x_ref[...] + b_ref[...]",
                   "o_ref[...] = x_ref[...] + b_ref[...] if has_bias else x_ref[...]"))
    _write(tmp_path, spec)
    both = {(c, d) for c in ("with_bias", "without") for d in ("float32", "bfloat16")}
    assert _verify(tmp_path) == {(c, d, "pass") for c, d in both}
    assert "    has_bias = bias is not None\n" in (tmp_path / "generated" / "biased" / "mosaic_tpu.py").read_text()
    # without the flag the body adds the NaNs
    _write(tmp_path, mutate(spec, (" if has_bias else x_ref[...]", "")))
    assert _verify(tmp_path) == {(c, d, "pass" if c == "with_bias" else "fail") for c, d in both}
    _write(tmp_path, mutate(spec, ("if has_bias else", "if has_x else")))
    r = invoke_kspec("check", "specs/biased.yaml", cwd=tmp_path)
    assert (r.rc, r.out.splitlines()[:2]) == (2, [
        "specs/biased.yaml:21:43: error[E602]: body: unknown name `has_x`",
        "  = help: did you mean `has_bias`?"]), r.out


MISUSE = {
    "no prologue": (
        (("kernel:\n  inputs:\n    x: {shape: [M, N], dtype: x}\n    b: {shape: [1, N], dtype: x}\n"
          "prologue: |\n  return x, (jnp.zeros((N,), x.dtype) if bias is None else bias).reshape(1, N)\n"), ""),
        ('  b: {block_shape: [1, N], index_map: "i -> (0, 0)"}', '  bias: {block_shape: [N], index_map: "i -> (0,)"}'),
        ("b_ref[...]", "bias_ref[...]"),
        ["specs/biased.yaml:6:3: error[E442]: optional input `bias` needs a prologue and kernel.inputs: the kernel "
         "never takes None, the prologue makes its inputs either way",
         "  = help: add a prologue that handles None, e.g. zeros in its place"],
    ),
    "before a required input": (
        ("  bias: {shape: [N], dtype: x, optional: true}\n", ""),
        ("inputs:\n  x:", "inputs:\n  bias: {shape: [N], dtype: float32, optional: true}\n  x:"),
        ["specs/biased.yaml:5:3: error[E442]: optional input `bias` comes before required input `x`",
         "  = help: declare the optional inputs last"],
    ),
    "binds a dim alone": (
        ("bias: {shape: [N], dtype: x", "bias: {shape: [K], dtype: x"),
        ["specs/biased.yaml:6:3: error[E442]: optional input `bias` binds dim `K`, which no required input has",
         "  = help: use dims of the required inputs"],
    ),
    "absent names a required input": (
        ("absent: [bias]", "absent: [x]"),
        ["specs/biased.yaml:26:5: error[E442]: case `without`: absent `x` is not an optional input",
         "  = help: mark the input `optional: true`"],
    ),
    "shares its dtype": (
        ("  o: {shape: [M, N], dtype: x}", "  o: {shape: [M, N], dtype: bias}"),
        ("  bias: {shape: [N], dtype: x, optional: true}", "  bias: {shape: [N], dtype: [float32, bfloat16], optional: true}"),
        ["specs/biased.yaml:6:3: error[E442]: optional input `bias` gives its dtype to `o`, which would have none "
         "without it",
         "  = help: give o a dtype of its own"],
    ),
}


@pytest.mark.parametrize("what", MISUSE)
def test_misuse_is_e442(tmp_path, what):
    *replacements, expected = MISUSE[what]
    _write(tmp_path, mutate(BIASED, *replacements))
    r = invoke_kspec("check", "specs/biased.yaml", cwd=tmp_path)
    assert (r.rc, r.out.splitlines()[:-1]) == (2, expected), r.out


def test_the_gradient_of_either_variant(tmp_path):
    """A differentiable spec with an optional input (held out of the gradient by no_grad): jax.grad through
    the function with and without it, as verify's grad rows take it."""
    from test_wrapper import AROUND_DX

    spec = mutate(BIASED, ("return x if bias is None else x + bias", "return x if bias is None else x + lax.stop_gradient(bias)"))
    _write(tmp_path, spec + "vjp:\n  no_grad: [bias]\n  backward:\n    - spec: around_dx.yaml\n"
                            "      inputs: {g: grad(o)}\n      grads: {dx: x}\n")
    (tmp_path / "specs" / "around_dx.yaml").write_text(AROUND_DX)
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "specs/biased.yaml", "--backend", "interpret", "--seed", "4", "--json", report,
                     cwd=tmp_path, timeout=600)
    assert r.rc == 0, r.both[-2000:]
    rows = json.loads(report.read_text())["results"]
    grads = {(x["case"], x["dtype"]) for x in rows if x["kernel"] == "biased" and x["mode"] == "grad" and x["status"] == "pass"}
    assert grads == {(c, d) for c in ("with_bias", "without") for d in ("float32", "bfloat16")}
