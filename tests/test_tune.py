"""`kspec tune` through the real machinery on the CPU: interpret backend, tiny spaces.
tests/unit/tune/test_search.py runs the search strategies on synthetic tables."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kspec.codegen.checks import instances
from kspec.codegen import project as pipeline
from kspec.codegen import tune as tn
from conftest import invoke_kspec

ROOT = Path(__file__).resolve().parent.parent

SPEC = """
name: scale
params:
  bm: {default: 8, choices: [8, 16, 24, 32]}
  bn: {default: 128, choices: [128, 256]}
  wrong: {default: 0, choices: [0, 1]}
inputs:
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
grid: {i: "cdiv(M, bm)", j: "cdiv(N, bn)"}
blocks:
  x: {block_shape: [bm, bn], index_map: "i, j -> (i, j)"}
  o: {block_shape: [bm, bn], index_map: "i, j -> (i, j)"}
body: |
  o_ref[...] = x_ref[...] * (2.0 + wrong)
reference: |
  return x * 2.0
cases: [{M: 32, N: 256}]
bench: [{name: small, M: 64, N: 512}]
backends:
  interpret:
  mosaic_tpu:
"""


def kspec(*args, cwd):
    """(rc, stdout + stderr) of `kspec *args`, run in this process (the configs run in worker processes)."""
    r = invoke_kspec(*args, cwd=cwd, timeout=600)
    return r.rc, r.both


def project(tmp_path: Path) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "scale.yaml").write_text(SPEC)
    rc, out = kspec("generate", cwd=tmp_path)
    assert rc == 0, out
    return tmp_path


def entries(path: Path) -> list:
    return json.loads(path.read_text())["entries"]


def test_tune_prunes_rejects_wrong_configs_and_resumes(tmp_path):
    proj = project(tmp_path)
    rc, out = kspec("tune", "--backend", "interpret", "--seed", "1", "--samples", "3", cwd=proj)
    assert rc == 0, out
    table = proj / "tuning" / "scale" / "cpu.json"
    rows = entries(table)
    status = {(e["params"]["bm"], e["params"]["bn"], e["params"]["wrong"]): e["status"] for e in rows}
    assert len(status) == 16
    # bm=24 does not divide M=64: pruned by the constraint before compiling.
    assert {k for k, s in status.items() if s == "pruned"} == {(24, bn, w) for bn in (128, 256) for w in (0, 1)}
    pruned = next(e for e in rows if e["status"] == "pruned")
    assert pruned["message"] == "E501: case `small` (M=64, bm=24): M must be a multiple of bm"
    # wrong=1 computes x * 3: verified against the reference and rejected, never timed.
    assert all(s == "fail" for k, s in status.items() if k[2] == 1 and k[0] != 24)
    assert all(e["ms"] is None for e in rows if e["status"] != "pass")
    assert all(e["ms"] > 0 for e in rows if e["status"] == "pass")
    assert {e["jax_version"] for e in rows} and all(len(e["kernel_sha"]) == 64 for e in rows)
    assert all(e["bucket"] == [64, 512] and e["dtype"] == "float32" for e in rows)
    assert "16 configs, 4 pruned statically, 12 to try" in out
    assert "rejected {'bm': 8, 'bn': 128, 'wrong': 1}: fail" in out

    rc, out = kspec("tune", "--backend", "interpret", "--seed", "1", "--samples", "3", cwd=proj)
    assert rc == 0
    assert "16 configs, 4 pruned statically, 0 to try" in out  # resumed: nothing run twice
    assert len(entries(table)) == 16


def test_random_strategy_respects_the_trial_budget(tmp_path):
    proj = project(tmp_path)
    rc, out = kspec("tune", "--backend", "interpret", "--strategy", "random", "--budget-trials", "3",
                    "--seed", "5", "--samples", "3", "--tuning-dir", tmp_path / "t", cwd=proj)
    assert rc == 0, out
    tried = [e for e in entries(tmp_path / "t" / "scale" / "cpu.json") if e["status"] != "pruned"]
    assert len(tried) == 3


def test_unknown_strategy_is_a_usage_error(tmp_path):
    rc, out = kspec("tune", "--strategy", "genetic", cwd=project(tmp_path))
    assert rc == 2
    assert "--strategy must be exhaustive, random or guided" in out


def test_tuned_entry_is_checked_against_constraints_with_the_untuned_params(monkeypatch):
    """A constraint may read an untuned param (matmul_persistent: K % tk == 0); resolving a
    tuned entry for this device must see it (it raised KeyError: 'tk' on an H200)."""
    import jax
    import jax.numpy as jnp

    from generated.matmul_persistent import _tuning

    kind = jax.devices()[0].device_kind
    key = (kind, "mosaic_gpu", "bfloat16", (8192, 8192, 8192), (("epi", 64), ("tk", 64)))
    monkeypatch.setitem(_tuning.TABLE, key, {"snake": 16, "steps": 2, "tm": 128, "tn": 64})
    a = jnp.zeros((8, 8), jnp.bfloat16)
    got = _tuning.resolve("mosaic_gpu", (a, a), (8192, 8192, 8192), {}, {"tk": 64, "epi": 64})
    assert got == {"tm": 128, "tn": 64, "steps": 2, "snake": 16}
    # the tuned config breaks the constraint for these dims (N % (2 * tn)): defaults instead
    got = _tuning.resolve("mosaic_gpu", (a, a), (8192, 8192, 8100), {}, {"tk": 64, "epi": 64})
    assert got == _tuning.defaults("mosaic_gpu", 8192, 8192, 8100)


def test_a_nearer_tuned_entry_that_breaks_the_backends_own_constraint_is_passed_over(monkeypatch):
    """matmul_2d's mosaic_tpu backend adds N % bn == 0 to the spec's K % bk == 0: the nearest tuned
    bucket's config is taken only where the backend's constraints hold too, else the next nearest."""
    import jax
    import jax.numpy as jnp

    from generated.matmul_2d import _tuning

    kind = jax.devices()[0].device_kind
    near = (kind, "mosaic_tpu", "float32", (512, 512, 512), ())
    far = (kind, "mosaic_tpu", "float32", (4096, 4096, 4096), ())
    monkeypatch.setitem(_tuning.TABLE, near, {"bm": 32, "bn": 256, "bk": 128})
    monkeypatch.setitem(_tuning.TABLE, far, {"bm": 128, "bn": 64, "bk": 64})
    x = jnp.zeros((8, 8), jnp.float32)
    # N = 384: bn 256 leaves a partial block, which the backend's constraint rules out
    assert _tuning.resolve("mosaic_tpu", (x, x), (512, 512, 384), {}, {}) == {"bm": 128, "bn": 64, "bk": 64}
    assert _tuning.resolve("mosaic_tpu", (x, x), (512, 512, 512), {}, {}) == {"bm": 32, "bn": 256, "bk": 128}
    assert not _tuning.satisfies_constraints("mosaic_tpu", 512, 512, 384, {"bm": 32, "bn": 256, "bk": 128})
    assert _tuning.satisfies_constraints("interpret", 512, 512, 384, {"bm": 32, "bn": 256, "bk": 128})


def test_guided_strategy_end_to_end_and_resumes(tmp_path):
    proj = project(tmp_path)
    run = ("tune", "--backend", "interpret", "--strategy", "guided", "--seed", "3", "--samples", "3",
           "--tuning-dir", tmp_path / "t")
    rc, out = kspec(*run, cwd=proj)
    assert rc == 0, out
    # 12 configs survive pruning; the default budget is a third of them, in two batches (1, then 3)
    assert "16 configs, 4 pruned statically, 4 to try" in out
    assert "[4/4]" in out and "best {" in out
    table = tmp_path / "t" / "scale" / "cpu.json"
    tried = [e for e in entries(table) if e["status"] != "pruned"]
    assert len(tried) == 4 and len({tn.key(e["params"]) for e in tried}) == 4

    rc, out = kspec(*run, cwd=proj)
    assert rc == 0 and "16 configs, 4 pruned statically, 0 to try" in out  # resumed: nothing run twice
    rc, out = kspec(*run, "--budget-trials", "6", cwd=proj)
    assert rc == 0 and "6 to try" not in out and "2 to try" in out  # earlier trials count against the budget
    assert len([e for e in entries(table) if e["status"] != "pruned"]) == 6


def test_configs_that_change_the_references_params_are_checked_against_their_own_reference(tmp_path):
    """layer_norm_bwd writes one partial-sum row per block of bm rows, and its reference
    takes bm too: each config is compared with the reference at its own bm (on the H200 the
    configs other than the default's bm were rejected with a shape mismatch)."""
    from kspec.codegen.run import worker
    from kspec.codegen.run.tasks import TuneTask

    spec_path = ROOT / "specs" / "layer_norm_bwd.yaml"
    spec = pipeline.compile_spec(spec_path).spec
    assign = next(a for a in instances.dtype_assignments(spec, spec.cases[0]) if a["x"] == "float32")
    task = TuneTask(spec_path=str(spec_path), kernel=spec.name, backend="interpret", case="square", case_index=0,
                    dtypes=tuple(assign.items()), dtype_label="float32", seed=7,
                    out_root=str(ROOT / "generated"), samples=3, configs=((("bm", 4),), (("bm", 16),), (("bm", 8),)))
    rows = list(worker.tune_task(task))
    assert [(r.extra["params"], r.status) for r in rows] == [({"bm": 4}, "pass"), ({"bm": 16}, "pass"), ({"bm": 8}, "pass")]


def test_sustained_tuning_times_each_config_against_the_reference(tmp_path):
    """--sustained: every config sampled in alternation with the reference; its entry carries the
    speedup round by round with its interval, and is kept apart from the configs timed alone."""
    proj = project(tmp_path)
    args = ("tune", "--backend", "interpret", "--strategy", "random", "--budget-trials", "3", "--seed", "5",
            "--samples", "3")
    rc, out = kspec(*args, "--sustained", cwd=proj)
    assert rc == 0, out
    table = proj / "tuning" / "scale" / "cpu.json"
    tried = [e for e in entries(table) if e["status"] != "pruned"]
    assert len(tried) == 3 and {e["load"] for e in tried} == {"sustained"}
    for e in tried:
        if e["status"] == "pass":
            lo, hi = e["speedup_ci95"]
            assert lo <= e["speedup"] <= hi and e["ms"] > 0 and e["ref_ms"] > 0
            assert e["calls_per_executable"] in (1, 8)  # 8 where the config's or the reference's call is short
        else:  # wrong=1: rejected by the check, never timed
            assert e["params"]["wrong"] == 1 and "speedup" not in e
    assert any(e["status"] == "pass" for e in tried)
    assert re.search(r"best \{.*\}: \d+\.\d{3}x the reference \(\d+\.\d{3}-\d+\.\d{3}\), \d+\.\d{3} ms", out)
    # The same configs timed alone are other trials, not a resumed run.
    rc, out = kspec(*args, cwd=proj)
    assert rc == 0, out
    assert "16 configs, 4 pruned statically, 3 to try" in out
    alone = [e for e in entries(table) if e["status"] != "pruned" and "load" not in e]
    assert len(alone) == 3
    # A rerun resumes; after the reference is edited, the kernel's entries stay current (no W900), but
    # each config is timed again against the new reference, and recorded with its hash.
    rc, out = kspec(*args, "--sustained", cwd=proj)
    assert rc == 0 and "16 configs, 4 pruned statically, 0 to try" in out, out
    spec_file = proj / "specs" / "scale.yaml"
    spec_file.write_text(spec_file.read_text().replace("return x * 2.0", "return 2.0 * x"))
    rc, out = kspec("generate", cwd=proj)
    assert rc == 0 and "W900" not in out, out
    rc, out = kspec(*args, "--sustained", cwd=proj)
    assert rc == 0 and "16 configs, 4 pruned statically, 3 to try" in out, out
    timed = [e for e in entries(table) if e["status"] != "pruned" and e.get("load") == "sustained"]
    assert len(timed) == 6 and len({e["reference_sha"] for e in timed}) == 2


def test_offering_other_values_keeps_the_tuning_and_embeds_only_what_is_offered(tmp_path):
    """A param's choices and doc do not decide the kernel: editing them keeps the recorded entries
    (no W900), and an entry tuned with a value no longer offered is not embedded. Its default does
    decide (the entries go stale)."""
    proj = project(tmp_path)
    # One real trial, for an entry as `kspec tune` records it (its kernel hash, its keys); then a
    # table of three passing configs made from it.
    kspec("tune", "--backend", "interpret", "--strategy", "random", "--budget-trials", "1",
          "--seed", "2", "--samples", "3", cwd=proj)
    table = proj / "tuning" / "scale" / "cpu.json"
    (recorded,) = [e for e in entries(table) if e["status"] != "pruned"]
    made = [dict(recorded, params={"bm": bm, "bn": 128, "wrong": 0}, status="pass", message="", ms=ms)
            for bm, ms in ((16, 1.0), (32, 1.5), (8, 2.0))]
    table.write_text(json.dumps({"kernel": "scale", "device_kind": "cpu", "entries": made}))
    spec, tuning_py = proj / "specs" / "scale.yaml", proj / "generated" / "scale" / "_tuning.py"

    def embedded():
        rc, out = kspec("generate", cwd=proj)
        assert rc == 0, out
        return re.findall(r"\('cpu', 'interpret', .*?: (\{.*?\}),", tuning_py.read_text())

    assert embedded() == ["{'bm': 16, 'bn': 128, 'wrong': 0}"]
    spec.write_text(SPEC.replace("bm: {default: 8, choices: [8, 16, 24, 32]}",
                                 "bm: {default: 8, choices: [8, 24, 32, 64], doc: Rows per block.}"))
    rc, out = kspec("check", cwd=proj)
    assert rc == 0 and "W900" not in out, out
    assert embedded() == ["{'bm': 32, 'bn': 128, 'wrong': 0}"]  # 16 is no longer offered
    spec.write_text(SPEC.replace("bm: {default: 8, choices: [8, 16, 24, 32]}", "bm: {default: 32, choices: [8, 16, 32]}"))
    rc, out = kspec("check", cwd=proj)
    assert "warning[W900]: 3 of 3 tuning entries for cpu were recorded for another version of the kernel" in out
    assert embedded() == []


def test_interpret_mode_is_tuned_off_the_cpu_only_when_named():
    from kspec import cli

    assert cli._tuned_here("interpret", None, "cpu")
    assert not cli._tuned_here("interpret", None, "gpu")  # its times say nothing about the GPU
    assert cli._tuned_here("interpret", ["interpret"], "gpu")
    assert cli._tuned_here("triton", None, "gpu") and not cli._tuned_here("triton", ["mosaic_gpu"], "gpu")
    assert not cli._tuned_here("triton", ["triton"], "cpu")  # named, but the CPU cannot run it


def test_the_space_is_enumerated_one_config_at_a_time():
    """64 choices for each of 62 params: 64**62 configs, of which the first comes at once
    (`kspec check` refuses such a space, E415; the tuner never builds one whole)."""
    from test_bounds import PARAMS_64

    from kspec.codegen.spec import loader, model, schema

    doc = loader.load_text(PARAMS_64, "big.yaml")
    schema.validate(doc)
    variant = model.build(doc).variants["interpret"]
    configs = tn.space(variant)
    first = next(configs)
    assert first == {f"p{i}": 1 for i in range(63)}
    assert next(configs) == dict(first, p62=2)


def test_tune_case_searches_records_and_chooses_without_the_cli(tmp_path):
    """codegen/tune/case.py tunes one backend x case x dtype with any way to run a task: here the
    worker in this process. Every trial lands in the store; a second run finds them recorded and
    tries nothing."""
    from kspec.codegen.run import worker
    from kspec.codegen.tune.case import CaseJob, tune_case
    from kspec.codegen.tune.store import Store

    spec = pipeline.compile_spec(ROOT / "specs" / "layer_norm_bwd.yaml").spec
    variant, case = spec.variants["interpret"], spec.cases[1]  # ragged, float32
    assign = next(iter(instances.dtype_assignments(spec, case)))
    job = CaseJob(spec, variant, 1, case, assign, "cases", str(ROOT / "generated"), "cpu", "0", samples=3, seed=2)
    store, said, batches = Store(tmp_path, spec.name, "cpu"), [], []

    def run(task, started, planned):
        batches.append([dict(c) for c in task.configs])
        return worker.tune_task(task)

    assert tune_case(job, store, store.done(), run, said.append) is False
    assert said[0] == "layer_norm_bwd[interpret] ragged float32: 4 configs, 0 pruned statically, 4 to try"
    assert batches == [[{"bm": 4}, {"bm": 8}, {"bm": 16}, {"bm": 32}]]
    assert [(e["params"], e["status"], e["bucket"], e["dtype"]) for e in store.entries] == [
        ({"bm": bm}, "pass", [64, 256], "float32") for bm in (4, 8, 16, 32)]
    fastest = min(store.entries, key=lambda e: e["ms"])
    assert re.fullmatch(rf"  best {re.escape(str(fastest['params']))}: [0-9.]+ ms, [0-9.]+x the default's [0-9.]+ ms "
                        rf"-> {re.escape(str(store.path))}", said[-1])
    again = Store(tmp_path, spec.name, "cpu")
    assert tune_case(job, again, again.done(), run, said.append) is False and len(batches) == 1


def test_short_calls_are_tuned_several_to_an_executable(monkeypatch):
    """With every call counted as short (timing.SHORT_S raised), each config is timed 8 calls to an
    executable, one per input set, alone and sustained (the reference with it), and its row says so."""
    from kspec.codegen.run import timing, worker
    from kspec.codegen.run.tasks import TuneTask

    monkeypatch.setattr(timing, "SHORT_S", 1e3)
    monkeypatch.setattr("kspec.codegen.run.bench.SUSTAIN_S", 0.1)
    spec_path = ROOT / "specs" / "add.yaml"
    for sustained in (False, True):
        task = TuneTask(spec_path=str(spec_path), kernel="add", backend="interpret", case="ragged", case_index=1,
                        dtypes=(("x", "float32"), ("y", "float32"), ("o", "float32")), dtype_label="float32", seed=7,
                        out_root=str(ROOT / "generated"), samples=3, sustained=sustained,
                        configs=((("bm", 8), ("bn", 128)), (("bm", 16), ("bn", 256))))
        rows = list(worker.tune_task(task))
        assert [r.status for r in rows] == ["pass", "pass"], [r.message for r in rows]
        assert all(r.extra["calls_per_executable"] == 8 and r.extra["ms"] > 0 for r in rows)
        assert all((r.extra.get("speedup") is not None) == sustained for r in rows)


def test_a_config_whose_probe_read_long_but_whose_samples_read_short_is_tuned_several_to_an_executable(monkeypatch):
    """The warm probe reads the host where it is busy (timing.read_short): a probe that reads 10 s with
    SHORT_S at 5 s picks one call to an executable, the samples read every call short, and each config is
    sampled again 8 calls to an executable, alone and sustained."""
    from kspec.codegen.run import timing, worker
    from kspec.codegen.run.tasks import TuneTask

    monkeypatch.setattr(timing, "SHORT_S", 5.0)
    monkeypatch.setattr(timing, "warm_call_s", lambda fn, args: 10.0)
    monkeypatch.setattr("kspec.codegen.run.bench.SUSTAIN_S", 0.1)
    for sustained in (False, True):
        task = TuneTask(spec_path=str(ROOT / "specs" / "add.yaml"), kernel="add", backend="interpret", case="ragged",
                        case_index=1, dtypes=(("x", "float32"), ("y", "float32"), ("o", "float32")),
                        dtype_label="float32", seed=7, out_root=str(ROOT / "generated"), samples=3,
                        sustained=sustained, configs=((("bm", 8), ("bn", 128)),))
        rows = list(worker.tune_task(task))
        assert [r.status for r in rows] == ["pass"], [r.message for r in rows]
        assert rows[0].extra["calls_per_executable"] == 8


def test_guided_starts_from_the_configs_of_the_nearest_tuned_buckets():
    """Tuning a family bucket by bucket, the guided search's first batch begins with the configs
    chosen at the nearest tuned buckets: flash attention's H200 table (tuned over the llm family)
    gives S 8192 H8 D128 the config of S 2048 H8 D128 (2 stages, 4 warps) first."""
    from kspec.codegen.tune.case import CaseJob, _neighbours
    from kspec.codegen.tune.store import Store

    spec = pipeline.compile_spec(ROOT / "specs" / "flash_attention.yaml").spec
    variant = spec.variants["triton"]
    i, case = next((i, c) for i, c in enumerate(spec.sweep) if c.name == "llm_B2_S8192_H8_Hkv8_D128")
    assign = next(iter(instances.dtype_assignments(spec, case)))
    job = CaseJob(spec, variant, i, case, assign, "sweep", str(ROOT / "generated"), "NVIDIA H200", "0.11.2",
                  strategy="guided", sustained=True)
    store = Store(ROOT / "tuning", spec.name, "NVIDIA H200")
    near = _neighbours(job, store, job.base())
    assert near[0] == {"bq": 128, "bk": 64, "warps": 4, "stages": 2}  # S2048 H8 D128's
    assert near[1] == {"bq": 128, "bk": 64, "warps": 8, "stages": 3}  # S8192 H8 D64's, as far by the distance
    # every other bucket tuned without the causal mask (the causal buckets take a param this job fixes otherwise)
    assert len(near) == len({tuple(e["bucket"]) for e in store.entries if e["fixed"] == {"causal": False}}) - 1
    from kspec.codegen.backends.devices import peak_for

    kept = list(tn.space(variant))
    scores = tn.scores(spec, variant, case, assign, kept, peak_for("NVIDIA H200"))
    first = tn.search(kept, strategy="guided", budget=8, seed=5, scores=scores, neighbours=near)({})
    assert first == near[:2]  # a third of the budget: the two nearest buckets' configs
    # without them the first batch, by the static score, held neither
    alone = tn.search(kept, strategy="guided", budget=8, seed=5, scores=scores)({})
    assert len(alone) == 2 and near[0] not in alone and near[1] not in alone
