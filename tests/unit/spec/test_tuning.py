"""spec/tuning.py: shape buckets, the kernel hash, and which recorded entries are embedded
(usable, best) or reported stale. tests/test_tune.py runs `kspec tune` end to end."""

from __future__ import annotations

import json
from pathlib import Path

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
                    dict(base, params={"b": 2, "a": 2}), dict(base, reference_sha="r"), dict(base, case="N16384")):
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


K = ("triton", "bfloat16", (8192,), ())  # the table key of `entry`'s entries


def sustained(case: str, params: dict, speedup: float, **more) -> dict:
    """A trial timed against the reference "r" at `case`, one of the shapes of bucket 8192."""
    return entry(params, 1.0, case=case, load="sustained", speedup=speedup, reference_sha="r", **more)


def test_a_bucket_takes_the_config_best_at_its_worst_case():
    """b=1 is the fastest at N 6144 but slow at N 8192, the other shape of the bucket; b=2 is best at
    the worst of the two, so it is embedded, and being faster than the reference there, auto keeps it."""
    first = [sustained("N6144", {"b": 1}, 1.20), sustained("N6144", {"b": 2}, 1.10)]
    second = [sustained("N8192", {"b": 1}, 0.88), sustained("N8192", {"b": 2}, 1.02)]
    assert tuning.best(first, "s", ref="r") == {K: {"b": 1}}  # one case: the fastest
    assert tuning.slower(first, "s", "r") == {}
    assert tuning.best(first + second, "s", ref="r") == {K: {"b": 2}}
    assert tuning.slower(first + second, "s", "r") == {}
    pick = tuning.picks(first + second, "s", ref="r")[K]
    assert pick.score == pytest.approx(1 / 1.02) and sorted(pick.at) == ["N6144", "N8192"]
    assert [e["speedup"] for e in pick.at.values()] == [1.10, 1.02]


def test_a_config_counts_at_a_case_by_its_best_entry_there():
    entries = [sustained("N6144", {"b": 1}, 1.20), sustained("N8192", {"b": 1}, 0.70),
               sustained("N8192", {"b": 1}, 1.05), sustained("N6144", {"b": 2}, 1.10), sustained("N8192", {"b": 2}, 1.02)]
    assert tuning.best(entries, "s", ref="r") == {K: {"b": 1}}  # its rerun at N8192: 1.05


def test_candidates_are_the_configs_timed_at_every_case_else_at_the_most():
    """A config fast at the one case it was timed at is no candidate beside configs timed at every
    case; a failed trial does not count as timed."""
    both = [sustained("N6144", {"b": 1}, 1.01), sustained("N8192", {"b": 1}, 1.01),
            sustained("N6144", {"b": 2}, 1.10), sustained("N8192", {"b": 2}, 1.02)]
    only_first = [sustained("N6144", {"b": 3}, 2.00)]
    assert tuning.best(both + only_first, "s", ref="r") == {K: {"b": 2}}
    failed = [dict(both[3], status="fail", speedup=None)]
    assert tuning.best(both[:3] + failed + only_first, "s", ref="r") == {K: {"b": 1}}  # b=2 has one case now
    # No config at all three cases: b=1 and b=2 are at two, b=3, b=4 and b=5 at one, however fast.
    third = [sustained("N5120", {"b": 5}, 3.00), sustained("N6144", {"b": 4}, 5.00)]
    assert tuning.best(both + only_first + third, "s", ref="r") == {K: {"b": 2}}


def test_times_alone_are_compared_relative_to_the_fastest_at_each_case():
    """At N 8192 every config takes longer than at N 6144: b=1 is 1.2x the fastest there, b=2 1.3x
    the fastest at N 6144, so b=1 is better at its worst, though its largest time (12 ms) is the largest."""
    entries = [entry({"b": 1}, 1.0, case="N6144"), entry({"b": 1}, 12.0, case="N8192"),
               entry({"b": 2}, 1.3, case="N6144"), entry({"b": 2}, 10.0, case="N8192")]
    assert tuning.best(entries, "s") == {K: {"b": 1}}
    assert tuning.picks(entries, "s")[K].score == pytest.approx(1.2)
    assert tuning.best(entries + [sustained("N6144", {"b": 2}, 1.1)], "s") == {K: {"b": 2}}  # sustained decides
    zero = [entry({"b": 1}, 0.0, case="N6144"), entry({"b": 1}, 9.0, case="N8192"),  # 0 ms, by hand
            entry({"b": 2}, 0.5, case="N6144"), entry({"b": 2}, 8.0, case="N8192")]
    assert tuning.best(zero, "s") == {K: {"b": 1}}


