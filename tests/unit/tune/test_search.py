"""tune/: the search strategies (exhaustive, random, guided) on synthetic tables, and the static
score that ranks the guided strategy's first batch. tests/test_tune.py runs `kspec tune` end to end."""

from __future__ import annotations

import itertools

from kspec.codegen.checks import instances
from kspec.codegen import project as pipeline
from kspec.codegen import tune as tn
from kspec.codegen.backends.devices import peak_for
from conftest import REPO as ROOT

SPACE = [{"bn": bn, "warps": w, "stages": s, "bk": bk}
         for bn, w, s, bk in itertools.product((64, 128, 256), (4, 8), (3, 4), (32, 64))]


def matmul_like(cfg: dict) -> float:
    """ms: a wider tile pays only with more warps (alone it spills), as on the H200 matmul table."""
    ms = 1.0 + 0.5 * (cfg["bn"] == 64) + 0.2 * (cfg["bn"] == 256) + 0.1 * (cfg["warps"] == 8)
    ms += 0.3 * (cfg["stages"] == 4) + 0.4 * (cfg["bk"] == 32)
    return ms - 0.5 * (cfg["bn"] == 256 and cfg["warps"] == 8)


def replay(next_batch, ms, tried=None) -> list:
    """Every batch the strategy names, each answered from `ms` (None: the config failed)."""
    tried, batches = dict(tried or {}), []
    while batch := next_batch(tried):
        batches.append(batch)
        tried.update((tn.key(c), ms(c)) for c in batch)
    return batches


def test_guided_pairs_the_two_cheapest_single_changes():
    local = {"bn": 128, "warps": 4, "stages": 3, "bk": 64}
    best = dict(local, bn=256, warps=8)
    singles = [c for c in SPACE if tn._changes(c, local) == 1]
    assert min(SPACE, key=matmul_like) == best
    assert all(matmul_like(c) > matmul_like(local) for c in singles)  # one change at a time stops at `local`
    next_batch = tn.search(SPACE, strategy="guided", budget=12, seed=4)
    first = next_batch({})
    assert len(first) == 4 and not any(c["bn"] == 256 and c["warps"] == 8 for c in first)
    tried = {tn.key(c): matmul_like(c) for c in [*first, local, *singles]}
    # the leaders are `local`, then 8 warps alone, then bn=256 alone: both changes together come first
    assert next_batch(tried)[0] == best


def test_guided_batches_are_deterministic_for_a_seed():
    def run(seed):
        return replay(tn.search(SPACE, strategy="guided", budget=12, seed=seed), matmul_like)

    assert run(7) == run(7)
    assert [len(b) for b in run(7)] == [4, 4, 4]  # a third of the budget, then the worker's compile batch
    assert len({tuple(map(tn.key, run(s)[0])) for s in range(5)}) > 1  # the seed breaks ties


def test_guided_never_exceeds_the_budget():
    def flaky(cfg):  # some configs fail: they count as tried
        return None if cfg["bk"] == 32 and cfg["stages"] == 4 else matmul_like(cfg)

    for budget in range(1, len(SPACE) + 2):
        batches = replay(tn.search(SPACE, strategy="guided", budget=budget, seed=1), flaky)
        tried = [tn.key(c) for b in batches for c in b]
        assert len(tried) == len(set(tried)) == min(budget, len(SPACE))
        assert all(len(b) <= tn.COMPILE_THREADS for b in batches[1:])
    earlier = {tn.key(c): matmul_like(c) for c in SPACE[:5]}  # a resumed run: earlier trials count
    batches = replay(tn.search(SPACE, strategy="guided", budget=8, seed=1), flaky, earlier)
    assert sum(map(len, batches)) == 3
    assert tn.search(SPACE, strategy="guided", budget=None, seed=1)({}) != []  # default: a third of the space
    assert sum(map(len, replay(tn.search(SPACE, strategy="guided", budget=None, seed=1), flaky))) == 8


def test_static_score_of_the_matmul_spec():
    spec = pipeline.compile_spec(ROOT / "specs" / "matmul.yaml").spec
    variant, case = spec.variants["triton"], next(c for c in spec.bench if c.name == "b8192")
    assign = next(iter(instances.dtype_assignments(spec, case)))
    configs = list(tn.space(variant))
    score = dict(zip(map(tn.key, configs), tn.scores(spec, variant, case, assign, configs, peak_for("NVIDIA H200"))))

    def of(bm, bn, warps):
        return score[tn.key({"bm": bm, "bn": bn, "bk": 64, "warps": warps, "stages": 3})]

    # a 128 x 256 f32 accumulator is 128 registers per thread with 8 warps, 256 with 4: it spills
    assert of(128, 256, 8)[0] is False and of(128, 256, 4)[0] is True and of(256, 256, 8)[0] is True
    # flops per byte of a program's blocks (bf16 x and y over all of K, f32 o): bigger tiles, more reuse
    assert of(128, 256, 8)[1] < of(128, 128, 4)[1] < of(64, 64, 4)[1] < 0
    assert min(score.values()) == of(128, 256, 8) == of(256, 128, 8)
    # no roofline for the device (a CPU): no intensity term; the interpret backend takes no warps
    assert {s[1] for s in tn.scores(spec, variant, case, assign, configs, None)} == {0.0}
    plain = spec.variants["interpret"]
    assert {s[0] for s in tn.scores(spec, plain, case, assign, tn.space(plain), None)} == {False}




def test_where_the_blocks_say_nothing_guided_starts_from_the_default_config():
    """A mesh kernel's tiles live in its pipelines, so no config outscores another statically: the
    spec's default config (its author's choice) is the first that guided tries, then its neighbours."""
    spec = pipeline.compile_spec(ROOT / "specs" / "matmul_persistent.yaml").spec
    variant = spec.variants["mosaic_gpu"]
    case = next(c for c in spec.bench if c.name == "b4096")
    assign = next(iter(instances.dtype_assignments(spec, case)))
    configs = list(tn.space(variant))
    scores = tn.scores(spec, variant, case, assign, configs, peak_for("NVIDIA H100 80GB HBM3"))
    assert len(set(scores)) == 2  # the default, and the rest
    first = tn.search(configs, strategy="guided", budget=3, seed=5, scores=scores)({})
    assert first == [{"snake": 8, "steps": 4, "tm": 128, "tn": 128}]
