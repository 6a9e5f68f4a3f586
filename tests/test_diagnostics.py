"""One test per diagnostic code: a tiny bad spec and the exact text `kspec check` prints.

Output is piped here, so there is no quoted line or caret (tests/unit/diagnostics/ formats
those): each diagnostic is its `path:line:col: error[CODE]: message` header and, if it has
one, its `= help:` line.
A new code in codegen.diagnostics.CODES fails test_every_code_has_a_case until it
gets a spec and a pinned text below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kspec.codegen.backends import BACKENDS
from kspec.codegen.diagnostics import CODES
from kspec.codegen.spec.schema import schema
from conftest import VALID_SPEC, mutate

V = VALID_SPEC
X_BLOCK = 'x: {block_shape: [bs], index_map: "i -> (i,)"}'
O_BLOCK = 'o: {block_shape: [bs], index_map: "i -> (i,)"}'
GRID = 'grid: ["cdiv(N, bs)"]'
BODY = "o_ref[...] = x_ref[...] * 2"
X_INPUT = "  x: {shape: [N], dtype: float32}\n"


def backend(section: str) -> str:
    """The valid spec with a `backends:` section appended."""
    return V + "backends:\n" + section


def sharded(section: str, *more: tuple) -> str:
    """The valid spec with a `sharding:` section (and `more` replacements)."""
    return mutate(V, ("cases:", "sharding:\n" + section + "cases:"), *more)


# A small valid mesh kernel (kind: mesh) for Mosaic GPU: two CTAs, each doubling its half
# of the vector through a pipeline; mesh-kernel bad specs change one line of it.
MESH = """\
kspec: 1
name: tiny_mesh
kind: mesh
params:
  bs: 128
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: [N], dtype: x}
mesh:
  grid: {sm: 2}
pipelines:
  steps:
    grid: {i: "N // 2 // bs"}
    in:
      x: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i,)"}
    out:
      o: {view: ["N // 2"], block_shape: [bs], index_map: "i -> (i,)"}
