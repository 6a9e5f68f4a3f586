"""spec/tuning.py: shape buckets, the kernel hash, and which recorded entries are embedded
(usable, best) or reported stale. tests/test_tune.py runs `kspec tune` end to end."""

from __future__ import annotations

import json

import pytest

from kspec.codegen.spec import tuning
from kspec.codegen.tune.store import Store
from conftest import VALID_SPEC, build_spec, mutate

TUNABLE = mutate(VALID_SPEC, ("  bs: 8\n", "  bs: {default: 8, choices: [8, 16, 32]}\n"))


def entry(params, ms, sha="s", **more) -> dict:
    """A recorded trial, as `kspec tune` writes it."""
    return {"backend": "triton", "bucket": [8192], "dtype": "bfloat16", "fixed": {}, "jax_version": "0.11.2",
            "kernel_sha": sha, "params": params, "status": "pass", "ms": ms, "message": "", **more}


@pytest.mark.parametrize("dims, bucket", [((1,), (1,)), ((64,), (64,)), ((65, 100), (128, 128)),
                                          ((8100, 8192, 8193), (8192, 8192, 16384)), ((0,), (1,))])
def test_bucket_rounds_each_dim_up_to_a_power_of_two(dims, bucket):
    assert tuning.bucket(dims) == bucket


def test_file_name_of_a_device_kind():
    assert tuning.file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert tuning.file_name("TPU v5 lite") == "TPU_v5_lite.json"
    assert tuning.file_name("cpu") == "cpu.json"


def test_kernel_sha_covers_what_decides_the_kernel_only():
    """Docs, cases, tolerances and the values a param offers leave the hash (and the entries) as they
    were; a default, a block or the body changes it."""
    sha = build_spec(TUNABLE).kernel_sha
    assert len(sha) == 64
    same = [
        mutate(TUNABLE, ("doc: Doubles a vector.", "doc: Twice a vector.")),
        mutate(TUNABLE, ("{name: c, N: 64}", "{name: c, N: 128}")),
        mutate(TUNABLE, ("choices: [8, 16, 32]", "choices: [8, 64], doc: Elements per block.")),
        mutate(TUNABLE, ("cases:", "tolerance: {float32: {atol: 0.1, rtol: 0.1}}\ncases:")),
        mutate(TUNABLE, ("x: {shape: [N], dtype: float32}", "x: {shape: [N], dtype: float32, init: {kind: uniform}}")),
    ]
    assert {build_spec(text).kernel_sha for text in same} == {sha}
    other = [
        mutate(TUNABLE, ("default: 8", "default: 16")),
        mutate(TUNABLE, ("o_ref[...] = x_ref[...] * 2", "o_ref[...] = x_ref[...] + x_ref[...]")),
        mutate(TUNABLE, ('x: {block_shape: [bs], index_map: "i -> (i,)"}',
                         'x: {block_shape: [bs], index_map: "j -> (j,)"}')),
    ]
    assert len({build_spec(text).kernel_sha for text in other} | {sha}) == 4


def test_the_reference_is_hashed_apart_from_the_kernel():
    """Editing the reference keeps the kernel's entries current (same kernel hash) and changes the
    reference hash, which sustained entries record: what they were timed against."""
    spec = build_spec(TUNABLE)
    edited = build_spec(mutate(TUNABLE, ("return x * 2", "return x + x")))
    assert edited.kernel_sha == spec.kernel_sha
    assert len(spec.reference_sha) == 64 and edited.reference_sha != spec.reference_sha
    assert tuning.grad_sha("f", ["b"], spec.reference_sha) != tuning.grad_sha("f", ["b"], edited.reference_sha)


def test_cost_ranks_times_alone_and_sustained_ratios():
    assert tuning.cost(entry({"b": 1}, 1.5)) == 1.5
    assert tuning.cost(entry({"b": 1}, 1.5, load="sustained", speedup=2.0)) == 0.5
    assert tuning.cost(entry({"b": 1}, 1.5, load="sustained")) is None  # no speedup recorded
    assert tuning.cost(entry({"b": 1}, None, status="fail")) is None
    assert tuning.cost(entry({"b": 1}, 1.5, status="pruned")) is None


def test_key_tells_apart_what_a_config_was_tuned_for():
    base = entry({"b": 1, "a": 2}, 1.0)
    assert tuning.key(base) == tuning.key(entry({"a": 2, "b": 1}, 3.0))  # params in any order, any time
    for changed in (dict(base, bucket=[4096]), dict(base, dtype="float32"), dict(base, fixed={"causal": True}),
                    dict(base, jax_version="0.10.2"), dict(base, kernel_sha="t"), dict(base, load="sustained"),
                    dict(base, params={"b": 2, "a": 2}), dict(base, reference_sha="r")):
        assert tuning.key(changed) != tuning.key(base)


def test_usable_entries_passed_were_timed_are_current_and_still_offered():
    ok = entry({"b": 16}, 1.0)
    assert tuning.usable(ok, "s")
    assert not tuning.usable(ok, "other")  # another version of the kernel
    assert not tuning.usable(entry({"b": 16}, None, status="fail"), "s")
    assert tuning.usable(ok, "s", {"triton": {"b": [8, 16]}})
    assert not tuning.usable(ok, "s", {"triton": {"b": [8, 32]}})  # 16 is no longer offered
    assert tuning.usable(ok, "s", {"mosaic_gpu": {"b": [8]}})  # another backend's choices restrict nothing


def test_choices_of_the_spec_variants():
    spec = build_spec(TUNABLE + "backends:\n  interpret:\n  triton:\n    params: {bs: {default: 16, choices: [16, 64]}}\n")
    assert tuning.choices_of(spec.variants) == {"interpret": {"bs": (8, 16, 32)}, "triton": {"bs": (16, 64)}}


