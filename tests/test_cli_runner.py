"""The two ways the tests run `kspec` (conftest.py): in this process and as `python -m kspec`.

The in-process runner answers as the real entry point does (exit code, stdout, stderr), lets an
exception inside the CLI fail the test, and leaves no trace of a run in this process.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from kspec.codegen import project as pipeline
from conftest import VALID_SPEC, KspecTimeout, invoke_kspec, mutate, run_kspec

BAD = mutate(VALID_SPEC, ("dtype: float32", "dtype: float31"))

# name -> (spec files under specs/, command line): each way the entry point exits, run in a
# project that the command does not change.
RUNS = {
    "check_ok": ({"tiny": VALID_SPEC}, ["check"]),
    "check_bad_spec": ({"tiny": BAD}, ["check", "specs/tiny.yaml"]),
    "generate_check_drift": ({"tiny": VALID_SPEC}, ["generate", "--check"]),
    "no_specs": ({}, ["check"]),
    "usage_error": ({}, ["check", "--bogus"]),
    "unknown_backend": ({"tiny": VALID_SPEC}, ["verify", "--backend", "cuda"]),
    "help": ({}, ["check", "--help"]),
    "version": ({}, ["--version"]),
}


def _project(root: Path, specs: dict) -> Path:
    for stem, text in specs.items():
        (root / "specs").mkdir(exist_ok=True)
        (root / "specs" / f"{stem}.yaml").write_text(text)
    return root


@pytest.mark.parametrize("name", sorted(RUNS))
def test_in_process_run_answers_as_python_m_kspec(name, tmp_path):
    specs, args = RUNS[name]
    root = _project(tmp_path, specs)
    real = run_kspec(*args, cwd=root)
    assert real.out or real.err
    assert invoke_kspec(*args, cwd=root) == real


def test_a_run_leaves_no_trace_in_this_process(tmp_path):
    root = _project(tmp_path, {"tiny": VALID_SPEC})
    before = (Path.cwd(), dict(os.environ), list(warnings.filters))
    r = invoke_kspec("generate", cwd=root)
    assert (r.rc, r.err) == (0, ""), r.both
    assert (root / "generated" / "tiny" / "interpret.py").is_file()
    assert (Path.cwd(), dict(os.environ), list(warnings.filters)) == before


def test_each_run_reads_the_project_afresh(tmp_path):
    root = _project(tmp_path, {"tiny": VALID_SPEC})
    assert invoke_kspec("check", cwd=root).rc == 0
    _project(root, {"tiny": BAD})
    r = invoke_kspec("check", cwd=root)
    assert r.rc == 2 and "error[E401]: x: unknown dtype `float31`" in r.out


def test_an_exception_inside_the_cli_fails_the_test_with_its_traceback(tmp_path, monkeypatch):
    """Not an exit code: the console entry point would print `kspec internal error` and exit 3."""

    def broken(paths, root=None):
        raise ZeroDivisionError("a bug in kspec")

    monkeypatch.setattr(pipeline, "discover", broken)
    before = (Path.cwd(), dict(os.environ))
    with pytest.raises(ZeroDivisionError, match="a bug in kspec") as info:
        invoke_kspec("check", cwd=tmp_path)
    assert info.traceback[-1].name == "broken"
    assert (Path.cwd(), dict(os.environ)) == before


def test_a_run_past_its_timeout_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "discover", lambda paths, root=None: time.sleep(60))
    with pytest.raises(KspecTimeout, match="kspec did not finish in 0.2 s"):
        invoke_kspec("check", cwd=tmp_path, timeout=0.2)
