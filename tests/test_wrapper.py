"""Code around the kernel: `prologue:`, `epilogue:` and the kernel's own operands (`kernel:`).

The checks of misuse (E440 and E441 are pinned in test_diagnostics.py too), a throwaway spec whose
generated function runs prologue, kernel and epilogue on every backend it declares (its result is
neither the kernel's alone nor the reference's code), verify and jax.grad of that whole function,
and the shipped decode attention verified on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import declared, invoke_kspec, mutate

BLOCK = '{block_shape: [bm, N], index_map: "i -> (i, 0)"}'

# o = x + 2, computed as: the prologue makes y = x + 1, the kernel writes h = 2y, the epilogue
# returns h - x. Differentiable: do/dx = 1, so the backward kernel returns the cotangent.
AROUND = f"""\
kspec: 1
name: around
params: {{bm: 16}}
inputs:
  x: {{shape: [M, N], dtype: [float32, bfloat16]}}
outputs:
  o: {{shape: [M, N], dtype: x}}
kernel:
  inputs:
    y: {{shape: [M, N], dtype: float32}}
  outputs:
    h: {{shape: [M, N], dtype: float32}}
prologue: |
  return x.astype(jnp.float32) + 1
grid: {{i: "cdiv(M, bm)"}}
blocks: {{y: {BLOCK}, h: {BLOCK}}}
body: |
  h_ref[...] = y_ref[...] * 2
epilogue: |
  return (h - x.astype(jnp.float32)).astype(x.dtype)
reference: |
  return (x.astype(jnp.float32) + 2).astype(x.dtype)
cases: [{{M: 16, N: 128}}, {{name: ragged, M: 24, N: 128, dtype: bfloat16}}]
backends: {{interpret: null, mosaic_tpu: null}}
vjp:
  backward:
    - spec: around_dx.yaml
      inputs: {{g: grad(o)}}
      grads: {{dx: x}}
"""
AROUND_DX = f"""\
kspec: 1
name: around_dx
params: {{bm: 16}}
inputs:
  g: {{shape: [M, N], dtype: [float32, bfloat16]}}
outputs:
  dx: {{shape: [M, N], dtype: g}}
grid: {{i: "cdiv(M, bm)"}}
blocks: {{g: {BLOCK}, dx: {BLOCK}}}
body: |
  dx_ref[...] = g_ref[...]
reference: |
  return g
