"""Pallas Triton does not mask a ragged last block: the generated Triton modules pad blocked
dims to whole blocks and crop the outputs, so no program touches memory past an array.

On an H200 (jax 0.11.2) the unpadded add_1d kernel with N=5000, bs=1024 stored 256 bytes
past its output, over the first 64 elements of the next buffer.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _lowered(module, fn, *shapes, **params) -> str:
    mod = importlib.import_module(module)
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(lambda *a: getattr(mod, fn)(*a, **params)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_ragged_1d_blocks_are_padded_and_cropped():
    ragged = _lowered("generated.add_1d.triton", "add_1d", (5000,), (5000,), bs=1024)
    assert "stablehlo.pad" in ragged  # x and y to 5120 (one padding function, called twice)
    assert "tensor<5120xf32>" in ragged and "stablehlo.slice" in ragged
    even = _lowered("generated.add_1d.triton", "add_1d", (8192,), (8192,), bs=1024)
    assert "stablehlo.pad" not in even and "stablehlo.slice" not in even


def test_ragged_matmul_rows_are_padded():
    text = _lowered("generated.matmul.triton", "matmul", (200, 256), (256, 128), bm=64, bn=64, bk=32)
    assert "tensor<256x256xf32>" in text  # x: 200 rows padded to 4 blocks of 64
    assert "tensor<256x128xf32>" in text and "stablehlo.slice" in text


def test_whole_blocks_and_crop_round_trip():
    sig = importlib.import_module("generated.add._signature")
    x = jnp.arange(15.0).reshape(3, 5)
    padded = sig.whole_blocks(x, (2, None))
    assert padded.shape == (4, 5)
    np.testing.assert_array_equal(padded[:3], x)
    np.testing.assert_array_equal(padded[3], 0)
    assert sig.whole_blocks(x, (3, None)) is x
    assert sig.whole(5000, 1024) == 5120
    assert sig.crop(padded, (3, 5)).shape == (3, 5)
    assert sig.crop(x, (3, 5)) is x
    a, b = sig.crop((padded, padded), ((3, 5), (4, 5)))
    assert a.shape == (3, 5) and b is padded


def test_persistent_norms_take_whole_arrays_and_a_grid_of_programs():
    """rms_norm and layer_norm on triton: x and y are whole arrays (`memory_space: any`) that
    the body indexes row by row, so a ragged M (40) needs no padding and the grid is
    min(programs, M)."""
    text = _lowered("generated.rms_norm.triton", "rms_norm", (40, 256), (1, 256), programs=16)
    assert "grid_x = 16 : i32" in text
    assert "stablehlo.pad" not in text and "stablehlo.slice" not in text
    text = _lowered("generated.layer_norm.triton", "layer_norm", (40, 256), (1, 256), (1, 256), programs=264)
    assert "grid_x = 40 : i32" in text  # never more programs than rows
    gen = (REPO / "generated" / "rms_norm" / "triton.py").read_text()
    assert "pl.BlockSpec(memory_space=pl.ANY)" in gen


def test_triton_whole_array_blocks_are_not_held_to_power_of_two_blocks(tmp_path):
    """E711 (Triton block dims are powers of two) is about loaded blocks: an operand passed
    whole (`memory_space: any`) has none, whatever its shape."""
    from kspec.codegen import project as pipeline

    spec = (REPO / "specs" / "rms_norm.yaml").read_text()
    assert "      x: {memory_space: any}\n" in spec
    (tmp_path / "rms_norm.yaml").write_text(spec)
    shutil.copy(REPO / "specs" / "rms_norm_bwd.yaml", tmp_path / "rms_norm_bwd.yaml")  # its vjp's kernel
    assert [d for d in pipeline.compile_spec(tmp_path / "rms_norm.yaml").diagnostics if d.severity == "error"] == []
    blocked = spec.replace("      x: {memory_space: any}\n", '      x: {block_shape: [M, N], index_map: "p -> (0, 0)"}\n')
    (tmp_path / "rms_norm.yaml").write_text(blocked)
    codes = [d.code for d in pipeline.compile_spec(tmp_path / "rms_norm.yaml").diagnostics]
    assert "E711" in codes  # the ragged case's M = 42 as a block dim
