"""The shipped paged attention (specs/paged_attention.yaml): its generated package on the CPU, the
interpret backend and the Mosaic TPU backend (manual page DMAs) in TPU interpret mode, against its
reference and against attention computed sequence by sequence in numpy from the pages the page table
names; tokens past a sequence's length and pages no sequence names do not reach the output."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import invoke_kspec

# Grouped-query attention, 8 query heads over 2 key/value heads, pages of 16 tokens, 4 pages per sequence.
B, H, KH, D, PAGE, PAGES_PER_SEQ, NUM_PAGES = 6, 8, 2, 64, 16, 4, 12
# Ragged: one token, a page and one token, a whole page table, none, mid-page, exactly two pages.
LENGTHS = [1, 17, 64, 0, 40, 32]


def _operands(dtype: str, garbage: bool = False):
    """q, k_pages, v_pages, lengths, page_indices; pages repeat across sequences. With `garbage`, the
    tokens past each sequence's length and the pages no sequence names hold 1e4 instead of their values."""
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    q = rng.standard_normal((B, H, D))
    k = rng.standard_normal((KH, NUM_PAGES, PAGE, D))
    v = rng.standard_normal((KH, NUM_PAGES, PAGE, D))
    table = rng.integers(0, NUM_PAGES - 2, size=(B, PAGES_PER_SEQ))  # pages 10 and 11 are never named
    if garbage:
        used = np.zeros((NUM_PAGES, PAGE), bool)
        for b, n in enumerate(LENGTHS):
            for t in range(n):
                used[table[b, t // PAGE], t % PAGE] = True
        k[:, ~used], v[:, ~used] = 1e4, 1e4
    cast = jnp.dtype(dtype)
    return (jnp.asarray(q, cast), jnp.asarray(k, cast), jnp.asarray(v, cast),
            jnp.asarray(LENGTHS, jnp.int32), jnp.asarray(table, jnp.int32))


def _attention_per_sequence(q, k_pages, v_pages, lengths, page_indices) -> np.ndarray:
    """Attention in float64, one sequence at a time, over the tokens gathered page by page."""
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    out = np.zeros(q.shape)
    for b, n in enumerate(np.asarray(lengths)):
        if n == 0:
            continue
        pages = np.asarray(page_indices)[b, : math.ceil(n / PAGE)]
        for h in range(H):
            kv = h // (H // KH)
            keys = k_pages[kv, pages].reshape(-1, D)[:n]
            values = v_pages[kv, pages].reshape(-1, D)[:n]
            scores = keys @ q[b, h] / math.sqrt(D)
            p = np.exp(scores - scores.max())
            out[b, h] = p @ values / p.sum()
    return out


def _backends():
    from jax.experimental.pallas import tpu as pltpu

    from generated.paged_attention import interpret, mosaic_tpu

    return {
        "interpret": lambda *a, **kw: interpret.paged_attention(*a, **kw),
        "mosaic_tpu": lambda *a, **kw: mosaic_tpu.paged_attention(*a, interpret=pltpu.InterpretParams(), **kw),
    }


@pytest.mark.parametrize("backend", ["interpret", "mosaic_tpu"])
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_generated_package_matches_the_reference_with_ragged_lengths(backend, dtype, tol):
    from generated.paged_attention import paged_attention_reference

    args = _operands(dtype)
    expected = _attention_per_sequence(*args)
    reference = np.asarray(paged_attention_reference(*args), np.float64)
    np.testing.assert_allclose(reference, expected, atol=tol, rtol=tol)
    # splits=2: the second part of sequence 0 (one token) and every part of sequence 3 are empty.
    out = _backends()[backend](*args, splits=2)
    assert out.shape == (B, H, D) and str(out.dtype) == dtype
    got = np.asarray(out, np.float64)
    np.testing.assert_allclose(got, expected, atol=tol, rtol=tol)
    assert np.all(got[3] == 0)  # the sequence of no tokens
    # One token: its value row, whatever the query.
    np.testing.assert_allclose(got[0], np.asarray(args[2], np.float64)[np.arange(H) // (H // KH), int(args[4][0, 0]), 0],
                               atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["interpret", "mosaic_tpu"])
def test_tokens_past_the_lengths_and_unnamed_pages_do_not_reach_the_output(backend):
    run = _backends()[backend]
    # splits=3: parts of 2, 2 and 0 pages.
    clean = np.asarray(run(*_operands("float32"), splits=3))
    poisoned = np.asarray(run(*_operands("float32", garbage=True), splits=3))
    assert np.all(np.isfinite(poisoned))
    np.testing.assert_allclose(poisoned, clean, atol=1e-6, rtol=1e-6)


def test_spec_checks_clean(repo_copy):
    r = invoke_kspec("check", "specs/paged_attention.yaml", cwd=repo_copy)
    assert r.rc == 0, r.both
    assert r.out.strip() == "1 spec(s) OK"
