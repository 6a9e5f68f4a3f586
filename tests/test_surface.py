"""The pallas_call surface in YAML: block dim kinds, memory spaces, pipeline modes,
scalar prefetch with initialisers, aliasing, pallas_call options, and generated
functions under jax.jit and jax.vmap.

Static checks and rendering run in-process on small specs written to tmp_path; the
shipped examples (gather_rows, accumulate, dma_copy, shift_diff) are verified against
their references on interpret and TPU interpret mode, and lowered for TPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kspec.codegen import project as pipeline
from kspec.codegen.checks.derive import PREFIX
from kspec.codegen.emit import render
from conftest import VALID_SPEC, mutate

ROOT = Path(__file__).resolve().parent.parent
SURFACE_SPECS = ["specs/gather_rows.yaml", "specs/accumulate.yaml", "specs/dma_copy.yaml", "specs/shift_diff.yaml"]
X_BLOCK = 'x: {block_shape: [bs], index_map: "i -> (i,)"}'
O_BLOCK = 'o: {block_shape: [bs], index_map: "i -> (i,)"}'

# A 2-D copy with a prefetched block index per output block, as small as it gets.
GATHER = """\
kspec: 1
name: gat
inputs:
  idx: {shape: [G], dtype: int32, prefetch: true, init: {kind: index, bound: "R // 8"}}
  t: {shape: [R, 128], dtype: float32}
outputs:
  o: {shape: ["G * 8", 128], dtype: t}
grid: [G]
blocks:
  t: {block_shape: [8, 128], index_map: "i, idx -> (idx[i], 0)"}
  o: {block_shape: [8, 128], index_map: "i, idx -> (i, 0)"}
body: |
  o_ref[...] = t_ref[...]