def test_best_takes_the_fastest_usable_entry_per_key():
    entries = [
        entry({"b": 1}, 2.0), entry({"b": 2}, 1.0), entry({"b": 3}, 0.5, sha="old"),
        entry({"b": 4}, None, status="fail"), entry({"b": 5}, 0.9, dtype="float32"),
        entry({"b": 6}, 0.8, bucket=[4096]), entry({"b": 7}, 0.7, fixed={"causal": True}),
    ]
    assert tuning.best(entries, "s") == {
        ("triton", "bfloat16", (4096,), ()): {"b": 6},
        ("triton", "bfloat16", (8192,), ()): {"b": 2},
        ("triton", "bfloat16", (8192,), (("causal", True),)): {"b": 7},
        ("triton", "float32", (8192,), ()): {"b": 5},
    }
    assert tuning.best(entries, "s", {"triton": {"b": [1, 5, 6, 7]}})[("triton", "bfloat16", (8192,), ())] == {"b": 1}
    assert tuning.best(entries, "nothing recorded for this one") == {}


def test_sustained_entries_decide_the_embedded_config():
    alone = [entry({"b": 1}, 1.0), entry({"b": 2}, 1.2)]
    # Under load b=2 beats the reference by more, though its time alone (and under load) is longer:
    # what ranks sustained entries is the ratio in their own rounds.
    sustained = [entry({"b": 1}, 1.30, load="sustained", speedup=1.05, ref_ms=1.36),
                 entry({"b": 2}, 1.31, load="sustained", speedup=1.08, ref_ms=1.41),
                 entry({"b": 3}, None, load="sustained", speedup=None, status="fail")]
    assert tuning.best(alone, "s") == {("triton", "bfloat16", (8192,), ()): {"b": 1}}
    assert tuning.best(alone + sustained, "s") == {("triton", "bfloat16", (8192,), ()): {"b": 2}}
    assert tuning.key(alone[0]) != tuning.key(sustained[0])
    assert [tuning.cost(e) for e in sustained] == [1 / 1.05, 1 / 1.08, None]


def test_only_comparisons_with_the_current_reference_decide_where_auto_takes_it():
    """Entries timed against an earlier reference still rank configs, after those timed against the
    current one; only the current one's speedups below 1 make auto call the reference."""
    k = ("triton", "bfloat16", (8192,), ())
    old = [entry({"b": 1}, 1.0, load="sustained", speedup=0.8, reference_sha="old"),
           entry({"b": 2}, 1.0, load="sustained", speedup=0.7, reference_sha="old")]
    assert tuning.best(old, "s", ref="new") == {k: {"b": 1}}
    assert tuning.slower(old, "s", "old") == {k: 0.8}
    assert tuning.slower(old, "s", "new") == {}  # never compared with the current reference
    new = [entry({"b": 2}, 1.0, load="sustained", speedup=0.95, reference_sha="new")]
    assert tuning.best(old + new, "s", ref="new") == {k: {"b": 2}}  # ranked first, though slower than b=1 was
    assert tuning.slower(old + new, "s", "new") == {k: 0.95}


def test_stale_entries_are_those_of_another_kernel_version():
    entries = [entry({"b": 1}, 1.0), entry({"b": 2}, 1.0, sha="old"), entry({"b": 3}, None, sha="old", status="fail")]
    assert tuning.stale(entries, "s") == entries[1:]
    assert tuning.stale(entries, "old") == entries[:1]


def test_store_appends_and_a_new_store_resumes_from_the_file(tmp_path):
    store = Store(tmp_path, "tiny", "NVIDIA H200")
    assert store.path == tmp_path / "tiny" / "NVIDIA_H200.json" and store.entries == [] and store.done() == set()
    sha = "5" * 64  # a file is read back only when it is valid against schema/tuning.schema.json
    first, second = entry({"b": 1}, 1.0, sha=sha), entry({"b": 2}, None, sha=sha, status="fail")
    store.append(first)
    store.append(second)
    doc = json.loads(store.path.read_text())
    assert (doc["kernel"], doc["device_kind"], doc["entries"]) == ("tiny", "NVIDIA H200", [first, second])
    again = Store(tmp_path, "tiny", "NVIDIA H200")
    assert again.entries == [first, second] and again.done() == {tuning.key(first), tuning.key(second)}
    assert tuning.tables(tmp_path, "tiny") == ({"NVIDIA H200": [first, second]}, [])  # (tables, diagnostics)
    assert tuning.tables(tmp_path, "other") == ({}, [])


def test_a_tuning_file_is_read_with_its_problems(tmp_path):
    path = tmp_path / "t.json"
    assert tuning.read(path) == (None, [])  # missing: nothing tuned yet
    path.write_text("{not json")
    doc, (problem,) = tuning.read(path)
    assert doc is None and problem.code == "E120"
    path.write_text("[1, 2]")
    doc, (problem,) = tuning.read(path)
    assert doc is None and problem.code == "E121" and problem.message == "the file: [1, 2] is not of type 'object'"


def test_a_store_never_starts_over_a_file_it_cannot_read(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "NVIDIA_H200.json").write_text('{"kernel": "tiny", "entries": [}')
    with pytest.raises(ValueError, match=r"NVIDIA_H200.json:1:32: error\[E120\]: not valid JSON"):
        Store(tmp_path, "tiny", "NVIDIA H200")
    assert (tmp_path / "tiny" / "NVIDIA_H200.json").read_text() == '{"kernel": "tiny", "entries": [}'
