"""A Triton backend's declared shared-memory estimate (`shared_memory`, over dims, params and
itemsize(x)): checked by `kspec check` (E714), pruned by `kspec tune`, held to the GPU's limit by
the dispatcher and by the nearest-bucket lookup of tuned configs.

Triton reports the shared memory a program needs only when it compiles, on a GPU: a config tuned
where it fits (D 64) and taken by the nearest-bucket lookup where it does not (D 128) failed there
with `out of resource: shared memory`. These tests run on the CPU, on the generated packages.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kspec.codegen import project as pipeline
from kspec.codegen.emit import render
from kspec.codegen.spec import tuning as tg
from conftest import VALID_SPEC, mutate
from test_surface import compiled

ROOT = Path(__file__).resolve().parent.parent


def messages(tmp_path: Path, text: str) -> list:
    return [f"{d.code}: {d.message}" for d in compiled(tmp_path, text).diagnostics if d.severity == "error"]


def with_triton(section: str) -> str:
    return VALID_SPEC + "backends:\n  interpret:\n  triton:\n" + section


def test_itemsize_is_for_shared_memory_only(tmp_path):
    text = mutate(VALID_SPEC, ("cases:", 'constraints: ["itemsize(x) * bs <= 64"]\ncases:'))
    assert messages(tmp_path, text) == [
        "E300: calling anything but min, max, cdiv or next_pow2 is not allowed in an expression"]


def test_itemsize_takes_the_name_of_an_operand(tmp_path):
    assert messages(tmp_path, with_triton('    shared_memory: "itemsize(y) * bs"\n')) == [
        "E301: triton shared_memory: `itemsize(y)`: `y` is not an operand or scratch buffer of the kernel"]
    assert messages(tmp_path, with_triton('    shared_memory: "itemsize(2) * bs"\n')) == [
        "E300: `itemsize` of anything but an operand's name is not allowed in an expression"]
    assert messages(tmp_path, with_triton('    shared_memory: "itemsize(x) * bq"\n')) == [
        "E301: triton shared_memory: unknown name `bq`"]


def test_the_estimate_renders_over_the_calls_itemsizes(tmp_path):
    c = compiled(tmp_path, with_triton('    shared_memory: "N * bs * itemsize(x)"\n'))
    assert c.ok, [d.format() for d in c.diagnostics]
    files = render.render(c.spec, "specs/s.yaml")
    dispatch = files["_dispatch.py"]
    assert "_itemsize = {'x': jnp.dtype(x.dtype).itemsize, 'o': jnp.dtype(x.dtype).itemsize}" in dispatch
    assert "if not ((N * bs * _itemsize['x']) <= _runtime.shared_memory_limit()):" in dispatch
    tuning = files["_tuning.py"]
    assert "def itemsizes(inputs):" in tuning and "return {'x': jnp.dtype(x.dtype).itemsize}" in tuning
    assert "def satisfies_constraints(backend, N, params, _itemsize):" in tuning
    assert "return ((N * bs * _itemsize['x']) <= _runtime.shared_memory_limit())" in tuning


def test_the_estimate_is_not_part_of_the_kernels_hash(tmp_path):
    import yaml

    plain = yaml.safe_load(with_triton("    compiler_params: {num_warps: 4}\n"))
    estimated = yaml.safe_load(with_triton('    compiler_params: {num_warps: 4}\n    shared_memory: "N * itemsize(x)"\n'))
    other = yaml.safe_load(with_triton("    compiler_params: {num_warps: 8}\n"))
    assert tg.kernel_sha(plain) == tg.kernel_sha(estimated) != tg.kernel_sha(other)


# flash_attention_dq's Triton estimate (Triton's own figures on an H200): for bfloat16, the K and V blocks in
# `stages` buffers and the q and do blocks; for float32, K and V in `stages - 1` buffers, q, do and a block of scores.
DQ_CONFIG = {"bq": 128, "bk": 128, "stages": 3, "warps": 8}  # 128 KiB at D 64, 256 KiB at D 128 in bfloat16
DQ_ESTIMATE = ("2 * (stages - 1 + 2 // itemsize(q)) * bk * D * itemsize(k) + 2 * bq * D * itemsize(q) + "
               "itemsize(q) // 4 * bq * bk * itemsize(q)")


def dq_inputs(D: int, dtype="bfloat16", S=256):
    import jax.numpy as jnp

    x = jnp.zeros((1, S, 2, D), dtype)
    return (x, x, x, x, x, jnp.zeros((1, 2, S), jnp.float32), None, None, None)


def test_the_dispatcher_passes_triton_over_where_the_config_does_not_fit():
    """At D 128 the config that fits at D 64 needs 256 KiB: the reason names the estimate, and
    backend="auto" goes on (here, on the CPU, the platform runs no Triton: why_not is asked directly)."""
    from generated.flash_attention_dq import _dispatch

    assert _dispatch.why_not("triton", *dq_inputs(64), **DQ_CONFIG) is None
    assert _dispatch.why_not("triton", *dq_inputs(128), **DQ_CONFIG) == (
        f"shared memory estimate 256 KiB ({DQ_ESTIMATE}) exceeds 227 KiB per block on this GPU")
    # float32: 64 + 64 + 128 KiB at D 64 (Triton asked for 262144 bytes on an H200)
    assert "256 KiB" in _dispatch.why_not("triton", *dq_inputs(64, "float32"), **DQ_CONFIG)
    assert _dispatch.why_not("triton", *dq_inputs(64, "float32"), **dict(DQ_CONFIG, stages=2)) is None
    assert _dispatch.why_not("triton", *dq_inputs(128), **dict(DQ_CONFIG, stages=2)) is None


def test_a_nearer_tuned_config_that_does_not_fit_is_passed_over(monkeypatch):
    """The nearest tuned bucket's config is taken only where its shared memory fits at the call's
    own dims and dtypes: a D 64 config reaches D 128 only if it fits there."""
    import jax

    from generated.flash_attention_dq import _tuning

    kind = jax.devices()[0].device_kind
    key = lambda D: (kind, "triton", "bfloat16,float32", (1, 256, 2, D, 2), (("causal", False),))  # noqa: E731
    monkeypatch.setitem(_tuning.TABLE, key(64), DQ_CONFIG)
    resolve = lambda D: _tuning.resolve("triton", dq_inputs(D), (1, 256, 2, D, 2), {}, {"causal": False})  # noqa: E731
    assert resolve(64) == DQ_CONFIG
    assert resolve(128) == _tuning.defaults("triton", 1, 256, 2, 128, 2)
    # a farther bucket whose config fits at D 128 is taken instead of the defaults
    far = {"bq": 64, "bk": 32, "stages": 2, "warps": 4}
    monkeypatch.setitem(_tuning.TABLE, key(16), far)
    assert resolve(128) == far
    assert not _tuning.satisfies_constraints("triton", 1, 256, 2, 128, 2, dict(DQ_CONFIG, causal=False),
                                             _tuning.itemsizes(dq_inputs(128)))


def test_tune_prunes_the_configs_past_the_limit():
    from kspec.codegen import tune as tn
    from kspec.codegen.checks import instances

    spec = pipeline.compile_spec(ROOT / "specs" / "flash_attention_dq.yaml").spec
    variant = spec.variants["triton"]
    case = dataclasses.replace(spec.bench[0], name="d128")  # B4 S4096 H32 D128, bfloat16
    assign = next(iter(instances.dtype_assignments(spec, case)))
    kept, pruned = tn.prune(spec, variant, case, assign, tn.space(variant))
    reasons = {tuple(sorted(cfg.items())): why for cfg, why in pruned}
    assert reasons[tuple(sorted(DQ_CONFIG.items()))] == (
        f"E714: case `d128` (triton): shared memory estimate 256 KiB (`{DQ_ESTIMATE}`) exceeds 227 KiB per block on Hopper")
    assert len(kept) + len(pruned) == 24 and dict(DQ_CONFIG, stages=2) in kept


# Every config of flash attention's three Triton kernels was compiled on an H200 (jax 0.11.2) at B1 S1024 H2,
# D 64 and 128, bfloat16 and float32, num_warps 4 and 8: these are all that Triton refused, with the bytes its
# error gave (`Shared memory size limit exceeded: requested N, available: 232448`); the others compiled.
REFUSED_ON_H200 = {  # (kernel, dtype, D, bq, bk, stages) -> bytes requested
    ("flash_attention", "float32", 128, 64, 128, 3): 327680,
    ("flash_attention", "float32", 128, 128, 128, 2): 262144,
    ("flash_attention", "float32", 128, 128, 128, 3): 393216,
    ("flash_attention_dkdv", "bfloat16", 128, 128, 64, 3): 247808,
    ("flash_attention_dkdv", "bfloat16", 128, 128, 128, 3): 296960,
    ("flash_attention_dkdv", "float32", 64, 128, 128, 3): 264192,
    ("flash_attention_dkdv", "float32", 128, 64, 128, 3): 295936,
    ("flash_attention_dkdv", "float32", 128, 128, 64, 3): 362496,
    ("flash_attention_dkdv", "float32", 128, 128, 128, 2): 328704,
    ("flash_attention_dkdv", "float32", 128, 128, 128, 3): 460800,
    ("flash_attention_dq", "bfloat16", 128, 128, 128, 3): 262144,
    ("flash_attention_dq", "float32", 64, 128, 128, 3): 262144,
    ("flash_attention_dq", "float32", 128, 64, 128, 3): 360448,
    ("flash_attention_dq", "float32", 128, 128, 64, 3): 294912,
    ("flash_attention_dq", "float32", 128, 128, 128, 2): 327680,
    ("flash_attention_dq", "float32", 128, 128, 128, 3): 458752,
}


@pytest.mark.parametrize("kernel", ["flash_attention", "flash_attention_dq", "flash_attention_dkdv"])
def test_flash_attentions_estimates_meet_what_triton_asked_for(kernel):
    """The spec's estimate is past the limit for exactly the configs Triton refused, and equals
    the figure Triton gave for each of them."""
    from kspec.codegen import tune as tn
    from kspec.codegen.backends import rules
    from kspec.codegen.checks import instances

    spec = pipeline.compile_spec(ROOT / "specs" / f"{kernel}.yaml").spec
    variant = spec.variants["triton"]
    for dtype in ("bfloat16", "float32"):
        for D in (64, 128):
            case = dataclasses.replace(spec.cases[0], name="probe", dims={"B": 1, "S": 1024, "H": 2, "Hkv": 2, "D": D},
                                       dtype=dtype, absent=("q_segment_ids", "kv_segment_ids"))
            assign = next(iter(instances.dtype_assignments(spec, case)))
            for cfg in tn.space(variant):
                trial = dataclasses.replace(case, params=dict(case.params, **cfg))
                inst, diags = instances.instantiate(spec.kernel_view, variant, trial, assign)
                assert inst is not None, diags
                estimate = rules.declared_smem(inst)
                refused = REFUSED_ON_H200.get((kernel, dtype, D, cfg["bq"], cfg["bk"], cfg["stages"]))
                if refused is None:
                    assert estimate <= rules.HOPPER_SMEM_LIMIT, (dtype, D, cfg, estimate)
                else:
                    assert estimate == refused, (dtype, D, cfg, estimate)


@pytest.mark.parametrize("kernel", ["matmul", "matmul_bias_gelu"])
def test_the_triton_matmuls_prune_what_triton_refused(kernel):
    """Tuned at 8192^3 in bfloat16 on an H200, Triton refused only bm 256, bn 256, bk 64 at 4 stages
    (262144 bytes requested); tune now prunes exactly those two configs (4 and 8 warps)."""
    from kspec.codegen import tune as tn
    from kspec.codegen.checks import instances

    spec = pipeline.compile_spec(ROOT / "specs" / f"{kernel}.yaml").spec
    variant = spec.variants["triton"]
    case = next(c for c in spec.bench if c.name == "b8192")
    assign = next(a for a in instances.dtype_assignments(spec, case) if a["x"] == "bfloat16")
    kept, pruned = tn.prune(spec, variant, case, assign, tn.space(variant))
    assert sorted((cfg["warps"], why) for cfg, why in pruned) == [
        (w, f"E714: case `b8192` (triton): shared memory estimate 256 KiB (`(stages - 1 + 2 // itemsize(x)) * "
            f"(bm * bk + bk * bn) * itemsize(x)`) exceeds 227 KiB per block on Hopper") for w in (4, 8)]
    assert {(c["bm"], c["bn"], c["bk"], c["stages"]) for c, _ in pruned} == {(256, 256, 64, 4)}


def test_an_estimate_that_is_no_integer_for_a_case_is_refused(tmp_path):
    assert messages(tmp_path, with_triton('    shared_memory: "N * itemsize(x) // (bs - 8)"\n')) == [
        "E303: case `c` (triton): shared_memory: division by zero in `N * itemsize(x) // (bs - 8)`"]
    assert messages(tmp_path, with_triton('    shared_memory: "N * itemsize(x), bs"\n')) == [
        "E303: case `c` (triton): shared_memory: `(N * itemsize(x), bs)` is (256, 8), not an integer"]