def test_equal_configs_go_to_the_one_recorded_first():
    one, two = entry({"b": 1}, 1.0, case="N6144"), entry({"b": 2}, 1.0, case="N6144")
    assert tuning.best([one, two], "s") == {K: {"b": 1}}
    assert tuning.best([two, one], "s") == {K: {"b": 2}}


def test_auto_calls_the_reference_where_the_picked_config_is_slower_at_any_case():
    """b=1 is picked (0.95x at its worst, against b=2's 0.90x), and the bucket goes to the reference
    with its worst speedup, though it beats the reference at N 6144."""
    entries = [sustained("N6144", {"b": 1}, 1.20), sustained("N8192", {"b": 1}, 0.95),
               sustained("N6144", {"b": 2}, 1.30), sustained("N8192", {"b": 2}, 0.90)]
    assert tuning.best(entries, "s", ref="r") == {K: {"b": 1}}
    assert tuning.slower(entries, "s", "r") == {K: 0.95}
    assert tuning.slower(entries, "s", "other") == {}  # timed against another reference


def test_grad_slower_takes_each_cases_last_entry_and_the_smallest_of_them():
    def grad(case, speedup):
        return entry({"b": 1}, 1.0, sha="g", case=case, load="grad", speedup=speedup)

    entries = [grad("N8192", 0.95), grad("N6144", 0.80), grad("N6144", 1.10)]
    assert tuning.grad_slower(entries, "g") == {K: 0.95}  # N6144 measured again at 1.10x; N8192 stays slower
    assert tuning.grad_slower(entries + [grad("N5120", 0.90)], "g") == {K: 0.9}
    assert tuning.grad_slower(entries + [grad("N8192", 1.01)], "g") == {}


def test_a_gradient_measured_in_rounds_too_noisy_counts_by_its_intervals_low_end():
    """1.162x with an interval of 0.709x to 5.286x does not show the kernels ahead: the bucket counts at
    0.709x and goes to the reference; 1.05x within 0.95x to 1.10x keeps the kernels. Every measured bucket
    is listed with its figure, the slower ones by grad_slower."""
    def grad(case, speedup, ci):
        return entry({"b": 1}, 1.0, sha="g", case=case, load="grad", speedup=speedup, speedup_ci95=ci)

    assert tuning.grad_figure(grad("N8192", 1.162, [0.709, 5.286])) == 0.709
    assert tuning.grad_figure(grad("N8192", 1.05, [0.95, 1.10])) == 1.05
    assert tuning.grad_figure(grad("N8192", 1.05, [0.9, 1.10])) == 1.05  # the low end at 0.9x is trusted
    # a tie: under 1.05x with an interval reaching below 1 counts by its low end
    assert tuning.grad_figure(grad("N8192", 1.006, [0.960, 1.046])) == 0.960
    assert tuning.grad_figure(grad("N8192", 1.03, [1.001, 1.06])) == 1.03
    assert tuning.grad_speedups([grad("N8192", 1.162, [0.709, 5.286])], "g") == {K: 0.709}
    assert tuning.grad_slower([grad("N8192", 1.162, [0.709, 5.286])], "g") == {K: 0.709}
    assert tuning.grad_speedups([grad("N8192", 1.05, [0.95, 1.10])], "g") == {K: 1.05}
    assert tuning.grad_slower([grad("N8192", 1.05, [0.95, 1.10])], "g") == {}


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


def _append_many(root: str, tag: int, n: int) -> None:
    store = Store(Path(root), "tiny", "NVIDIA H200")
    for i in range(n):
        store.append(entry({"b": tag}, float(i + 1), sha="5" * 64))


def test_processes_recording_into_one_file_keep_every_entry(tmp_path):
    """Two `kspec tune` processes (one per GPU, say) appending to one tuning file at once: every entry of
    both is in the file, each process's in its order. An entry appended twice is kept twice, and an entry
    of ours lost from the file (deleted by hand) is written back."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), tag, 40)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    entries = json.loads((tmp_path / "tiny" / "NVIDIA_H200.json").read_text())["entries"]
    for tag in (1, 2):
        assert [e["ms"] for e in entries if e["params"] == {"b": tag}] == [float(i + 1) for i in range(40)]
    store = Store(tmp_path, "other", "NVIDIA H200")
    same = entry({"b": 3}, None, sha="5" * 64, status="fail")
    store.append(same)
    store.append(dict(same))
    store.path.unlink()
    store.append(entry({"b": 4}, 1.0, sha="5" * 64))
    assert [e["params"]["b"] for e in json.loads(store.path.read_text())["entries"]] == [3, 3, 4]