reference: |
  return t.reshape(R // 8, 8, 128)[idx].reshape(G * 8, 128)
cases:
  - {name: c, G: 4, R: 64}
backends:
  interpret:
  mosaic_tpu:
"""


def compiled(tmp_path: Path, text: str):
    path = tmp_path / "specs" / "s.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return pipeline.compile_spec(path)


def messages(tmp_path: Path, text: str) -> list:
    return [f"{d.code}: {d.message}" for d in compiled(tmp_path, text).diagnostics]


def rendered(tmp_path: Path, text: str, backend: str) -> str:
    c = compiled(tmp_path, text)
    assert c.ok, [d.format() for d in c.diagnostics]
    return render.render(c.spec, "specs/s.yaml")[f"{backend}.py"]


# -- scalar prefetch and initialisers -------------------------------------------------


def test_prefetch_renders_a_prefetch_scalar_grid_spec(tmp_path):
    src = rendered(tmp_path, GATHER, "mosaic_tpu")
    assert "grid_spec=pltpu.PrefetchScalarGridSpec(\n            num_scalar_prefetch=1," in src
    assert "def _gat_kernel(idx_ref, t_ref, o_ref, *," in src
    assert "pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))" in src
    assert ")(idx, t)" in src


def test_prefetch_refs_come_first_whatever_the_declared_order(tmp_path):
    text = mutate(
        GATHER,
        ('  idx: {shape: [G], dtype: int32, prefetch: true, init: {kind: index, bound: "R // 8"}}\n', ""),
        ("  t: {shape: [R, 128], dtype: float32}\n",
         '  t: {shape: [R, 128], dtype: float32}\n  idx: {shape: [G], dtype: int32, prefetch: true, init: {kind: index, bound: "R // 8"}}\n'),
    )
    src = rendered(tmp_path, text, "interpret")
    assert "def gat(t, idx, *, interpret=False)" not in src  # interpret takes no interpret= argument
    assert "def gat(t, idx" in src and ")(idx, t)" in src and "def _gat_kernel(idx_ref, t_ref, o_ref" in src


def test_prefetched_index_maps_are_checked_over_the_initialisers_range(tmp_path):
    text = mutate(GATHER, ('"i, idx -> (idx[i], 0)"', '"i, idx -> (idx[i] + 1, 0)"'))
    found = messages(tmp_path, text)
    assert "E502: case `c`: t.index_map at grid point (0,) with idx[...] = 7 gives block index (8, 0); dim 0 is 8, valid 0..7" in found


def test_prefetch_index_read_past_the_end_of_the_ref_is_reported(tmp_path):
    text = mutate(GATHER, ('"i, idx -> (idx[i], 0)"', '"i, idx -> (idx[i + 1], 0)"'))
    assert any(m.startswith("E303: case `c`: t.index_map: `idx[i + 1]` reads index 4 of 4") for m in messages(tmp_path, text))


def test_an_output_map_that_ignores_its_prefetch_ref_is_checked_for_coverage(kspec, write_spec):
    """E503 with a scalar-prefetch input: o's map takes `idx` but gives (i, 0) whatever it holds,
    so a grid one short of G leaves o's last block unwritten."""
    path = write_spec(mutate(GATHER, ("grid: [G]", 'grid: ["G - 1"]')), "gat")
    r = kspec("check", path)
    assert (r.rc, r.out.splitlines()) == (2, [
        "specs/gat.yaml:11:3: error[E503]: case `c`: output o is not fully written: block (3, 0) "
        "(elements [24:32, 0:128]) is never visited by the grid",
        "  = help: make the grid and index_map reach every block of the output",
        "1 error(s) in 1 of 1 spec(s)",
    ])


def test_an_output_map_that_reads_its_prefetch_ref_is_not_judged_by_coverage(kspec, write_spec):
    """Where o's blocks come from the prefetched values (a scatter), which blocks get written
    depends on data the check does not have: no E503, however short the grid."""
    text = mutate(GATHER, ("grid: [G]", 'grid: ["G - 1"]'), ('bound: "R // 8"', "bound: G"),
                  ('t: {block_shape: [8, 128], index_map: "i, idx -> (idx[i], 0)"}',
                   't: {block_shape: [8, 128], index_map: "i, idx -> (i, 0)"}'),
                  ('o: {block_shape: [8, 128], index_map: "i, idx -> (i, 0)"}',
                   'o: {block_shape: [8, 128], index_map: "i, idx -> (idx[i], 0)"}'))
    assert kspec("check", write_spec(text, "gat")).rc == 0


def test_prefetch_refs_are_bound_by_position_whatever_the_index_map_calls_them(kspec, write_spec):
    """The bounds check gives the map's own parameter `s` the values of `idx`, and says so."""
    text = mutate(GATHER, ('"i, idx -> (idx[i], 0)"', '"i, s -> (s[i] + 1, 0)"'))
    r = kspec("check", write_spec(text, "gat"))
    assert (r.rc, r.out.splitlines()[:2]) == (2, [
        "specs/gat.yaml:10:41: error[E502]: case `c`: t.index_map at grid point (0,) with s[...] = 7 gives "
        "block index (8, 0); dim 0 is 8, valid 0..7",
        "  = help: t dim 0 has 64 elements in blocks of 8",
    ])


@pytest.mark.parametrize(
    "change, expected",
    [
        (("dtype: int32, prefetch", "dtype: float32, prefetch"), "E410: scalar-prefetch input idx has dtype float32, not an integer type"),
        (("shape: [G], dtype: int32", "shape: [], dtype: int32"), "E410: scalar-prefetch input idx has rank 0; give it shape [1]"),
        (("backends:\n", "backends:\n  triton:\n"), "E410: triton: scalar prefetch (idx) needs a TPU-style backend"),
        (('bound: "R // 8"', "of: t, dim: 3"), "E411: idx.init: dim 3 of t, which has rank 2"),
        (('bound: "R // 8"', "of: u"), "E411: idx.init: `of` names unknown operand `u`"),
        (('bound: "R // 8"', 'bound: "R // bz"'), "E411: idx.init: unknown name `bz`"),
        (("prefetch: true, init", "prefetch: true, kinds: [large], init"),
         "E411: idx.kinds: a scalar-prefetch input holds indices; it takes no input kinds"),
    ],
)
def test_prefetch_and_init_rules(tmp_path, change, expected):
    assert expected in messages(tmp_path, mutate(GATHER, change))


def test_init_bound_from_an_expression_or_an_operand_dim(tmp_path):
    spec = compiled(tmp_path, GATHER).spec
    init = spec.inputs[0].init
    assert init.bound({"R": 64}, {}) == 8
    spec2 = compiled(tmp_path, mutate(GATHER, ('bound: "R // 8"', "of: t, dim: 1"))).spec
    assert spec2.inputs[0].init.bound({}, {"t": (64, 128)}) == 128


# -- block dim kinds ------------------------------------------------------------------

# Whole blocks only: these maps step by whole blocks, so a ragged N (a case verify derives) would move
# the last window or slice past the end.
WHOLE_BLOCKS = ("grid:", 'constraints: ["N % bs == 0"]\ngrid:')


def test_element_dims_render_and_check_offsets_against_dim_plus_padding(tmp_path):
    text = mutate(VALID_SPEC, (X_BLOCK, 'x: {block_shape: [{element: 16, padding: [4, 4]}], index_map: "i -> (i * 8,)"}'),
                  WHOLE_BLOCKS)
    src = rendered(tmp_path, text, "interpret")
    assert "pl.BlockSpec((pl.Element(16, (4, 4)),), lambda i: (i * 8,))" in src
    # offset 56 + window 16 = 72 = 64 + 4 + 4 fits; without padding it does not
    bad = mutate(text, ("padding: [4, 4]", "padding: [0, 0]"))
    assert "E502: case `c`: x.index_map at grid point (7,) gives (56,); dim 0 is element offset 56, valid 0..48" in messages(tmp_path, bad)


def test_bounded_slice_dims_take_ds_and_check_start_and_size(tmp_path):
    text = mutate(VALID_SPEC, (X_BLOCK, 'x: {block_shape: [{bounded_slice: 8}], index_map: "i -> (ds(i * 8, 8),)"}'),
                  WHOLE_BLOCKS)
    assert "pl.BlockSpec((pl.BoundedSlice(8),), lambda i: (pl.ds(i * 8, 8),))" in rendered(tmp_path, text, "interpret")
    too_big = mutate(text, ("ds(i * 8, 8)", "ds(i * 8, 9)"))
    assert any("dim 0 is ds(0, 9), valid start >= 0, size 1..8, start + size <= 64" in m for m in messages(tmp_path, too_big))
    not_ds = mutate(text, ("ds(i * 8, 8)", "i"))
    assert any("dim 0 is 0, not ds(start, size)" in m for m in messages(tmp_path, not_ds))


def test_ds_is_only_for_index_maps(tmp_path):
    text = mutate(VALID_SPEC, ('grid: ["cdiv(N, bs)"]', 'grid: ["ds(N, bs)"]'))
    assert any(m.startswith("E300: calling anything but min, max, cdiv or next_pow2") for m in messages(tmp_path, text))


def test_element_dims_on_tpu_must_be_all_or_none(tmp_path):
    text = """kspec: 1
name: t2
inputs:
  x: {shape: [M, 128], dtype: float32}
outputs:
  o: {shape: [M, 128], dtype: x}
grid: ["M // 8"]
blocks:
  x: {block_shape: [{element: 8}, 128], index_map: "i -> (i * 8, 0)"}
  o: {block_shape: [8, 128], index_map: "i -> (i, 0)"}
body: |
  o_ref[...] = x_ref[...]
reference: |
  return x
cases:
  - {name: c, M: 64}
backends:
  interpret:
  mosaic_tpu:
"""
    found = messages(tmp_path, text)
    assert any(m.startswith("E705: case `c` (mosaic_tpu): x mixes element dims with blocked dims") for m in found)
    assert not any("(interpret)" in m for m in found)


# -- memory spaces, pipeline modes, scratch kinds ----------------------------------------


def test_memory_spaces_and_buffering_render_per_backend(tmp_path):
    text = mutate(
        VALID_SPEC,
        (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> (i,)", memory_space: vmem, pipeline_mode: {buffered: 1}}'),
    ) + "backends:\n  interpret:\n  mosaic_tpu:\n    params: {bs: 64}\n"
    src = rendered(tmp_path, text, "mosaic_tpu")
    assert "pl.BlockSpec((bs,), lambda i: (i,), pipeline_mode=pl.Buffered(1), memory_space=pltpu.VMEM)" in src
    whole = mutate(VALID_SPEC, (X_BLOCK, "x: {memory_space: any}"))
    assert "pl.BlockSpec(memory_space=pl.ANY)" in rendered(tmp_path, whole, "interpret")


def test_vmem_budget_counts_each_operands_buffers(tmp_path):
    base = VALID_SPEC + "backends:\n  mosaic_tpu:\n    params: {bs: 64}\n    compiler_params: {vmem_limit_bytes: 700}\n"
    # x and o: 256 bytes each, double-buffered = 1 KiB > 700; single-buffered x: 768 > 700; x left in HBM: 512 fits
    assert any("VMEM estimate 1.0 KiB (blocks x 2 buffers" in m for m in messages(tmp_path, base))
    single = mutate(base, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> (i,)", pipeline_mode: {buffered: 1}}'))
    assert any("VMEM estimate 768 bytes (blocks x their buffer counts 768 bytes" in m for m in messages(tmp_path, single))
    in_hbm = mutate(base, (X_BLOCK, "x: {memory_space: any}"))
    assert not any(m.startswith("E703") for m in messages(tmp_path, in_hbm))


@pytest.mark.parametrize(
    "backends, expected",
    [
        ("  mosaic_gpu:\n    scratch:\n      s: {shape: [1], kind: dma_semaphore}\n",
         "E414: mosaic_gpu: scratch s is a dma_semaphore, which mosaic_gpu does not have"),
        ("  mosaic_tpu:\n    params: {bs: 64}\n    scratch:\n      acc: {shape: [8, 128], kind: accumulator}\n",
         "E414: mosaic_tpu: scratch acc is a accumulator, which mosaic_tpu does not have"),
        ('  mosaic_gpu:\n    blocks:\n      x: {block_shape: [{element: 8}], index_map: "i -> (i * 8,)"}\n',
         "E413: mosaic_gpu: x: block dim 0 is element, which mosaic_gpu does not take"),
        ('  mosaic_gpu:\n    blocks:\n      x: {memory_space: vmem}\n',
         "E413: mosaic_gpu: x: memory_space vmem is not one of mosaic_gpu's"),
        ('  triton:\n    blocks:\n      x: {block_shape: [bs], index_map: "i -> (i,)", pipeline_mode: {buffered: 2}}\n',
         "E413: triton: x: pipeline_mode is not supported by triton"),
    ],
)
def test_backend_surface_rules(tmp_path, backends, expected):
    assert expected in messages(tmp_path, VALID_SPEC + "backends:\n" + backends)


def test_padded_element_dims_are_refused_on_triton_only(kspec, write_spec):
    """Pallas Triton's lowering refuses pl.Element with padding (jax 0.10.2: "Unblocked indexing with
    padding is not supported in Triton lowering"); interpret takes it, and an unpadded element
    dim is fine on triton."""
    padded = mutate(VALID_SPEC, (X_BLOCK, 'x: {block_shape: [{element: 16, padding: [4, 4]}], index_map: "i -> (i * 8,)"}'),
                    ("o_ref[...] = x_ref[...] * 2", "o_ref[...] = x_ref[4:12] * 2"), WHOLE_BLOCKS)
    r = kspec("check", write_spec(padded + "backends:\n  interpret:\n  triton:\n"))
    assert (r.rc, r.out.splitlines()) == (2, [
        "specs/tiny.yaml:13:20: error[E413]: triton: x: block dim 0 is element with padding [4, 4], which triton does not take",
        "  = help: triton takes element dims without padding: drop `padding`, or pad the array before the call",
        "1 error(s) in 1 of 1 spec(s)",
    ])
    assert kspec("check", write_spec(padded + "backends:\n  interpret:\n")).rc == 0
    unpadded = mutate(VALID_SPEC, (X_BLOCK, 'x: {block_shape: [{element: 8}], index_map: "i -> (i * 8,)"}'), WHOLE_BLOCKS)
    assert kspec("check", write_spec(unpadded + "backends:\n  interpret:\n  triton:\n")).rc == 0


def test_scratch_kinds_render_for_their_backends(tmp_path):
    tpu = VALID_SPEC + (
        "backends:\n  mosaic_tpu:\n    params: {bs: 64}\n    scratch:\n"
        "      v: {shape: [8, 128], dtype: float32}\n      s: {shape: [4], dtype: int32, memory_space: smem}\n"
        "      d: {shape: [2], kind: dma_semaphore}\n      r: {shape: [], kind: semaphore}\n"
    )
    src = rendered(tmp_path, tpu, "mosaic_tpu")
    for line in ("pltpu.VMEM((8, 128), jnp.float32)", "pltpu.SMEM((4,), jnp.int32)",
                 "pltpu.SemaphoreType.DMA((2,))", "pltpu.SemaphoreType.REGULAR(())"):
        assert line in src
    gpu = VALID_SPEC + (
        "backends:\n  mosaic_gpu:\n    scratch:\n      b: {shape: [2], kind: barrier, num_arrivals: 2}\n"
        "      a: {shape: [64, 64], kind: accumulator}\n      m: {shape: [8], dtype: float32}\n"
    )
    src = rendered(tmp_path, gpu, "mosaic_gpu")
    for line in ("plgpu.Barrier(num_arrivals=2, num_barriers=2)", "plgpu.ACC((64, 64), jnp.float32)", "plgpu.SMEM((8,), jnp.float32)"):
        assert line in src



def test_scratch_dtype_may_follow_an_input(tmp_path):
    """`dtype: x` allocates the buffer in x's dtype at call time; the shared-memory estimate
    counts that dtype's bytes for each case."""
    spec = VALID_SPEC.replace("x: {shape: [N], dtype: float32}", "x: {shape: [N], dtype: [float32, bfloat16]}")
    gpu = spec + "backends:\n  mosaic_gpu:\n    scratch:\n      m: {shape: [8], dtype: x}\n"
    assert "plgpu.SMEM((8,), x.dtype)" in rendered(tmp_path, gpu, "mosaic_gpu")
    tpu = spec + "backends:\n  mosaic_tpu:\n    params: {bs: 64}\n    scratch:\n      v: {shape: [8, 128], dtype: x}\n"
    assert "pltpu.VMEM((8, 128), x.dtype)" in rendered(tmp_path, tpu, "mosaic_tpu")
    # 80000 float32 elements (313 KiB) are over Hopper's 227 KiB; as bfloat16 (156 KiB) they fit.
    big = spec + "backends:\n  mosaic_gpu:\n    scratch:\n      m: {shape: [80000], dtype: x}\n"
    over = ("E721: case `c` (mosaic_gpu): shared memory estimate 314 KiB (blocks x 1 steps 0 KiB + scratch) "
            "exceeds 227 KiB per block on Hopper")
    assert messages(tmp_path, big.replace("{name: c, N: 64}", "{name: c, N: 64, dtype: float32}")) == [over]
    fits = messages(tmp_path, big.replace("{name: c, N: 64}", "{name: c, N: 64, dtype: bfloat16}"))
    assert [m for m in fits if not m.startswith("W902")] == []
    unknown = spec + "backends:\n  mosaic_gpu:\n    scratch:\n      m: {shape: [8], dtype: xx}\n"
    assert messages(tmp_path, unknown) == ["E401: scratch m: unknown dtype `xx`"]
    assert [d.hint for d in compiled(tmp_path, unknown).diagnostics] == ["did you mean `x`?"]
    # An accumulator's dtype is checked the same way (float32 when it gives none).
    acc = spec + "backends:\n  mosaic_gpu:\n    scratch:\n      a: {shape: [64, 64], kind: accumulator, dtype: float31}\n"
    assert messages(tmp_path, acc) == ["E401: scratch a: unknown dtype `float31`"]
    assert "plgpu.ACC((64, 64), x.dtype)" in rendered(tmp_path, acc.replace("float31", "x"), "mosaic_gpu")

# -- aliasing and pallas_call options -----------------------------------------------------


def test_aliases_and_call_options_render(tmp_path):
    text = mutate(VALID_SPEC, ("cases:", 'input_output_aliases: {o: x}\npallas_call: {name: twice, metadata: {k: v}, debug: true}\ncases:'))
    src = rendered(tmp_path, text, "interpret")
    assert "input_output_aliases={0: 0}," in src
    assert 'debug=True,\n        name="twice",\n        metadata={\'k\': \'v\'},' in src
    assert "Aliases (input_output_aliases): o is written in place of x." in src


@pytest.mark.parametrize(
    "aliases, expected",
    [
        ("{o: z}", "E412: input_output_aliases: `z` is not an input"),
        ("{p: x}", "E412: input_output_aliases: `p` is not an output"),
    ],
)
def test_alias_names(tmp_path, aliases, expected):
    assert expected in messages(tmp_path, mutate(VALID_SPEC, ("cases:", f"input_output_aliases: {aliases}\ncases:")))


def test_alias_needs_the_same_shape_and_dtype(tmp_path):
    text = mutate(
        VALID_SPEC,
        ("x: {shape: [N], dtype: float32}", "x: {shape: [N], dtype: float32}\n  y: {shape: [N], dtype: [float32, bfloat16]}"),
        ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: x}\n  p: {shape: [N], dtype: x}"),
        ("cases:", "input_output_aliases: {o: y}\ncases:"),
    )
    assert "E412: input_output_aliases: output o and input y may differ in dtype" in messages(tmp_path, text)
    on_gpu = mutate(VALID_SPEC, ("cases:", "input_output_aliases: {o: x}\ncases:")) + "backends:\n  mosaic_gpu:\n"
    assert "E412: input_output_aliases: the mosaic_gpu backend does not alias buffers" in messages(tmp_path, on_gpu)


# -- the generated functions ----------------------------------------------------------------


@pytest.fixture(scope="module")
def generated():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import importlib

    return lambda name: importlib.import_module(f"generated.{name}")


def test_aliased_call_leaves_the_callers_array_intact_and_donation_works(generated):
    import jax
    import jax.numpy as jnp

    acc = jnp.ones((64, 256), jnp.float32)
    x = jnp.full((64, 256), 2.0, jnp.float32)
    out = generated("accumulate").accumulate(acc, x, backend="interpret")
    assert float(out[0, 0]) == 3.0 and float(acc[0, 0]) == 1.0  # not donated: acc is unchanged
    mod = __import__("generated.accumulate.interpret", fromlist=["accumulate"])
    donated = jax.jit(mod.accumulate, donate_argnums=0)(jnp.ones((64, 256), jnp.float32), x)
    assert float(donated.sum()) == 3.0 * 64 * 256


@pytest.mark.parametrize(
    "kernel, shapes",
    [("add", [(64, 256), (64, 256)]), ("softmax", [(16, 256)]), ("gather_rows", None)],
)
def test_generated_functions_work_under_jit_and_vmap(generated, kernel, shapes):
    import jax
    import jax.numpy as jnp
    import numpy as np

    pkg = generated(kernel)
    fn, ref = getattr(pkg, kernel), getattr(pkg, f"{kernel}_reference")
    keys = jax.random.split(jax.random.key(0), 3)
    if shapes is None:  # gather_rows: the prefetched indices, then the table
        args = [jnp.array([3, 0, 2, 2], jnp.int32), jax.random.normal(keys[0], (32, 128), jnp.float32)]
        batched = [jnp.stack([args[0], args[0][::-1]]), jnp.stack([args[1], -args[1]])]
    else:
        args = [jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes)]
        batched = [jnp.stack([a, 2 * a, -a]) for a in args]
    jitted = jax.jit(lambda *a: fn(*a, backend="interpret"))(*args)
    np.testing.assert_allclose(jitted, ref(*args), rtol=1e-5, atol=1e-5)
    mapped = jax.vmap(lambda *a: fn(*a, backend="interpret"))(*batched)
    expected = jnp.stack([ref(*[b[k] for b in batched]) for k in range(batched[0].shape[0])])
    np.testing.assert_allclose(mapped, expected, rtol=1e-5, atol=1e-5)


def test_shipped_surface_specs_verify_and_lower(tmp_path):
    from conftest import invoke_kspec

    report = tmp_path / "verify.json"
    # Their interpret rows, and mosaic_tpu under one schedule, run with the library's (test_verify).
    r = invoke_kspec("verify", *SURFACE_SPECS, "-b", "mosaic_tpu", "--inputs", "normal", "--seed", "3",
                     "--json", str(report), cwd=ROOT, timeout=300)
    assert r.rc == 0, r.both[-3000:]
    rows = json.loads(report.read_text())["results"]
    ran = {(x["kernel"], x["backend"]) for x in rows if x["status"] == "pass"}
    assert ran == {(kernel, "mosaic_tpu") for kernel in ("gather_rows", "accumulate", "dma_copy", "shift_diff")}
    # mosaic_tpu ran under the default multi-core sweep: both DMA modes, 1 and 2 cores, bitwise alike
    sweeps = {tuple((s["dma_execution_mode"], s["cores"]) for s in x["schedules"]) for x in rows
              if x["backend"] == "mosaic_tpu" and x["status"] != "skip" and not x["case"].startswith(PREFIX)}
    assert sweeps == {(("on_wait", 2), ("eager", 1), ("eager", 2), ("on_wait", 1))}
    r = invoke_kspec("verify", "--lower", *SURFACE_SPECS, "--seed", "3", cwd=ROOT, timeout=300)
    assert r.rc == 0, r.both[-3000:]
