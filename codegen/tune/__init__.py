"""`kspec tune`: the search space, static pruning and search strategies (no jax here).

The space is the product of each param's `choices` (params without choices keep
their value); configs that break a constraint or a backend hardware rule for the
bench case are pruned before anything compiles. The worker compiles the survivors
in parallel threads, verifies each against the reference, and times the correct ones.

A strategy is a function of the results so far that names the next configs to time:
`exhaustive` and `random` name all of theirs at once; `guided` names a first batch
from a static score of each config, then batches around the fastest configs timed
(docs/bench.md, "Search strategies").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter

from kspec.codegen.checks import instances
from kspec.codegen.run.bench import COMPILE_THREADS
from kspec.codegen.backends import rules
from kspec.codegen.spec import dtypes as dt

STRATEGIES = ("exhaustive", "random", "guided")
LEADERS = 3  # guided looks around this many of the fastest configs timed
REACH = 2  # and changes up to this many params at once: a tile size may pay only with more warps
SPILL_WORDS = 128  # per thread: Triton's output tile lives in registers (255 per thread), more spills


def space(variant):
    """Every config, {param: value} over the params that have choices, one at a time: the
    space is never built whole (`kspec check` bounds its size, E415)."""
    tunable = [p for p in variant.params if p.choices]
    names = [p.name for p in tunable]
    return (dict(zip(names, combo)) for combo in itertools.product(*(p.choices for p in tunable)))


def key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def prune(spec, variant, case, dtypes: dict, configs) -> tuple:
    """(kept configs, [(config, reason)]) using the same checks as `kspec check`; `configs`
    may be any iterable (space() yields them one at a time)."""
    kept, pruned = [], []
    for cfg in configs:
        trial = dataclasses.replace(case, params=dict(case.params, **cfg))
        inst, diags = instances.instantiate(spec.kernel_view, variant, trial, dtypes)  # the pallas_call's operands
        if inst is not None:
            diags = diags + rules.check(inst)
        if diags:
            pruned.append((cfg, f"{diags[0].code}: {diags[0].message}"))
        else:
            kept.append(cfg)
    return kept, pruned


def scores(spec, variant, case, dtypes: dict, configs: list, peak=None) -> list:
    """A static score per config, lower first, from the blocks its params give (nothing compiles):
    (its output tile spills registers, minus its tile's flops per byte, whether it is not the spec's
    default config at the case's dims). `peak`: the device's (codegen.devices.Peak), which says whether
    the case is compute-bound; None: no intensity term. Where the blocks say nothing (a mesh kernel's
    pipelines), the default comes first: the author's choice, dims-aware where it is an expression."""
    defaults = variant.defaults_at({**case.dims, **case.params})
    out = []
    for cfg in configs:
        trial = dataclasses.replace(case, params=dict(case.params, **cfg))
        inst, _ = instances.instantiate(spec.kernel_view, variant, trial, dtypes, [0])  # [0]: no grid walk
        other = any(defaults.get(p) != v for p, v in cfg.items())
        out.append((_spills(inst), -_intensity(inst, peak), other) if inst is not None else (True, 0.0, other))
    return out


def _nbytes(shape, dtype: str) -> int:
    return math.prod(d for d in shape if d is not None) * dt.itemsize(dtype)


def _spills(inst) -> bool:
    """Whether a program's output tiles need more than SPILL_WORDS registers per thread (warps of
    32 threads; a value narrower than 32 bits is computed in 32); False without a num_warps."""
    warps = rules.compiler_param(inst, "num_warps")
    if not isinstance(warps, int) or warps < 1:
        return False
    words = sum(_nbytes(inst.block_shapes[o.name], inst.dtypes[o.name]) / min(dt.itemsize(inst.dtypes[o.name]), 4)
                for o in inst.spec.outputs)
    return words / (32 * warps) > SPILL_WORDS


def _intensity(inst, peak) -> float:
    """Flops per byte of one program's blocks, capped at the device's balance point (flops per byte
    at its peaks); 0 unless the whole case is compute-bound there and the spec counts flops."""
    cost = inst.spec.cost
    compute = dt.least_precise(inst.dtypes[o.name] for o in inst.spec.inputs)
    peak_flops = peak.flops_for(compute) if peak else None
    if not peak_flops or cost is None or cost.flops is None:
        return 0.0
    flops = cost.flops.eval(inst.env)
    if cost.bytes_accessed is not None:
        total = cost.bytes_accessed.eval(inst.env)
    else:
        total = sum(_nbytes(inst.shapes[o.name], inst.dtypes[o.name]) for o in inst.spec.operands)
    balance = peak_flops / (peak.bandwidth_gbs * 1e9)
    if not flops or not total or flops / total <= balance:
        return 0.0
    tile = sum(_nbytes(inst.block_shapes[o.name], inst.dtypes[o.name]) for o in inst.spec.operands)
    return min(flops / math.prod(inst.grid) / tile, balance)


def default_budget(strategy: str, size: int) -> int | None:
    """guided: a third of the (pruned) space; the others: no limit."""
    return max(1, size // 3) if strategy == "guided" else None


def search(configs: list, *, strategy: str, budget: int | None, seed: int, scores: list | None = None,
           neighbours: list | None = None):
    """The strategy as a function `next_batch(tried) -> [config, ...]`, [] when it is done.
    `tried`: {key(config): ms, or None for a config that failed}, every result so far (a resumed
    run's too: they count against the budget). `scores` (guided): from `scores()`, per config.
    `neighbours` (guided): the configs best at the nearest tuned buckets, nearest first, which
    lead its first batch."""
    budget = budget or default_budget(strategy, len(configs))
    if strategy == "guided":
        return _Guided(configs, budget, seed, scores, neighbours).next_batch
    order = list(configs)
    if strategy == "random":
        random.Random(seed).shuffle(order)
    order = order[:budget] if budget else order
    return lambda tried: [c for c in order if key(c) not in tried]


def _changes(a: dict, b: dict) -> int:
    return sum(a[p] != b[p] for p in a)


class _Guided:
    """First batch: a third of the budget, the configs best at the nearest tuned buckets of the same
    kernel, backend and dtypes (nearest first, those the space offers), then the best-scored configs,
    spread over each param's values. Then batches of COMPILE_THREADS untried configs: those within REACH param changes of
    the fastest timed, then of the second, ... of the LEADERS fastest, each group closest to the
    leaders together first (fewest changes summed over them), then by score; the rest last, by
    score. Ties go by a seeded random draw: the same seed and results give the same batch."""

    def __init__(self, configs: list, budget: int, seed: int, scores: list | None, neighbours: list | None = None):
        rng = random.Random(seed)
        self.configs, self.budget = configs, min(budget, len(configs))
        self.rank = [(s, rng.random()) for s in (scores or [()] * len(configs))]
        where, first = {key(c): i for i, c in enumerate(configs)}, max(1, budget // 3)
        seeded = list(dict.fromkeys(where[key(c)] for c in neighbours or () if key(c) in where))
        self.first = self._spread(first, seeded[:first])

    def _spread(self, n: int, seeded: list = ()) -> list:
        """n configs: `seeded` (indices) first, then the best score first; among equal scores, the one
        whose values were picked least so far, then the farthest from those picked."""
        picked, seen = list(seeded), Counter(kv for i in seeded for kv in self.configs[i].items())
        nearest = [min((_changes(c, self.configs[i]) for i in seeded), default=math.inf) for c in self.configs]
        left = set(range(len(self.configs))) - set(seeded)
        n -= len(picked)
        for _ in range(min(n, len(left))):
            i = min(left, key=lambda j: (self.rank[j][0], sum(seen[kv] for kv in self.configs[j].items()),
                                         -nearest[j], self.rank[j][1]))
            picked.append(i)
            left.discard(i)
            seen.update(self.configs[i].items())
            nearest = [min(d, _changes(c, self.configs[i])) for d, c in zip(nearest, self.configs)]
        return picked

    def next_batch(self, tried: dict) -> list:
        untried = [i for i, c in enumerate(self.configs) if key(c) not in tried]
        left = self.budget - (len(self.configs) - len(untried))
        if left <= 0:
            return []
        first = [i for i in self.first if key(self.configs[i]) not in tried]
        if first:
            return [self.configs[i] for i in first[:left]]
        timed = sorted((ms, i) for i, c in enumerate(self.configs) if (ms := tried.get(key(c))) is not None)
        leaders = [self.configs[i] for _, i in timed[:LEADERS]]

        def place(i):
            moves = [_changes(self.configs[i], lead) for lead in leaders]
            return next((n for n, m in enumerate(moves) if m <= REACH), LEADERS), sum(moves), self.rank[i]

        untried.sort(key=place)
        return [self.configs[i] for i in untried[: min(left, COMPILE_THREADS)]]
