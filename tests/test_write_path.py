"""What `kspec generate` writes, and what `generate --check` sees: the whole output folder, never
a path outside it, and a package written as a whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kspec.codegen import project as pipeline
from kspec.codegen.emit import writer
from conftest import VALID_SPEC


@pytest.fixture
def generated(tmp_path, write_spec, kspec) -> Path:
    """A project with the small valid spec, generated: its output folder."""
    write_spec(VALID_SPEC)
    r = kspec("generate")
    assert r.rc == 0, r.both
    return tmp_path / "generated"


def test_a_folder_that_shadows_a_module_is_drift(generated, kspec):
    shadow = generated / "tiny" / "interpret"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("open('MARKER', 'w')\n")
    r = kspec("generate", "--check")
    assert (r.rc, r.out) == (1, "generated/tiny/interpret: a folder kspec does not write\n")
    r = kspec("generate")
    assert r.rc == 1 and "generated/tiny/interpret: refused: a folder kspec does not write; remove it or use --force" in r.out
    assert shadow.exists()
    assert kspec("generate", "--force").rc == 0
    assert not shadow.exists() and kspec("generate", "--check").rc == 0


def test_code_appended_to_the_output_package_is_drift(generated, kspec):
    with open(generated / "__init__.py", "a") as f:
        f.write("open('MARKER', 'w')\n")
    r = kspec("generate", "--check")
    assert (r.rc, r.out) == (1, "generated/__init__.py: edited by hand\n")
    assert kspec("generate").rc == 1
    assert kspec("generate", "--force").rc == 0
    assert (generated / "__init__.py").read_text() == writer.PACKAGE_INIT


def test_the_package_of_a_renamed_kernel_is_reported_then_pruned(generated, kspec, tmp_path):
    spec = tmp_path / "specs" / "tiny.yaml"
    spec.write_text(VALID_SPEC.replace("name: tiny", "name: small"))
    assert kspec("generate").rc == 0
    r = kspec("generate", "--check")
    assert (r.rc, r.out) == (1, "generated/tiny: a package no spec generates any more\n")
    r = kspec("generate", "--prune")
    assert r.rc == 0 and "generated/tiny: removed (no spec generates it)" in r.out
    assert not (generated / "tiny").exists() and kspec("generate", "--check").rc == 0


def test_prune_leaves_a_folder_kspec_did_not_write(generated, kspec):
    mine = generated / "notes"
    mine.mkdir()
    (mine / "todo.py").write_text("x = 1\n")
    r = kspec("generate", "--prune")
    assert r.rc == 1 and "generated/notes: refused: not a package kspec generated; remove it yourself" in r.out
    assert (mine / "todo.py").exists()


def test_leftovers_of_a_killed_write_are_drift_and_swept(generated, kspec):
    temp = generated / ".tiny.k3j2.tmp"
    temp.mkdir()
    (temp / "interpret.py").write_text("half a fi")
    r = kspec("generate", "--check")
    assert (r.rc, r.out) == (1, "generated/.tiny.k3j2.tmp: left by an interrupted write\n")
    assert kspec("generate").rc == 0
    assert not temp.exists()


@pytest.mark.parametrize("force", [False, True])
def test_a_package_that_is_a_link_is_refused_and_its_target_left_alone(force, generated, kspec, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "mine.py").write_text("keep = True\n")
    for p in (generated / "tiny").iterdir():
        p.unlink()
    (generated / "tiny").rmdir()
    (generated / "tiny").symlink_to(target)
    r = kspec("generate", *(["--force"] if force else []))
    assert r.rc == 2
    assert r.out == "generated/tiny:1:1: error[E111]: is a symbolic link; kspec writes only into real folders\n"
    assert sorted(p.name for p in target.iterdir()) == ["mine.py"]


def test_an_output_folder_that_is_a_link_is_refused(tmp_path, write_spec, kspec):
    write_spec(VALID_SPEC)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "generated").symlink_to(tmp_path / "elsewhere")
    r = kspec("generate")
    assert (r.rc, r.out) == (2, "generated:1:1: error[E111]: is a symbolic link; kspec writes only into real folders\n")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path, write_spec, kspec):
    write_spec(VALID_SPEC)
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / ".kspec.lock").symlink_to(tmp_path / "planted")
    r = kspec("generate")
    assert r.rc == 2
    assert r.out == "generated/.kspec.lock:1:1: error[E111]: is a symbolic link; kspec writes only into real folders and files\n"
    assert not (tmp_path / "planted").exists()


def test_an_output_folder_that_is_a_file_is_a_located_error(tmp_path, write_spec, kspec):
    write_spec(VALID_SPEC)
    (tmp_path / "generated").write_text("not a folder\n")
    r = kspec("generate")
    assert (r.rc, r.out) == (2, "generated:1:1: error[E111]: is a file, not a folder\n")
    assert "Traceback" not in r.both


def test_a_package_is_written_whole_or_not_at_all(tmp_path, write_spec, monkeypatch):
    """A write that fails part-way (here the third file's fsync) leaves the package as it was."""
    path = tmp_path / write_spec(VALID_SPEC)
    out_root = tmp_path / "generated"
    compiled = pipeline.compile_spec(path)
    kernel_dir, planned = pipeline.plan(compiled, out_root)
    writer.write_package(planned, kernel_dir)
    before = {p.name: p.read_text() for p in kernel_dir.iterdir()}
    path.write_text(VALID_SPEC.replace("Doubles a vector.", "Doubles a vector, again."))
    _, changed = pipeline.plan(pipeline.compile_spec(path), out_root)
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(writer.WriteError, match="No space left on device"):
        writer.write_package(changed, kernel_dir)
    assert {p.name: p.read_text() for p in kernel_dir.iterdir()} == before
    assert [p.name for p in out_root.iterdir()] == ["tiny"]  # no temporary folder left


def test_file_names_reach_the_terminal_escaped(tmp_path, kspec):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "\x1b[31mred.yaml").write_text("kspec: [1\n")
    r = kspec("check")
    assert r.rc == 2
    assert r.out.startswith("specs/\\x1b[31mred.yaml:")
    assert "\x1b" not in r.both


def test_a_generated_file_that_is_a_fifo_is_drift_and_never_read(generated, kspec):
    """A FIFO in place of a generated module would block a reader: --check sees what it is
    without opening it, and generate replaces it only with --force (the package is rewritten whole)."""
    module = generated / "tiny" / "interpret.py"
    module.unlink()
    os.mkfifo(module)
    r = kspec("generate", "--check", timeout=30)
    assert (r.rc, r.out) == (1, "generated/tiny/interpret.py: not a regular file\n")
    r = kspec("generate", timeout=30)
    assert r.rc == 1 and "generated/tiny/interpret.py: refused: not a regular file; remove it or use --force" in r.out
    assert kspec("generate", "--force", timeout=30).rc == 0
    assert module.is_file() and kspec("generate", "--check").rc == 0