cases: [{{M: 16, N: 128}}, {{name: ragged, M: 24, N: 128}}]
backends: {{interpret: null, mosaic_tpu: null}}
"""


def _project(tmp_path: Path, around: str = AROUND) -> Path:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "around.yaml").write_text(around)
    (tmp_path / "specs" / "around_dx.yaml").write_text(AROUND_DX)
    return tmp_path


def _check(tmp_path: Path, around: str) -> list:
    _project(tmp_path, around)
    r = invoke_kspec("check", "specs/around.yaml", cwd=tmp_path)
    return [r.rc] + r.out.splitlines()


def test_a_wrapped_kernel_checks(tmp_path):
    assert _check(tmp_path, AROUND) == [0, "2 spec(s) OK"]


MISUSE = {
    "unknown input": (
        ("return x.astype(jnp.float32) + 1", "return z.astype(jnp.float32) + 1"),
        ["specs/around.yaml:14:10: error[E602]: prologue: unknown name `z`",
         "  = help: a name the code reads must be bound in it, or be a ref, param, dim, grid index, input, import of "
         "the generated module or a builtin"],
    ),
    "import": (
        ("  return (h - x", "  import torch\n  return (h - x"),
        ["specs/around.yaml:20:3: error[E601]: epilogue: import of `torch`",
         "  = help: generated modules may import only jax, numpy and the standard library"],
    ),
    "epilogue count": (
        ("return (h - x.astype(jnp.float32)).astype(x.dtype)", "return h, x"),
        ["specs/around.yaml:20:3: error[E441]: epilogue: returns 2 values but outputs has 1 value (o)",
         "  = help: return one value per name of outputs, in order: `return o`"],
    ),
    "prologue returns nothing": (
        ("return x.astype(jnp.float32) + 1", "y = x + 1"),
        ["specs/around.yaml:14:3: error[E441]: prologue: returns nothing; it must return 1 value (y)",
         "  = help: end it with `return y`"],
    ),
    "prologue without kernel inputs": (
        ("  inputs:\n    y: {shape: [M, N], dtype: float32}\n", ""),
        ["specs/around.yaml:12:3: error[E440]: `prologue:` needs kernel.inputs: the kernel's inputs it returns",
         "  = help: declare them under kernel.inputs, with their shapes and dtypes",
         "specs/around.yaml:14:10: error[E405]: block spec for unknown operand `y`"],
    ),
    "sharding": (
        ("vjp:", "sharding:\n  mesh: {d: 2}\n  specs: {x: [d], o: [d]}\nvjp:"),
        ["specs/around.yaml:8:1: error[E440]: `sharding:` does not take a prologue or epilogue",
         "  = help: shard the kernel without them, or drop `sharding:`"],
    ),
    "kernel output named like an input": (
        ("    h: {shape", "    x: {shape"),
        ["specs/around.yaml:12:5: error[E400]: kernel output `x` has the same name as input `x`",
         "  = help: give each operand, dim, param and scratch buffer its own name",
         "specs/around.yaml:12:5: error[E400]: kernel output ref `x_ref` has the same name as input ref `x_ref`",
         "  = help: give each operand, dim, param and scratch buffer its own name",
         "specs/around.yaml:16:63: error[E405]: block spec for unknown operand `h`"],
    ),
    "kernel input named like an input, another dtype": (
        ("    y: {shape: [M, N], dtype: float32}", "    x: {shape: [M, N], dtype: float32}"),
        ("blocks: {y: ", "blocks: {x: "), ("h_ref[...] = y_ref", "h_ref[...] = x_ref"),
        ["specs/around.yaml:10:31: error[E407]: kernel input x takes the name of input `x` but not its dtype",
         "  = help: write `dtype: x`, or give the kernel input a name of its own"],
    ),
    "kernel operand shape": (
        ("y: {shape: [M, N]", "y: {shape: [M, K]"),
        ["specs/around.yaml:10:20: error[E408]: y: `K` is not a dim bound by an input shape, nor a param",
         "  = help: use it alone as a dim of some input's shape, or declare it under params"],
    ),
    "kernel operand dtype": (
        ("y: {shape: [M, N], dtype: float32}", "y: {shape: [M, N], dtype: float31}"),
        ["specs/around.yaml:10:31: error[E401]: y: unknown dtype `float31`",
         "  = help: did you mean `float32`?"],
    ),
}


@pytest.mark.parametrize("what", MISUSE)
def test_misuse_is_a_located_diagnostic(tmp_path, what):
    *replacements, expected = MISUSE[what]
    out = _check(tmp_path, mutate(AROUND, *replacements))
    assert out[0] == 2 and out[1:-1] == expected, out


def _python(proj: Path, source: str) -> str:
    """Run `source` with the project's generated/ importable (as an application would)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=proj, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_function_runs_prologue_kernel_and_epilogue(tmp_path):
    proj = _project(tmp_path)
    r = invoke_kspec("generate", cwd=proj)
    assert r.rc == 0, r.both
    out = _python(proj, """
        import jax, jax.numpy as jnp
        from jax.experimental.pallas import tpu as pltpu
        from generated.around import around, interpret, mosaic_tpu
        x = jnp.linspace(-1.0, 1.0, 24 * 128).reshape(24, 128)
        # the kernel alone writes 2 (x + 1); with the epilogue, 2 (x + 1) - x
        print(float(jnp.abs(interpret.around(x) - (2 * (x + 1) - x)).max()))
        print(float(jnp.abs(mosaic_tpu.around(x, interpret=pltpu.InterpretParams()) - (2 * (x + 1) - x)).max()))
        print(around(x.astype(jnp.bfloat16), backend="interpret").dtype)
        loss = lambda x: jnp.sum(around(x, backend="interpret") * x)  # d/dx sum((x + 1) x + x) = 2x + 2
        print(float(jnp.abs(jax.jit(jax.grad(loss))(x) - (2 * x + 2)).max()))
        interpret._around_prologue = lambda x, **static: x[:, :64]  # a prologue that returns the wrong shape
        try:
            interpret.around(x[:16])
        except ValueError as e:
            print(e)
    """)
    run, tpu, dtype, grad, error = out.splitlines()
    assert float(run) < 1e-6 and float(tpu) < 1e-6 and float(grad) < 1e-5
    assert dtype == "bfloat16"
    assert error == "around: y must have shape (16, 128), got (16, 64)"
    backend = (proj / "generated" / "around" / "interpret.py").read_text()
    assert "def _around_prologue(x, *, bm, M, N):\n    \"\"\"The prologue" in backend
    assert "    y = _around_prologue(x, bm=bm, M=M, N=N)\n" in backend
    assert "    h = _kernel_call(y)\n    return _around_epilogue(h, x=x, bm=bm, M=M, N=N)\n" in backend


