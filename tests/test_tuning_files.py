"""Hand-edited tuning files: whatever is in tuning/<kernel>/*.json, `check` and `generate` answer
with a located diagnostic in the JSON and exit 2, never a crash and never a broken package."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO, VALID_SPEC

SHA = "0" * 64
ENTRY = {"backend": "interpret", "bucket": [64], "case": "c", "dtype": "float32", "fixed": {}, "jax_version": "0.10.2",
         "kernel_sha": SHA, "message": "", "ms": 0.5, "params": {"bs": 8}, "status": "pass"}
GOOD = json.dumps({"device_kind": "cpu", "entries": [ENTRY], "kernel": "tiny"}, indent=1, sort_keys=True) + "\n"
SPEC = VALID_SPEC.replace("  bs: 8\n", "  bs: {default: 8, choices: [8, 16]}\n")


def _project(tmp_path, tuning: str | bytes | None) -> None:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "tiny.yaml").write_text(SPEC)
    folder = tmp_path / "tuning" / "tiny"
    folder.mkdir(parents=True)
    if isinstance(tuning, bytes):
        (folder / "cpu.json").write_bytes(tuning)
    elif tuning is not None:
        (folder / "cpu.json").write_text(tuning)


def _lines(tuning_text: str) -> list:
    return tuning_text.splitlines()


CONFLICT = GOOD.replace('  "ms": 0.5,\n', '<<<<<<< HEAD\n  "ms": 0.5,\n=======\n  "ms": 0.7,\n>>>>>>> tuned\n')
# name -> (file content, the first line kspec prints)
BROKEN = {
    "conflict_markers": (CONFLICT, "tuning/tiny/cpu.json:15:2: error[E120]: not valid JSON: Expecting property name enclosed in double quotes"),
    "not_json": ("{entries: [}", "tuning/tiny/cpu.json:1:2: error[E120]: not valid JSON: Expecting property name enclosed in double quotes"),
    "not_utf8": (b'{"kernel": "tiny\xff"}', "tuning/tiny/cpu.json:1:17: error[E120]: byte 0xff is not valid UTF-8"),
    "nan": (GOOD.replace('"ms": 0.5', '"ms": NaN'), "tuning/tiny/cpu.json:15:10: error[E120]: `NaN` is not a number: tuning files hold finite numbers only"),
    "infinity": (GOOD.replace('"bs": 8', '"bs": -Infinity'), "tuning/tiny/cpu.json:17:11: error[E120]: `-Infinity` is not a number: tuning files hold finite numbers only"),
    "wrong_type": (GOOD.replace('"bucket": [\n    64\n   ]', '"bucket": "64"'), "tuning/tiny/cpu.json:6:14: error[E121]: entries[0].bucket: '64' is not of type 'array'"),
    "unknown_key": (GOOD.replace('"case": "c",', '"case": "c",\n   "cost": 1,'), "tuning/tiny/cpu.json:10:4: error[E121]: entries[0]: `cost` is not a key of a tuning file"),
    "entries_not_a_list": ('{"device_kind": "cpu", "entries": {}, "kernel": "tiny"}', "tuning/tiny/cpu.json:1:35: error[E121]: entries: {} is not of type 'array'"),
    "untuned_param": (GOOD.replace('"bs": 8', '"bs": 8,\n    "warps": 4'), "tuning/tiny/cpu.json:18:5: error[E122]: entries[0]: `warps` is not a tuned param of interpret"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_tuning_file_is_a_located_error(name, tmp_path, kspec):
    content, first = BROKEN[name]
    if name == "untuned_param":  # an entry for this version of the kernel: stale ones are never embedded
        content = content.replace(SHA, _sha(tmp_path))
    _project(tmp_path, content)
    for command in ("check", "generate"):
        r = kspec(command)
        assert r.rc == 2, r.both
        assert r.out.splitlines()[0] == first, r.out
        assert "Traceback" not in r.both
    assert not (tmp_path / "generated").exists()


def test_a_valid_tuning_file_is_embedded(tmp_path, kspec):
    _project(tmp_path, GOOD.replace(SHA, _sha(tmp_path)))
    r = kspec("generate")
    assert r.rc == 0, r.both
    assert "{'bs': 8}" in (tmp_path / "generated" / "tiny" / "_tuning.py").read_text()


def _sha(tmp_path) -> str:
    from kspec.codegen import project

    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "tiny.yaml").write_text(SPEC)
    return project.compile_spec(tmp_path / "specs" / "tiny.yaml").spec.kernel_sha


@pytest.mark.parametrize("kind, what", [("folder", "a folder"), ("fifo", "a FIFO"), ("dev_zero", "a character device")])
def test_a_tuning_file_that_is_not_a_regular_file_is_refused(kind, what, tmp_path, kspec):
    _project(tmp_path, None)
    path = tmp_path / "tuning" / "tiny" / "cpu.json"
    {"folder": path.mkdir, "fifo": lambda: os.mkfifo(path), "dev_zero": lambda: path.symlink_to("/dev/zero")}[kind]()
    r = kspec("check", timeout=30)
    assert r.rc == 2, r.both
    assert r.out.splitlines()[0] == f"tuning/tiny/cpu.json:1:1: error[E110]: cannot read the tuning file: it is {what}, not a regular file"


def test_the_library_tuning_files_are_valid():
    from kspec.codegen.spec import tuning

    files = sorted((REPO / "tuning").glob("*/*.json"))
    assert files
    for path in files:
        assert tuning.read(path)[1] == [], path
