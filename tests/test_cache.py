"""The check cache (.kspec/cache/): an unchanged spec is not checked again, and what `check` and
`generate` print with the cache is what they print without it, whatever changed in between: the
spec, a backward spec it names, its tuning files, or the generated files on disk."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import invoke_kspec, keep_only

FORWARD, BACKWARD = "specs/softmax.yaml", "specs/softmax_dx.yaml"


def run(root, *args):
    r = invoke_kspec(*args, cwd=root, timeout=300)
    return r.rc, r.out


def ok(result) -> bool:
    return result[0] == 0 and result[1].endswith("2 spec(s) OK\n")


def up_to_date(result) -> bool:
    return result[0] == 0 and result[1].endswith("generated/ is up to date for 2 spec(s)\n")


@pytest.fixture
def softmax_copy(repo_copy):
    """The copy of the library cut down to softmax and its backward spec: what the cache is keyed on (a
    spec, the backward specs it names, their tuning files, the files generated from them)."""
    return keep_only(repo_copy, "softmax", "softmax_dx")


def same_as_fresh(root, *args):
    """kspec *args, with the cache, and then again with the cache deleted first: both the same."""
    cached = run(root, *args)
    shutil.rmtree(root / ".kspec" / "cache", ignore_errors=True)
    fresh = run(root, *args)
    assert cached == fresh
    return cached


def test_check_reuses_unchanged_specs_and_sees_every_change(softmax_copy):
    root = softmax_copy
    assert ok(run(root, "check", FORWARD, BACKWARD))
    entries = sorted((root / ".kspec" / "cache").glob("*.json"))
    assert len(entries) == 2
    stamps = [e.stat().st_mtime_ns for e in entries]
    assert ok(run(root, "check", FORWARD, BACKWARD))
    assert [e.stat().st_mtime_ns for e in entries] == stamps  # read, not written again

    # A backward spec broken: the forward spec, unchanged itself, now reports it.
    dx = root / BACKWARD
    good = dx.read_text()
    assert "  o = o_ref[...]" in good
    dx.write_text(good.replace("  o = o_ref[...]", "  o = oo_ref[...]", 1))
    rc, out = same_as_fresh(root, "check", FORWARD, BACKWARD)
    assert rc == 2 and "error[E602]: body: unknown name `oo_ref`" in out and "specs/softmax.yaml:" in out, out
    dx.write_text(good)
    assert ok(same_as_fresh(root, "check", FORWARD, BACKWARD))

    # A tuning file recorded for another version of the kernel: W900, cached or not.
    table = root / "tuning" / "softmax" / "NVIDIA_H100_80GB_HBM3.json"
    table.parent.mkdir(parents=True, exist_ok=True)
    entry = {"backend": "triton", "bucket": [4096, 4096], "case": "b4096", "dtype": "float32", "fixed": {},
             "jax_version": "0.11.2", "kernel_sha": "0" * 64, "message": "", "ms": 0.1, "params": {"bm": 1},
             "status": "pass"}
    table.write_text(json.dumps({"device_kind": "NVIDIA H100 80GB HBM3", "kernel": "softmax", "entries": [entry]}))
    rc, out = same_as_fresh(root, "check", FORWARD, BACKWARD)
    assert rc == 0 and "warning[W900]: 1 of 1 tuning entries for NVIDIA H100 80GB HBM3" in out, out


def test_generate_check_after_a_cached_check_still_reads_the_disk(softmax_copy):
    root = softmax_copy
    assert run(root, "check")[0] == 0
    assert up_to_date(same_as_fresh(root, "generate", "--check"))
    assert up_to_date(run(root, "generate", "--check"))  # rendered files kept
    module = root / "generated" / "softmax" / "reference.py"
    module.write_text(module.read_text() + "# edited\n")
    rc, out = same_as_fresh(root, "generate", "--check")
    assert rc == 1 and "generated/softmax/reference.py" in out, out
    module.write_text(module.read_text().replace("# edited\n", ""))
    spec = root / FORWARD
    spec.write_text(spec.read_text().replace("doc: ", "doc: Rows. ", 1))
    rc, out = run(root, "generate", "--check")
    assert rc == 1 and "generated/softmax/" in out, out
    assert run(root, "generate", FORWARD)[0] == 0
    assert up_to_date(same_as_fresh(root, "generate", "--check"))


def test_a_new_tuning_file_of_a_backward_spec_reaches_its_generated_files(softmax_copy):
    """Checking the forward spec re-records its backward spec's entry; files rendered before the
    backward spec's tuning folder changed must not be kept with the folder's new state."""
    root = softmax_copy
    dx_tuning = root / "generated" / "softmax_dx" / "_tuning.py"
    assert run(root, "generate", BACKWARD)[0] == 0
    before = dx_tuning.read_text()
    from kspec.codegen import project as pipeline

    sha = pipeline.compile_spec(root / BACKWARD).spec.kernel_sha
    table = root / "tuning" / "softmax_dx" / "NVIDIA_H100_80GB_HBM3.json"
    table.parent.mkdir(parents=True, exist_ok=True)
    entry = {"backend": "triton", "bucket": [8192, 8192], "case": "b8192", "dtype": "float32", "fixed": {},
             "jax_version": "0.11.2", "kernel_sha": sha, "message": "", "ms": 0.1, "params": {"bm": 2, "warps": 8},
             "status": "pass"}
    table.write_text(json.dumps({"device_kind": "NVIDIA H100 80GB HBM3", "kernel": "softmax_dx", "entries": [entry]}))
    assert run(root, "check", FORWARD)[0] == 0  # records softmax_dx again, as the forward's backward spec
    assert run(root, "generate", BACKWARD)[0] == 0
    after = dx_tuning.read_text()
    assert after != before and "('NVIDIA H100 80GB HBM3', 'triton', 'float32', (8192, 8192), ())" in after
    assert up_to_date(same_as_fresh(root, "generate", "--check"))


def test_the_cache_is_never_written_through_a_link(softmax_copy, tmp_path):
    root, elsewhere = softmax_copy, tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / ".kspec").symlink_to(elsewhere, target_is_directory=True)
    assert ok(run(root, "check", FORWARD, BACKWARD))
    assert list(elsewhere.iterdir()) == []