def test_verify_runs_the_whole_function_and_its_gradient(tmp_path):
    proj = _project(tmp_path)
    assert invoke_kspec("generate", cwd=proj).rc == 0
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "specs/around.yaml", "--seed", "3", "--json", report, cwd=proj, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    rows = json.loads(report.read_text())["results"]
    done = {(x["kernel"], x["backend"], x["mode"], x["case"]) for x in rows if x["status"] == "pass"}
    assert {("around", b, m, c) for b in ("interpret", "mosaic_tpu") for m in ("run", "grad")
            for c in ("case0", "ragged")} <= done
    # an epilogue one off: the function, not the kernel, is what verify compares
    _project(tmp_path, mutate(AROUND, ("return (h - x.astype(jnp.float32))", "return (h - x.astype(jnp.float32) + 1)")))
    assert invoke_kspec("generate", cwd=proj).rc == 0
    r = invoke_kspec("verify", "specs/around.yaml", "--backend", "interpret", "--case", "case0", "--seed", "3",
                     "--json", report, cwd=proj, timeout=600)
    assert r.rc == 1
    rows = json.loads(report.read_text())["results"]
    assert {x["status"] for x in rows if x["kernel"] == "around" and x["mode"] == "run"} == {"fail"}


def test_decode_attention_verifies_on_the_cpu(repo_copy):
    r = invoke_kspec("verify", "specs/decode_attention.yaml", "--backend", "interpret", "--seed", "5",
                     "--json", "r.json", cwd=repo_copy, timeout=600)
    assert r.rc == 0, r.both[-3000:]
    rows = json.loads((repo_copy / "r.json").read_text())["results"]
    assert {(x["case"], x["status"]) for x in rows} == {(c, "pass") for c in ("mqa", "gqa", "mha", "mqa_long",
                                                                          "gqa_opposed")}


def test_a_race_under_an_epilogue_names_the_kernel_outputs(tmp_path):
    """The planted carry across a parallel grid axis, with an epilogue: the outputs still differ between TPU
    interpret schedules, and the report says that the output's writers are the kernel's outputs'."""
    planted = (Path(__file__).parent / "planted" / "carry_parallel.yaml").read_text()
    spec = mutate(
        planted,
        ('  o: {block_shape: [bm, N], index_map: "i -> (i, 0)"}', '  h: {block_shape: [bm, N], index_map: "i -> (i, 0)"}'),
        ("  o_ref[...] = sums", "  h_ref[...] = sums"),
        ("reference: |", "kernel:\n  outputs:\n    h: {shape: [M, N], dtype: float32}\nepilogue: |\n  return h\nreference: |"),
    )
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "carry_parallel.yaml").write_text(spec)
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--seed", "7", "--json", report, cwd=tmp_path, timeout=600)
    assert r.rc == 1, r.both[-2000:]
    [row] = declared(json.loads(report.read_text())["results"])
    lines = row["message"].splitlines()
    assert lines[0].startswith("the outputs depend on the schedule: output o at ")
    assert lines[1].startswith("  o is the epilogue's, computed from the kernel's outputs (h), so its writers are not "
                               "known; the parallel grid axes involved: i; "), lines


