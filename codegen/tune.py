"""`kspec tune`: the search space, static pruning and search strategies (no jax here).

The space is the product of each param's `choices` (params without choices keep
their value); configs that break a constraint or a backend hardware rule for the
bench case are pruned before anything compiles. The worker compiles the survivors
in parallel threads, verifies each against the reference, and times the correct ones.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from . import checks, rules


def space(variant) -> list:
    """Every config: {param: value} over the params that have choices."""
    tunable = [p for p in variant.params if p.choices]
    return [dict(zip((p.name for p in tunable), combo)) for combo in itertools.product(*(p.choices for p in tunable))]


def prune(spec, variant, case, dtypes: dict, configs: list) -> tuple:
    """(kept configs, [(config, reason)]) using the same checks as `kspec check`."""
    kept, pruned = [], []
    for cfg in configs:
        trial = dataclasses.replace(case, params=dict(case.params, **cfg))
        inst, diags = checks.instantiate(spec, variant, trial, dtypes)
        if inst is not None:
            diags = diags + rules.check(inst)
        if diags:
            pruned.append((cfg, f"{diags[0].code}: {diags[0].message}"))
        else:
            kept.append(cfg)
    return kept, pruned


def choose(configs: list, *, strategy: str, budget: int | None, seed: int) -> list:
    """The configs to try, in order: all of them, or a random sample of `budget`."""
    if strategy == "exhaustive":
        return configs[:budget] if budget else list(configs)
    rng = random.Random(seed)
    picked = list(configs)
    rng.shuffle(picked)
    return picked[:budget] if budget else picked