body: |
  half = pl.ds(sm * (N // 2), N // 2)
  def step(indices, x_block, o_block):
      o_block[...] = x_block[...] * 2
  steps(step)(x_ref.at[half], o_ref.at[half])
reference: |
  return x * 2
cases:
  - {name: c, N: 1024}
backends:
  mosaic_gpu:
"""

# The valid spec with a case whose N is not a multiple of bs: no W902.
RAGGED = VALID_SPEC + "  - {name: r, N: 60}\n"

Y_INPUT = ("  x: {shape: [N], dtype: float32}\n", "  x: {shape: [N], dtype: float32}\n  y: {shape: [N], dtype: float32}\n")

# The backward kernel of the valid spec (o = 2x, so dx = 2 * do) for the vjp codes.
DX = """\
kspec: 1
name: dx
params:
  bs: 8
inputs:
  g: {shape: [N], dtype: float32}
outputs:
  dx: {shape: [N], dtype: g}
grid: ["cdiv(N, bs)"]
blocks:
  g: {block_shape: [bs], index_map: "i -> (i,)"}
  dx: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  dx_ref[...] = g_ref[...] * 2
reference: |
  return g * 2
cases:
  - {name: c, N: 64}
  - {name: r, N: 60}
"""
VJP = "vjp:\n  backward:\n    - spec: dx.yaml\n      inputs: {g: grad(o)}\n      grads: {dx: x}\n"
# A second output t = x, residual: written by the kernel for the backward pass, not returned.
RESIDUAL_T = (
    ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: x}\n  t: {shape: [N], dtype: x, residual: true}"),
    (O_BLOCK, O_BLOCK + '\n  t: {block_shape: [bs], index_map: "i -> (i,)"}'),
    (BODY, BODY + "\n  t_ref[...] = x_ref[...]"),
)


# The valid spec as a kernel that writes h = x, with an epilogue that doubles it (`return h * 2`).
WRAPPED = (
    (O_BLOCK, 'h: {block_shape: [bs], index_map: "i -> (i,)"}'),
    (BODY, "h_ref[...] = x_ref[...]"),
    ("reference:", "kernel:\n  outputs:\n    h: {shape: [N], dtype: x}\nepilogue: |\n  return h * 2\nreference:"),
)


def vjp(*replacements: tuple, dx: str | None = DX) -> dict:
    """specs/bad.yaml: the valid spec with a `vjp:` section (and `replacements`), and
    specs/dx.yaml, its backward kernel (`dx`; None: no such file)."""
    files = {"bad": mutate(V + VJP, *replacements)}
    return files if dx is None else dict(files, dx=dx)


# code -> the bad spec (text or bytes; None: the file does not exist).
SPECS = {
    "E100": None,
    "E101": mutate(V, ("name: tiny", "name: [tiny")),
    "E102": mutate(V, ("doc: Doubles a vector.\n", "doc: Doubles a vector.\ndoc: Again.\n")),
    "E103": mutate(V, ("  bs: 8", "  bs: &b 8")),
    "E104": mutate(V, ("  bs: 8", "  bs: !!python/object/apply:os.system ['true']")),
    "E105": b"# " + b"x" * (1 << 20) + b"\n",
    "E106": b"- name: tiny\n",
    "E107": mutate(V, ("Doubles", "Dou\udcffbles")).encode("utf-8", "surrogateescape"),
    "E108": b"a: " + b"[" * 40 + b"]" * 40 + b"\n",
    "E109": mutate(V, ("  bs: 8", "  bs: " + "9" * 41)),
    "E200": mutate(V, ("kspec: 1", "kspec: 2")),
    "E201": mutate(V, ("doc: Doubles", "dco: Doubles")),
    "E202": mutate(V, ("reference: |\n  return x * 2\n", "")),
    "E203": mutate(V, ("  bs: 8", "  bs: eight")),
    "E300": mutate(V, (GRID, 'grid: ["N ** 2"]')),
    "E301": mutate(V, (GRID, 'grid: ["cdiv(N, bz)"]')),
    "E302": mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i (i,)"}')),
    "E303": mutate(V, (GRID, 'grid: ["N // (bs - 8)"]')),
    "E400": mutate(V, ("  bs: 8", "  bs: 8\n  x: 1")),
    "E401": mutate(V, ("dtype: float32", "dtype: float31")),
    "E402": mutate(V, (X_BLOCK, 'x: {block_shape: [bs, 1], index_map: "i -> (i, 0)"}')),
    "E403": mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i, j -> (i,)"}')),
    "E404": mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> (i, 0)"}')),
    "E405": mutate(V, (O_BLOCK, O_BLOCK + '\n  z: {block_shape: [bs], index_map: "i -> (i,)"}')),
    "E407": mutate(V, ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: x}\n  p: {shape: [N], dtype: o}")),
    "E408": mutate(V, ("o: {shape: [N], dtype: x}", "o: {shape: [K], dtype: x}")),
    "E409": backend("  interpret:\n  cuda:\n"),
    "E410": mutate(
        V,
        ("inputs:\n", "inputs:\n  s: {shape: [4], dtype: int32, prefetch: true}\n"),
        (X_BLOCK, 'x: {block_shape: [bs], index_map: "i, s -> (i,)"}'),
        (O_BLOCK, 'o: {block_shape: [bs], index_map: "i, s -> (i,)"}'),
    ),
    "E411": mutate(V, ("x: {shape: [N], dtype: float32}", "x: {shape: [N], dtype: float32, init: {kind: uniform, low: 1, high: 0}}")),
    "E412": mutate(V, ("cases:", "input_output_aliases: {o: y}\ncases:")),
    "E413": backend('  triton:\n    blocks:\n      x: {block_shape: [bs], index_map: "i -> (i,)", memory_space: vmem}\n'),
    "E414": backend("  interpret:\n    scratch:\n      bar: {shape: [1], kind: barrier}\n"),
    "E415": mutate(V, ("  bs: 8\n", "  bs: 8\n" + "".join(f"  {p}: {{default: 1, choices: [{', '.join(map(str, range(1, 51)))}]}}\n" for p in "abc")),
                   ("o_ref[...] = x_ref[...] * 2", "o_ref[...] = x_ref[...] * 2 + 0 * (a + b + c)")),
    "E416": mutate(V, *RESIDUAL_T),
    "E417": vjp(*RESIDUAL_T),
    "E418": vjp(("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: x, residual: true}"),
                ("vjp:\n", "vjp:\n  residuals: [o]\n"), ("{g: grad(o)}", "{g: o}")),
    "E419": mutate(V, ("x: {shape: [N], dtype: float32}", "x: {shape: [N], dtype: [float32, bfloat16]}"),
                   ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: {from: x, map: {float32: float32}}}")),
    "E430": mutate(V, ("cases:", "mesh:\n  cores: {core: 2}\ncases:")),
    "E431": mutate(MESH, ("  grid: {sm: 2}", "  cores: {core: 2}")),
    "E432": mutate(MESH, ("      o: {view", "      y: {view")),
    "E440": mutate(V, *WRAPPED, ("epilogue: |\n  return h * 2\n", "")),
    "E441": mutate(V, *WRAPPED, ("return h * 2", "return h * 2, h")),
    "E442": mutate(V, ("  x: {shape: [N], dtype: float32}\n", "  x: {shape: [N], dtype: float32}\n  y: {shape: [N], dtype: x, optional: true}\n")),
    "E443": mutate(V, *WRAPPED, ("h: {shape: [N], dtype: x}", "h: {shape: [N], dtype: x, residual: true}")),
    "E450": mutate(V, (X_INPUT, X_INPUT + "  a: {shape: [N], dtype: int32, init: {kind: index, bound: b}}\n"
                                          "  b: {shape: [N], dtype: int32, init: {kind: index, low: a, bound: N}}\n")),
    "E451": mutate(V, (X_INPUT, X_INPUT + "  y: {shape: [N, N], dtype: float32, init: {same_as: x}}\n")),
    "E452": mutate(V, (X_INPUT, X_INPUT + '  y: {shape: [N], dtype: float32, init: {code: "z = jax.random.normal(key, (N,))"}}\n')),
    "E453": mutate(V, (X_INPUT, "  x: {shape: [N], dtype: float32, kinds: [large]}\n  y: {shape: [N], dtype: x, init: {same_as: x}}\n")),
    "E420": vjp(("spec: dx.yaml", "spec: missing.yaml"), dx=None),
    "E421": vjp(("vjp:\n", "vjp:\n  residuals: [z]\n")),
    "E422": vjp(("{g: grad(o)}", "{g: grad(o), h: grad(o)}")),
    "E423": vjp(("{dx: x}", "{dy: x}")),
    "E424": vjp(dx=mutate(DX, ("dx: {shape: [N], dtype: g}", "dx: {shape: [N], dtype: bfloat16}"))),
    "E425": vjp(Y_INPUT),
    "E426": vjp(("spec: dx.yaml", "spec: bad.yaml"), dx=None),
    "E427": vjp(dx=mutate(DX, ("g: {shape: [N], dtype: float32}", "g: {shape: [N], dtype: bfloat16}"))),
    "E428": vjp(dx=mutate(DX, ("cases:\n  - {name: c, N: 64}\n  - {name: r, N: 60}", 'constraints: ["N % 128 == 0"]\ncases:\n  - {name: c, N: 128}'))),
    "E429": vjp(dx=mutate(DX, ("  - {name: r, N: 60}\n", "")) + "backends:\n  mosaic_tpu:\n    params: {bs: 64}\n"),
    "E500": mutate(V, ("{name: c, N: 64}", "{name: c}")),
    "E501": mutate(V, ("cases:", 'constraints:\n  - {expr: "N % 128 == 0", message: N must be a multiple of 128}\ncases:')),
    "E502": mutate(V, (O_BLOCK, 'o: {block_shape: [bs], index_map: "i -> (i + 1,)"}')),
    "E503": mutate(V, (GRID, 'grid: ["cdiv(N, bs) - 1"]')),
    "E504": mutate(V, ("{name: c, N: 64}", "{name: c, N: 64, dtype: int32}")),
    "E505": mutate(V, (GRID, 'grid: ["N - 64"]')),
    "E506": mutate(V, ("o: {shape: [N], dtype: x}", "o: {shape: [N - 64], dtype: x}")),
    "E507": mutate(V, ("  x: {shape: [N], dtype: float32}\n", "".join(
        f"  {n}: {{shape: [N], dtype: [float32, bfloat16, float16, int32, int16, int8, uint8]}}\n" for n in "xyz"))),
    "E508": mutate(V, (GRID, 'grid: ["N * 33554432"]')),
    "E510": V + "families:\n  f:\n    dims: {N: {from: 1, to: 600, step: 1}}\n",
    "E511": mutate(V, (BODY, BODY + " + x_ref[8]")),
    "E509": mutate(V, ("  return x * 2\ncases:\n  - {name: c, N: 64}",
                       ("  return x * 2\ncompetitors:\n  xla: {body: return x + x}\n"
                        "cases:\n  - {name: c, N: 64, min_speedup_over: {xl: 1.1}}"))),
    "E600": mutate(V, (BODY, "o_ref[...] = x_ref[...] *")),
    "E601": mutate(V, (BODY, "import torch\n  " + BODY)),
    "E602": mutate(V, (BODY, BODY + " + bss")),
    "E701": backend("  mosaic_tpu:\n    blocks:\n      o: {block_shape: [64], index_map: \"i -> (0,)\"}\n"),
    "E702": backend(
        "  mosaic_tpu:\n"
        "    params: {bs: 64}\n"
        '    grid: ["cdiv(N, bs)", 2]\n'
        "    blocks:\n"
        '      x: {block_shape: [bs], index_map: "i, j -> (i,)"}\n'
        '      o: {block_shape: [bs], index_map: "i, j -> (i,)"}\n'
        "    compiler_params: {dimension_semantics: [parallel, parallel]}\n"
    ),
    "E703": backend("  mosaic_tpu:\n    params: {bs: 64}\n    compiler_params: {vmem_limit_bytes: 512}\n"),
    "E704": backend("  mosaic_tpu:\n    params: {bs: 64}\n    compiler_params: {dimension_semantics: [parallel, parallel]}\n"),
    "E705": backend(
        "  mosaic_tpu:\n    params: {bs: 64}\n    blocks:\n"
        '      x: {block_shape: [bs], index_map: "i -> (i,)", pipeline_mode: {buffered: 3}}\n'
    ),
    "E711": backend("  triton:\n    params: {bs: 12}\n"),
    "E712": backend("  triton:\n    body: |\n      o_ref[...] = jnp.dot(x_ref[...], x_ref[...]) * x_ref[...]\n"),
    "E713": backend("  triton:\n    params: {warps: 6}\n    compiler_params: {num_warps: warps}\n"),
    "E714": backend("  triton:\n    shared_memory: \"N * bs * itemsize(x) * 128\"\n"),
    "E721": backend("  mosaic_gpu:\n    scratch:\n      buf: {shape: [256, 256], dtype: float32, memory_space: smem}\n"),
    "E722": backend("  mosaic_gpu:\n    params: {bs: 512}\n"),
    "E723": mutate(MESH, ("  grid: {sm: 2}", "  grid: {sm: 2}\n  threads: {wg: 9}")),
    "E724": mutate(MESH, ("  grid: {sm: 2}", "  grid: {sm: num_sms}\n  cluster: {c: 5}")),
    "E725": mutate(MESH, ("  steps(step)(x_ref.at[half], o_ref.at[half])\n", "  steps(step)(x_ref.at[half], o_ref.at[half])\n  plgpu.wait_smem_to_gmem(1)\n")),
    "E800": sharded("  mesh: {d: 4}\n  specs: {x: [e], o: [d]}\n"),
    "E801": sharded("  mesh: {d: 4}\n  specs: {x: [[d, d]], o: [d]}\n"),
    "E802": sharded("  mesh: {d: 4}\n  specs: {x: [d, null], o: [d]}\n"),
    "E803": sharded("  mesh: {d: 4}\n  specs: {x: [d], y: [null], o: [d]}\n", Y_INPUT),
    "E804": sharded("  mesh: {d: 3}\n  specs: {x: [d], o: [d]}\n"),
    "E805": sharded("  mesh: {d: 4}\n  specs: {x: [d]}\n"),
    "E806": sharded("  mesh: {d: 16}\n  specs: {x: [d], o: [d]}\n", ("cases:", 'constraints: ["N % bs == 0"]\ncases:')),
    "E807": sharded("  mesh: {d: devices, e: null}\n  specs: {x: [d], o: [d]}\n"),
}


# code -> the lines `kspec check specs/bad.yaml` prints before its summary line.
EXPECTED = {
    "E100": ['specs/bad.yaml:1:1: error[E100]: No such file or directory'],
    "E101": ["specs/bad.yaml:3:4: error[E101]: while parsing a flow sequence expected ',' or ']', but got ':'"],
    "E102": ['specs/bad.yaml:4:1: error[E102]: duplicate key `doc` (first defined at line 3)', '  = help: remove one of the two entries'],
    "E103": ['specs/bad.yaml:5:7: error[E103]: anchor `&b` is not allowed', '  = help: write the value out in full; kspec specs do not use anchors or aliases'],
    "E104": ['specs/bad.yaml:5:7: error[E104]: tag `tag:yaml.org,2002:python/object/apply:os.system` is not allowed', '  = help: specs hold plain strings, numbers, booleans, lists and mappings only'],
    "E105": ['specs/bad.yaml:1:1: error[E105]: spec file is larger than 1024 KiB'],
    "E106": ['specs/bad.yaml:1:1: error[E106]: a spec must be a mapping of keys to values, not a list'],
    "E107": ['specs/bad.yaml:3:9: error[E107]: byte 0xff is not valid UTF-8', '  = help: spec files are UTF-8 text'],
    "E108": ['specs/bad.yaml:1:35: error[E108]: nesting deeper than 32 levels'],
    "E109": ['specs/bad.yaml:5:7: error[E109]: number longer than 40 characters'],
    "E200": ['specs/bad.yaml:1:8: error[E200]: kspec must be one of 1'],
    "E201": ['specs/bad.yaml:3:1: error[E201]: unknown key `dco` at the top level', '  = help: did you mean `doc`?'],
    "E202": ['specs/bad.yaml:1:1: error[E202]: the spec is missing required key `reference`'],
    "E203": ['specs/bad.yaml:5:7: error[E203]: params.bs must be a number, a boolean, or a mapping with `default` (and optional `choices`, `doc`)'],
    "E300": ['specs/bad.yaml:10:9: error[E300]: operator `Pow` is not allowed in an expression'],
    "E301": ['specs/bad.yaml:10:8: error[E301]: grid: unknown name `bz`'],
    "E302": ['specs/bad.yaml:12:38: error[E302]: an index_map needs exactly one `->`, as in `i, j -> (i, j)`'],
    "E303": ['specs/bad.yaml:10:8: error[E303]: case `c`: grid: division by zero in `N // (bs - 8)`'],
    "E400": ['specs/bad.yaml:6:3: error[E400]: param `x` has the same name as input `x`', '  = help: give each operand, dim, param and scratch buffer its own name'],
    "E401": ['specs/bad.yaml:7:26: error[E401]: x: unknown dtype `float31`', '  = help: did you mean `float32`?'],
    "E402": ['specs/bad.yaml:12:20: error[E402]: x: block_shape has 2 dims but x has rank 1', '  = help: give one entry per array dim; null squeezes a dim'],
    "E403": ['specs/bad.yaml:12:37: error[E403]: x: index_map takes 2 grid indices but the grid has 1 axis', '  = help: write one name per grid axis, e.g. `i -> ...`'],
    "E404": ['specs/bad.yaml:12:37: error[E404]: x: index_map returns 2 block indices but the block has 1 dim', '  = help: return one block index per dim of block_shape'],
    "E405": ['specs/bad.yaml:14:3: error[E405]: block spec for unknown operand `z`'],
    "E407": ['specs/bad.yaml:10:26: error[E407]: p: dtype refers to output `o`', '  = help: an operand can only share the dtype of an input that has a dtype of its own'],
    "E408": ['specs/bad.yaml:9:15: error[E408]: o: `K` is not a dim bound by an input shape, nor a param', "  = help: use it alone as a dim of some input's shape, or declare it under params"],
    "E409": ['specs/bad.yaml:22:3: error[E409]: unknown backend `cuda`', '  = help: backends: interpret, mosaic_gpu, mosaic_tpu, triton'],
    "E410": ['specs/bad.yaml:7:3: error[E410]: scalar-prefetch input s has no `init: {kind: index, ...}` saying what values it holds', '  = help: a prefetched input holds indices: a shape such as [n] or [B, n], an int dtype, init {kind: index, bound: ...}'],
    "E411": ['specs/bad.yaml:7:41: error[E411]: x.init: low 1 is not below high 0'],
    "E412": ['specs/bad.yaml:18:1: error[E412]: input_output_aliases: `y` is not an input', '  = help: alias an output to an input of the same shape and dtype'],
    "E413": ["specs/bad.yaml:23:7: error[E413]: triton: x: memory_space vmem is not one of triton's", '  = help: memory spaces on triton: any'],
    "E414": ['specs/bad.yaml:23:7: error[E414]: interpret: scratch bar is a barrier, which interpret does not have', '  = help: scratch kinds on interpret: array, dma_semaphore, semaphore'],
    "E415": ['specs/bad.yaml:6:3: error[E415]: interpret: the params\' choices make 1.25e+05 configs to tune; at most 65536 allowed', '  = help: give fewer choices, e.g. to a (50), b (50), c (50)'],
    "E416": ['specs/bad.yaml:10:39: error[E416]: output `t` is `residual: true` but tiny has no `vjp:` section', '  = help: a residual output exists for the backward pass: add a `vjp:` that saves `t` in vjp.residuals, or drop `residual: true`'],
    "E417": ['specs/bad.yaml:10:39: error[E417]: output `t` is `residual: true` but vjp.residuals does not save it', "  = help: add `t` to vjp.residuals and bind it to a backward kernel's input, or drop `residual: true`"],
    "E418": ['specs/bad.yaml:9:39: error[E418]: every output of tiny is `residual: true` (o): it would return nothing', '  = help: leave at least one output without `residual: true`'],
    "E419": ['specs/bad.yaml:9:26: error[E419]: o: dtype map has no entry for x of dtype bfloat16', '  = help: add `bfloat16: <dtype>` to the map'],
    "E430": ['specs/bad.yaml:18:1: error[E430]: interpret: `mesh`, `pipelines` and `refs` belong to mesh kernels', '  = help: add `kind: mesh` at the top of the spec, or remove them'],
    "E431": ['specs/bad.yaml:10:1: error[E431]: mosaic_gpu: the mesh needs a `grid`', '  = help: e.g. `grid: {sm: num_sms}` for a persistent kernel', 'specs/bad.yaml:11:11: error[E431]: mosaic_gpu: mesh `cores` is not a mosaic_gpu mesh axis', '  = help: mosaic_gpu meshes take grid, cluster, threads'],
    "E432": ['specs/bad.yaml:18:7: error[E432]: mosaic_gpu: pipeline steps: block for unknown operand `y`'],
    "E440": ['specs/bad.yaml:18:5: error[E440]: kernel.outputs are declared but no epilogue reads them',
             '  = help: add `epilogue:`, which takes h, or drop kernel.outputs'],
    "E441": ['specs/bad.yaml:20:3: error[E441]: epilogue: returns 2 values but outputs has 1 value (o)',
             '  = help: return one value per name of outputs, in order: `return o`'],
    "E442": ['specs/bad.yaml:8:3: error[E442]: optional input `y` needs a prologue and kernel.inputs: the kernel '
             'never takes None, the prologue makes its inputs either way',
             '  = help: add a prologue that handles None, e.g. zeros in its place'],
    "E443": ['specs/bad.yaml:18:41: error[E443]: kernel output `h` is `residual: true` but no output of tiny is: no call '
             'would ask for it, so it would never be written',
             '  = help: mark the output it becomes `residual: true` (saved for the backward pass), or drop `residual: true` here'],
    "E420": ['specs/bad.yaml:22:13: error[E420]: backward spec `missing.yaml` cannot be read: No such file or directory', '  = help: name a spec file in the same folder as this one'],
    "E421": ['specs/bad.yaml:21:15: error[E421]: vjp.residuals: `z` is not an input or output of tiny'],
    "E422": ['specs/bad.yaml:23:31: error[E422]: dx.yaml: inputs: `h` is not an input of dx'],
    "E423": ['specs/bad.yaml:24:7: error[E423]: dx.yaml: output `dx` of dx is not assigned to an input', '  = help: name the input it is the gradient of under grads', 'specs/bad.yaml:24:19: error[E423]: dx.yaml: grads: `dy` is not an output of dx'],
    "E424": ['specs/bad.yaml:24:19: error[E424]: case `c`: dx output dx is bfloat16 but input x is float32', '  = help: a gradient has the dtype of its input'],
    "E425": ['specs/bad.yaml:21:1: error[E425]: vjp: input `y` is floating-point but no backward kernel gives its gradient', '  = help: assign a backward output to `y` under grads, or list it in vjp.no_grad'],
    "E426": ['specs/bad.yaml:22:13: error[E426]: backward spec `bad.yaml` closes a cycle: bad.yaml -> bad.yaml', '  = help: a backward kernel may have a vjp of its own, but no spec can be its own backward kernel, directly or not'],
    "E427": ['specs/bad.yaml:23:19: error[E427]: case `c`: dx input g takes bfloat16, but `grad(o)` is float32', '  = help: let g take float32'],
    "E428": ['specs/bad.yaml:19:5: error[E428]: case `c` (float32): backward kernel dx (interpret) cannot run it: case `c` (N=64): `N % 128 == 0` does not hold [E501]', '  = help: in dx.yaml: constraint at line 17'],
    "E429": ['specs/bad.yaml:22:13: error[E429]: dx.yaml: dx has no backend for platforms cpu, gpu, where this kernel\'s interpret backend runs', '  = help: add `interpret` to the backends of dx.yaml'],
    "E450": ['specs/bad.yaml:8:39: error[E450]: input initialisers read each other in a cycle: a -> b -> a', '  = help: make one of them from dims and params alone'],
    "E451": ['specs/bad.yaml:8:44: error[E451]: y.init: same_as x, of shape [N], but y has shape [N, N]', '  = help: give y the shape of x'],
    "E452": ['specs/bad.yaml:8:49: error[E452]: y.init.code: returns nothing; it must return the data of y', '  = help: end it with `return <array>`, or write one expression'],
    "E453": ['specs/bad.yaml:7:42: error[E453]: x.kinds: y.init reads its values; an input kind would break that structure', '  = help: drop `kinds`, or write `kinds: []`'],
    "E500": ['specs/bad.yaml:19:5: error[E500]: case `c` does not bind dim `N`', '  = help: add `N: <int>`'],
    "E501": ['specs/bad.yaml:21:5: error[E501]: case `c` (N=64): N must be a multiple of 128', '  = help: constraint at line 19'],
    "E502": ['specs/bad.yaml:13:37: error[E502]: case `c`: o.index_map at grid point (7,) gives block index (8,); dim 0 is 8, valid 0..7', '  = help: o dim 0 has 64 elements in blocks of 8'],
    "E503": ['specs/bad.yaml:13:3: error[E503]: case `c`: output o is not fully written: block (7,) (elements [56:64]) is never visited by the grid', '  = help: make the grid and index_map reach every block of the output'],
    "E504": ['specs/bad.yaml:19:5: error[E504]: case `c`: no input takes dtype int32'],
    "E505": ['specs/bad.yaml:10:8: error[E505]: case `c`: grid axis 0 has size 0'],
    "E506": ['specs/bad.yaml:9:3: error[E506]: case `c`: o has shape (0,)', '  = help: every dim must be at least 1'],
    "E507": ['specs/bad.yaml:21:5: error[E507]: case `c` runs 343 dtype combinations; at most 256 allowed', "  = help: pin some inputs' dtypes in the case, e.g. `dtype: {x: float32}`, or give them fewer choices: x (7), y (7), z (7)"],
    "E508": ['specs/bad.yaml:10:8: error[E508]: case `c`: grid axis 0 has size 2147483648, more than int32 holds (2147483647)', '  = help: Pallas program ids are int32: use bigger blocks or split the axis into several'],
    "E511": ['specs/bad.yaml:15:39: error[E511]: case `c`: `x_ref[8]` takes index 8 of an axis of 8 (valid 0..7)', '  = help: axis 0 of the ref has 8 elements in this case'],
    "E510": ['specs/bad.yaml:22:11: error[E510]: family `f` has 600 shapes; at most 512 allowed', '  = help: use fewer values, or split it into several families'],
    "E509": ['specs/bad.yaml:21:41: error[E509]: case `c`: min_speedup_over names `xl`, which is not a competitor (competitors: xla)', '  = help: did you mean `xla`?'],
    "E600": ['specs/bad.yaml:15:28: error[E600]: body: invalid syntax'],
    "E601": ['specs/bad.yaml:15:3: error[E601]: body: import of `torch`', '  = help: generated modules may import only jax, numpy and the standard library'],
    "E602": ['specs/bad.yaml:15:33: error[E602]: body: unknown name `bss`', '  = help: did you mean `bs`?'],
    "E701": ['specs/bad.yaml:12:3: error[E701]: case `c` (mosaic_tpu): x block dim 0 is 8; on TPU a 1-D block must be the whole array dim (64), a multiple of 1024, or a power of two of at least 128 for float32', "  = help: use 128, or the full dim (jax 0.10.2's Mosaic TPU rule for 1-D blocks)"],
    "E702": ['specs/bad.yaml:26:7: error[E702]: case `c` (mosaic_tpu): output o is written by several steps of parallel grid axis 1 (grid points (0, 0) and (0, 1) write the same block)', "  = help: mark grid axis 1 `arbitrary` in dimension_semantics, or index o's blocks by it"],
    "E703": ['specs/bad.yaml:21:3: error[E703]: case `c` (mosaic_tpu): VMEM estimate 1.0 KiB (blocks x 2 buffers 1.0 KiB + scratch) exceeds the limit of 512 bytes', '  = help: use smaller blocks, or raise compiler_params.vmem_limit_bytes'],
    "E704": ['specs/bad.yaml:21:3: error[E704]: mosaic_tpu: dimension_semantics has 2 entries but the kernel has 1 grid axis', '  = help: give one entry per grid axis'],
    "E705": ['specs/bad.yaml:24:7: error[E705]: case `c` (mosaic_tpu): x asks for 3 buffers; Mosaic TPU lowers 1 or 2', '  = help: use pipeline_mode: {buffered: 1} or {buffered: 2}'],
    "E711": ['specs/bad.yaml:12:3: error[E711]: case `c` (triton): x block dim 0 is 12; Triton block dims must be powers of two', '  = help: use 16 (padding covers the ragged edge) or 8', 'specs/bad.yaml:13:3: error[E711]: case `c` (triton): o block dim 0 is 12; Triton block dims must be powers of two', '  = help: use 16 (padding covers the ragged edge) or 8'],
    "E712": ['specs/bad.yaml:12:3: error[E712]: case `c` (triton): x is a dot operand with block (8,); Triton dots need every dim >= 16', '  = help: make each block dim of x at least 16'],
    "E713": ['specs/bad.yaml:21:3: error[E713]: case `c` (triton): num_warps is 6; Triton runs 1, 2, 4, 8, 16 or 32 warps per program', '  = help: give num_warps (or the param it names) a power of two up to 32'],
    "E714": ['specs/bad.yaml:22:20: error[E714]: case `c` (triton): shared memory estimate 256 KiB (`N * bs * itemsize(x) * 128`) exceeds 227 KiB per block on Hopper', '  = help: use smaller blocks or fewer pipelining stages for this case'],
    "E721": ['specs/bad.yaml:21:3: error[E721]: case `c` (mosaic_gpu): shared memory estimate 258 KiB (blocks x 1 steps 0 KiB + scratch) exceeds 227 KiB per block on Hopper', '  = help: use smaller blocks or fewer max_concurrent_steps'],
    "E722": ['specs/bad.yaml:12:3: error[E722]: case `c` (mosaic_gpu): x block (512,) is too large for TMA, which copies at most 256 elements along each dim', '  = help: use smaller blocks and cover the rest with the grid', 'specs/bad.yaml:13:3: error[E722]: case `c` (mosaic_gpu): o block (512,) is too large for TMA, which copies at most 256 elements along each dim', '  = help: use smaller blocks and cover the rest with the grid'],
    "E723": ['specs/bad.yaml:12:13: error[E723]: case `c` (mosaic_gpu): 9 warpgroups per CTA are 1152 CUDA threads; a CTA has 1 to 1024 (8 warpgroups)', '  = help: use at most 8 warpgroups'],
    "E724": ['specs/bad.yaml:12:13: error[E724]: case `c` (mosaic_gpu): cluster c of 5 does not divide grid sm of 132 (num_sms = 132)', '  = help: choose a cluster size that divides the grid axis'],
    "E725": ['specs/bad.yaml:24:27: error[E725]: mosaic_gpu: the body ends with `plgpu.wait_smem_to_gmem(1)`: up to 1 TMA store from shared memory may still be in flight when the kernel exits', '  = help: wait for every store before the end: plgpu.wait_smem_to_gmem(0)'],
    "E800": ['specs/bad.yaml:20:15: error[E800]: x: unknown mesh axis `e`', '  = help: mesh axes: d'],
    "E801": ['specs/bad.yaml:20:15: error[E801]: x: mesh axis `d` appears twice in the partition spec', '  = help: a mesh axis can split at most one dim of an operand, once'],
    "E802": ['specs/bad.yaml:20:11: error[E802]: x: partition spec has 2 entries but x has rank 1', '  = help: give at most one entry per dim; null leaves a dim whole'],
    "E803": ['specs/bad.yaml:21:23: error[E803]: dim N is split over nothing in y but over (d) in x', '  = help: split N the same way in every input'],
    "E804": ['specs/bad.yaml:22:5: error[E804]: case `c`: N=64 is split over d=3 = 3 devices, which does not divide it', '  = help: make N a multiple of 3'],
    "E805": ['specs/bad.yaml:18:1: error[E805]: o: dim 0 (N) is split over nothing but the inputs split N over (d)', '  = help: split o dim 0 as the inputs split N', 'specs/bad.yaml:18:1: error[E805]: o: the inputs are split over `d` but o is neither split nor reduced over it', '  = help: add `reductions: {o: {psum: [d]}}` if each shard holds a partial o, or split o over d'],
    "E806": ['specs/bad.yaml:23:5: error[E806]: per shard (N=4): case `c` (N=4, bs=8): `N % bs == 0` does not hold [E501]', '  = help: constraint at line 21'],
    "E807": ['specs/bad.yaml:19:22: error[E807]: mesh axes `d` and `e` are both sized by the device count', '  = help: size every axis but one with an integer'],
}


# Codes about files other than a spec's text, pinned where those files are made.
ELSEWHERE = {
    "E110": "test_hostile.py", "E111": "test_write_path.py", "E120": "test_tuning_files.py",
    "E121": "test_tuning_files.py", "E122": "test_tuning_files.py", "E140": "test_project.py",
    "E141": "test_project.py", "E142": "test_project.py",
}
ERRORS = sorted(c for c in CODES if c.startswith("E") and c not in ELSEWHERE)


def test_every_code_has_a_case():
    assert sorted(SPECS) == ERRORS, "give every error code in CODES a bad spec in SPECS"
    assert sorted(EXPECTED) == ERRORS, "pin every code's text in EXPECTED"
    assert [c for c in CODES if not c.startswith("E")] == ["W900", "W901", "W902", "W903", "W904"], "warnings get their own tests below"
    here = Path(__file__).resolve().parent
    for code, where in ELSEWHERE.items():
        assert f"error[{code}]: " in (here / where).read_text(encoding="utf-8"), (code, where)


def test_stale_tuning_entries_are_a_warning(kspec, write_spec, tmp_path):
    write_spec(RAGGED)
    table = tmp_path / "tuning" / "tiny" / "NVIDIA_H200.json"
    table.parent.mkdir(parents=True)
    entry = {"backend": "interpret", "bucket": [64], "dtype": "float32", "jax_version": "0.11.2",
             "kernel_sha": "0" * 64, "params": {"bs": 8}, "status": "pass", "ms": 1.0, "message": ""}
    table.write_text(json.dumps({"kernel": "tiny", "device_kind": "NVIDIA H200", "entries": [entry]}))
    r = kspec("check", "specs/tiny.yaml")
    assert r.out.splitlines() == [
        "tuning/tiny/NVIDIA_H200.json:1:1: warning[W900]: 1 of 1 tuning entries for NVIDIA H200 were recorded "
        "for another version of the kernel and are ignored",
        "  = help: rerun `kspec tune specs/tiny.yaml` on that device, or delete the stale entries",
        "1 spec(s) OK",
    ]
    assert r.rc == 0


def test_an_estimate_below_what_triton_asked_for_is_a_warning(kspec, write_spec, tmp_path):
    """W903: Triton refused a config for want of shared memory that the backend's estimate said fits."""
    from kspec.codegen import project as pipeline

    spec = RAGGED + ("backends:\n  interpret:\n  triton:\n    params:\n      bs: {default: 8, choices: [8, 16]}\n"
                     "    shared_memory: \"bs * itemsize(x)\"\n")
    path = write_spec(spec)
    sha = pipeline.compile_spec(tmp_path / path).spec.kernel_sha
    table = tmp_path / "tuning" / "tiny" / "NVIDIA_H200.json"
    table.parent.mkdir(parents=True)
    entry = {"backend": "triton", "bucket": [64], "case": "c", "dtype": "float32", "jax_version": "0.11.2",
             "kernel_sha": sha, "params": {"bs": 8}, "status": "error", "ms": None,
             "message": "JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, "
                        "available: 232448, context: []"}
    table.write_text(json.dumps({"kernel": "tiny", "device_kind": "NVIDIA H200", "entries": [entry]}))
    r = kspec("check", "specs/tiny.yaml")
    assert r.out.splitlines()[:2] == [
        "tuning/tiny/NVIDIA_H200.json:1:1: warning[W903]: triton: case `c` float32 {'bs': 8}: Triton asked for 262144 "
        "bytes of shared memory, where the backend's shared_memory estimate gives 32",
        "  = help: raise the estimate in tiny's `backends.triton.shared_memory` to cover this config",
    ]
    assert r.rc == 0
    # an estimate that covers it: no warning
    write_spec(spec.replace("bs * itemsize(x)", "bs * itemsize(x) * 32768"))
    entry["kernel_sha"] = sha
    assert "W903" not in kspec("check", "specs/tiny.yaml").out


def test_a_tunable_param_no_kernel_reads_is_a_warning(kspec, write_spec):
    """W901: the interpret backend replaces the top-level blocks, so `bs` with choices is read by no
    kernel on it; kspec tune would time one kernel once per choice."""
    spec = mutate(
        RAGGED,
        ("  bs: 8\n", "  bs: {default: 8, choices: [8, 16]}\n"),
        ("cases:", "backends:\n  interpret:\n    grid: [\"cdiv(N, 32)\"]\n    blocks:\n"
                   "      x: {block_shape: [32], index_map: \"i -> (i,)\"}\n"
                   "      o: {block_shape: [32], index_map: \"i -> (i,)\"}\ncases:"),
    )
    write_spec(spec)
    r = kspec("check", "specs/tiny.yaml")
    assert r.out.splitlines() == [
        "specs/tiny.yaml:5:3: warning[W901]: interpret: param `bs` has choices [8, 16], but nothing in the "
        "interpret kernel reads it",
        "  = help: kspec tune would time the same kernel once per choice: declare `bs` under "
        "backends.<name>.params of the backends that read it, or drop its choices",
        "1 spec(s) OK",
    ]
    assert r.rc == 0
    write_spec(mutate(RAGGED, ("  bs: 8\n", "  bs: {default: 8, choices: [8, 16]}\n")))
    assert kspec("check", "specs/tiny.yaml").out.splitlines() == ["1 spec(s) OK"]  # the top-level blocks read it


@pytest.mark.parametrize("code", ERRORS)
def test_diagnostic_text(code, kspec, write_spec, tmp_path):
    content = SPECS[code]
    files = content if isinstance(content, dict) else {"bad": content}  # a dict: several spec files
    if content is None:
        (tmp_path / "specs").mkdir()
    for name, text in files.items():
        if text is not None:
            write_spec(text, name)
    r = kspec("check", "specs/bad.yaml")
    headers = [line for line in EXPECTED[code] if not line.startswith("  = help: ")]
    assert any(f": error[{code}]: " in h for h in headers), "the case must produce its own code"
    # check also checks the backward specs a spec names: they count as specs checked
    assert r.out.splitlines() == EXPECTED[code] + [f"{len(headers)} error(s) in 1 of {len(files)} spec(s)"]
    assert r.err == ""
    assert r.rc == 2
    assert not (tmp_path / "generated").exists()


def test_valid_spec_is_valid(kspec, write_spec):
    write_spec(RAGGED)
    r = kspec("check", "specs/tiny.yaml")
    assert (r.rc, r.out, r.err) == (0, "1 spec(s) OK\n", "")


W902 = [
    "specs/tiny.yaml:10:8: warning[W902]: grid axis 0 is cdiv(N, bs), but N is a multiple of bs in every case: "
    "no case runs its partial last block",
    "  = help: add a case with a ragged edge, e.g. `- {name: ragged, N: 68}` (N = 68 is not a multiple of bs = 8)",
]


def test_a_cdiv_axis_that_no_case_makes_ragged_is_a_warning(kspec, write_spec):
    """W902: N = 64 in blocks of 8 never runs the partial last block that cdiv(N, bs) is there for;
    the suggested case passes every check."""
    write_spec(VALID_SPEC)
    r = kspec("check", "specs/tiny.yaml")
    assert (r.rc, r.out.splitlines(), r.err) == (0, W902 + ["1 spec(s) OK"], "")
    named = mutate(VALID_SPEC, ('grid: ["cdiv(N, bs)"]', 'grid: {i: "cdiv(N, bs)"}'),
                   ("{name: c, N: 64}", "{name: ragged, N: 64, params: {bs: 16}}"))
    write_spec(named)
    assert kspec("check", "specs/tiny.yaml").out.splitlines() == [
        "specs/tiny.yaml:10:11: warning[W902]: grid axis `i` is cdiv(N, bs), but N is a multiple of bs in every "
        "case: no case runs its partial last block",
        "  = help: add a case with a ragged edge, e.g. `- {name: ragged_N, N: 72, params: {bs: 16}}` "
        "(N = 72 is not a multiple of bs = 16)",
        "1 spec(s) OK",
    ]


def test_a_cdiv_axis_only_some_backends_run_ragged_names_them(kspec, write_spec):
    """The triton backend's own block size divides the ragged case's N: only it is named."""
    write_spec(mutate(RAGGED, ("cases:", "backends:\n  interpret:\n  triton:\n    params: {bs: 4}\ncases:")))
    assert kspec("check", "specs/tiny.yaml").out.splitlines() == [
        "specs/tiny.yaml:10:8: warning[W902]: grid axis 0 is cdiv(N, bs), but N is a multiple of bs in every "
        "case on triton: no case runs its partial last block",
        "  = help: add a case with a ragged edge, e.g. `- {name: ragged, N: 66}` (N = 66 is not a multiple of bs = 4)",
        "1 spec(s) OK",
    ]


@pytest.mark.parametrize("edit", [
    ("cases:", 'constraints: ["N % bs == 0"]\ncases:'),  # the spec rules ragged sizes out
    ("cases:", 'backends:\n  interpret:\n    constraints: ["N % bs == 0"]\ncases:'),  # the one backend does
    ("  bs: 8", "  bs: 1"),  # blocks of 1 element: never ragged
    ('grid: ["cdiv(N, bs)"]', 'grid: ["cdiv(64, bs)"]'),  # no dim to change
])
def test_no_ragged_warning_where_no_case_could_be_ragged(kspec, write_spec, edit):
    write_spec(mutate(VALID_SPEC, edit))
    r = kspec("check", "specs/tiny.yaml")
    assert (r.rc, r.out) == (0, "1 spec(s) OK\n"), r.out


def test_the_ragged_suggestion_keeps_to_the_hardware_rules(kspec, write_spec):
    """On mosaic_tpu a block of 8 float32 must be whole 128-lane tiles or the whole dim: N = 68 is
    refused (E701), so the suggestion is a ragged N that a 128-element block covers."""
    spec = mutate(VALID_SPEC, ("  bs: 8", "  bs: 128"), ("{name: c, N: 64}", "{name: c, N: 1024}"),
                  ("cases:", "backends:\n  mosaic_tpu:\ncases:"))
    write_spec(spec)
    assert kspec("check", "specs/tiny.yaml").out.splitlines() == [
        "specs/tiny.yaml:10:8: warning[W902]: grid axis 0 is cdiv(N, bs), but N is a multiple of bs in every case: "
        "no case runs its partial last block",
        "  = help: add a case with a ragged edge, e.g. `- {name: ragged, N: 1088}` (N = 1088 is not a multiple of bs = 128)",
        "1 spec(s) OK",
    ]


def test_valid_vjp_is_valid_and_checks_its_backward_spec(kspec, write_spec):
    for name, text in vjp(("  - {name: c, N: 64}\n", "  - {name: c, N: 64}\n  - {name: r, N: 60}\n")).items():
        write_spec(text, name)
    r = kspec("check", "specs/bad.yaml")
    assert (r.rc, r.out, r.err) == (0, "2 spec(s) OK\n", "")


def test_errors_in_a_backward_spec_are_reported_in_its_file(kspec, write_spec):
    for name, text in vjp(dx=mutate(DX, ("dtype: float32", "dtype: float31"))).items():
        write_spec(text, name)
    r = kspec("check", "specs/bad.yaml")
    assert r.rc == 2
    assert r.out.splitlines() == [
        "specs/bad.yaml:22:13: error[E420]: backward spec `dx.yaml` has 1 error(s), reported in that file",
        "  = help: fix the backward spec first",
        "specs/dx.yaml:6:26: error[E401]: g: unknown dtype `float31`",
        "  = help: did you mean `float32`?",
        "2 error(s) in 2 of 2 spec(s)",
    ]


def test_every_error_of_a_file_in_one_run(kspec, write_spec):
    """Three independent schema errors: all three reported, in file order."""
    write_spec(
        mutate(
            VALID_SPEC,
            ("doc: Doubles", "dco: Doubles"),
            ("  bs: 8", "  bs: eight"),
            ("reference: |\n  return x * 2\n", ""),
        ),
        "bad",
    )
    r = kspec("check", "specs/bad.yaml")
    assert r.rc == 2
    assert r.out.splitlines() == [
        "specs/bad.yaml:1:1: error[E202]: the spec is missing required key `reference`",
        "specs/bad.yaml:3:1: error[E201]: unknown key `dco` at the top level",
        "  = help: did you mean `doc`?",
        "specs/bad.yaml:5:7: error[E203]: params.bs must be a number, a boolean, or a mapping with "
        "`default` (and optional `choices`, `doc`)",
        "3 error(s) in 1 of 1 spec(s)",
    ]


def test_every_expression_error_in_one_run(kspec, write_spec):
    """Errors found while building the model and checking it are reported together too."""
    write_spec(
        mutate(
            VALID_SPEC,
            ('grid: ["cdiv(N, bs)"]', 'grid: ["N ** 2"]'),
            ('x: {block_shape: [bs], index_map: "i -> (i,)"}', 'x: {block_shape: [bs], index_map: "i (i,)"}'),
            ('o: {block_shape: [bs], index_map: "i -> (i,)"}', 'o: {block_shape: ["bs +"], index_map: "i -> (i,)"}'),
        ),
        "bad",
    )
    r = kspec("check", "specs/bad.yaml")
    assert r.rc == 2
    assert r.out.splitlines() == [
        "specs/bad.yaml:10:9: error[E300]: operator `Pow` is not allowed in an expression",
        "specs/bad.yaml:12:38: error[E302]: an index_map needs exactly one `->`, as in `i, j -> (i, j)`",
        "specs/bad.yaml:13:22: error[E300]: invalid expression: invalid syntax",
        "3 error(s) in 1 of 1 spec(s)",
    ]


def test_errors_in_several_files_are_all_reported(kspec, write_spec):
    write_spec(SPECS["E401"], "a")
    write_spec(SPECS["E201"], "b")
    write_spec(VALID_SPEC, "c")
    r = kspec("check")
    assert r.rc == 2
    assert "specs/a.yaml:7:26: error[E401]:" in r.out
    assert "specs/b.yaml:3:1: error[E201]:" in r.out
    assert r.out.splitlines()[-1] == "2 error(s) in 2 of 3 spec(s)"


def test_schema_backends_are_the_backends_table():
    """One table of backends: the schema's `backends` keys must be exactly BACKENDS."""
    assert sorted(schema()["$defs"]["backends"]["properties"]) == sorted(BACKENDS)
    assert json.loads(json.dumps(schema()))  # plain JSON