def test_backend_auto_judges_the_kernel_operands_blocks():
    """_dispatch reads the kernel's own blocks: the prologue pads the three query heads of a key/value head
    to 16 rows, so the qg block is [16, D], which Triton loads; a head size of 48 makes it [16, 48], which
    it cannot. qg is no input of the function: its block is known only from the kernel's operands."""
    import jax.numpy as jnp

    from generated.decode_attention import _dispatch

    q, k = jnp.zeros((1, 6, 64), jnp.float32), jnp.zeros((1, 128, 2, 64), jnp.float32)
    assert _dispatch.why_not("triton", q, k, k, splits=2, bk=32) is None
    q, k = jnp.zeros((1, 6, 48), jnp.float32), jnp.zeros((1, 128, 2, 48), jnp.float32)
    assert _dispatch.why_not("triton", q, k, k, splits=2, bk=32) == (
        "qg block (1, 1, 16, 48) is not all powers of two, which Triton needs")


def test_a_scratch_buffer_takes_the_dtype_of_an_input_of_either_kind(tmp_path):
    """`dtype: x` (the function's input) and `dtype: y` (the kernel's) both resolve inside the backend function."""
    proj = _project(tmp_path, mutate(AROUND, (
        "body: |\n  h_ref[...] = y_ref[...] * 2",
        "scratch:\n  a: {shape: [bm, N], dtype: x}\n  c: {shape: [bm, N], dtype: y}\nbody: |\n"
        "  a_ref[...] = y_ref[...].astype(a_ref.dtype)\n  c_ref[...] = y_ref[...]\n  h_ref[...] = c_ref[...] * 2")))
    assert invoke_kspec("check", "specs/around.yaml", cwd=proj).rc == 0
    assert invoke_kspec("generate", cwd=proj).rc == 0
    backend = (proj / "generated" / "around" / "interpret.py").read_text()
    assert "pltpu.VMEM((bm, N), x.dtype),\n                pltpu.VMEM((bm, N), y.dtype)," in backend
    out = _python(proj, """
        import jax.numpy as jnp
        from generated.around import interpret
        x = jnp.linspace(-1.0, 1.0, 16 * 128).reshape(16, 128).astype(jnp.bfloat16)
        print(float(jnp.abs(interpret.around(x).astype(jnp.float32) - (x.astype(jnp.float32) + 2)).max()))
    """)
    assert float(out) < 2e-2


def test_bench_times_and_checks_the_whole_function(tmp_path):
    """bench's check of a timed call compares the function's outputs, epilogue included, with the reference."""
    def bench(around: str) -> dict:
        _project(tmp_path, around)
        assert invoke_kspec("generate", cwd=tmp_path).rc == 0
        report = tmp_path / "b.json"
        invoke_kspec("bench", "specs/around.yaml", "--backend", "interpret", "--samples", "3", "--seed", "1",
                     "--json", report, cwd=tmp_path, timeout=600)
        rows = json.loads(report.read_text())["results"]
        return {(x["case"], x["dtype"]): x["status"] for x in rows if x["kernel"] == "around"}

    runs = [("case0", "float32"), ("case0", "bfloat16"), ("ragged", "bfloat16")]
    assert bench(AROUND) == {run: "pass" for run in runs}
    off = mutate(AROUND, ("return (h - x.astype(jnp.float32))", "return (h - x.astype(jnp.float32) + 1)"))
    assert bench(off) == {run: "fail" for run in runs}
