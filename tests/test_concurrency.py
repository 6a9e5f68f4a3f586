"""`kspec generate` killed mid-way, or run several times at once, never leaves a broken file.

Writes go to a temporary file that is renamed into place, under an flock on
generated/.kspec.lock. The kill loop SIGKILLs real `kspec generate` processes at
random moments while they rewrite a project whose specs alternate between two
versions: every generated file must then be, byte for byte, one of the two rendered
versions. (A hand-edited file is never overwritten without --force: see
test_generate.py::test_hand_edited_file_is_refused_then_forced.)
"""

from __future__ import annotations

import ast
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kspec.codegen import project as pipeline
from conftest import KSPEC, REPO, invoke_kspec

SPECS = ("add.yaml", "add_1d.yaml", "softmax.yaml", "softmax_dx.yaml")  # quick to check, 30-odd files to write


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")


def _version(text: str, which: int) -> str:
    """The spec with its first line after `doc:` marked by version: changes every file's banner."""
    return text.replace("\ndoc: ", f"\ndoc: (v{which}) ", 1)


def _set_version(root: Path, which: int) -> None:
    for name in SPECS:
        (root / "specs" / name).write_text(_version((REPO / "specs" / name).read_text(), which))


def _expected(root: Path) -> dict:
    """{path: {version: text}} for both versions of every planned file."""
    out: dict = {}
    for which in (0, 1):
        _set_version(root, which)
        for name in SPECS:
            compiled = pipeline.compile_spec(root / "specs" / name)
            assert compiled.ok
            _, planned = pipeline.plan(compiled, root / "generated")
            for path, text in planned.items():
                out.setdefault(path, {})[which] = text
    return out


def _generate(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*KSPEC, "generate", *args], cwd=root, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "specs").mkdir()
    return tmp_path


def _assert_each_file_whole(expected: dict) -> list:
    """Every planned file exists, parses, and is exactly one version; returns the versions seen."""
    seen = []
    for path, versions in expected.items():
        text = path.read_text(encoding="utf-8")
        assert text in versions.values(), f"{path} is neither version"
        ast.parse(text)
        seen.append(next(v for v, t in versions.items() if t == text))
    return seen


@pytest.mark.parametrize("kills", [12, pytest.param(200, marks=pytest.mark.slow)])
def test_generate_killed_at_random_moments_leaves_whole_files(project, kills):
    expected = _expected(project)
    _set_version(project, 0)
    start = time.monotonic()
    assert _generate(project).wait(timeout=120) == 0
    full = time.monotonic() - start  # one full run: kill anywhere in [start-up, end]
    rng = random.Random(1234)
    outcomes = {"killed": 0, "finished": 0, "mixed": 0}
    for i in range(kills):
        _set_version(project, (i + 1) % 2)
        proc = _generate(project)
        time.sleep(rng.uniform(0.4 * full, 1.1 * full))
        proc.send_signal(signal.SIGKILL)
        outcomes["killed" if proc.wait(timeout=60) == -signal.SIGKILL else "finished"] += 1
        seen = _assert_each_file_whole(expected)
        outcomes["mixed"] += len(set(seen)) > 1  # killed between two renames
    print(f"\n{kills} kills: {outcomes}")
    assert outcomes["killed"], outcomes
    # a complete run after all that converges, and sweeps the killed runs' temporary files
    assert invoke_kspec("generate", cwd=project, timeout=120).rc == 0
    assert set(_assert_each_file_whole(expected)) == {kills % 2}
    assert not [p for p in (project / "generated").rglob("*.tmp")]
    r = invoke_kspec("generate", "--check", cwd=project)
    assert r.rc == 0, r.out


@pytest.mark.parametrize("runs", [4])
def test_concurrent_generates_do_not_corrupt_output(project, runs):
    expected = _expected(project)
    _set_version(project, 0)
    assert invoke_kspec("generate", cwd=project, timeout=120).rc == 0
    _set_version(project, 1)
    procs = [_generate(project) for _ in range(runs)]
    assert [p.wait(timeout=180) for p in procs] == [0] * runs
    assert set(_assert_each_file_whole(expected)) == {1}
    assert (project / "generated" / ".kspec.lock").exists()
    assert not [p for p in (project / "generated").rglob("*.tmp")]


def test_concurrent_generates_into_an_empty_folder(project):
    """Racing to create generated/ and its __init__.py: all succeed, one consistent tree."""
    expected = _expected(project)
    shutil.rmtree(project / "generated", ignore_errors=True)
    _set_version(project, 1)
    procs = [_generate(project) for _ in range(4)]
    assert [p.wait(timeout=180) for p in procs] == [0] * 4
    assert set(_assert_each_file_whole(expected)) == {1}
    for path, text in pipeline.root_files(project / "generated").items():
        assert path.read_text() == text


def test_leftover_temporary_files_are_swept(project):
    """What a SIGKILL between mkstemp and rename leaves behind is removed by the next write."""
    _set_version(project, 0)
    assert invoke_kspec("generate", cwd=project, timeout=120).rc == 0
    kernel = project / "generated" / "add"
    orphan = kernel / ".interpret.py.abc123.tmp"
    orphan.write_text("half a fi")
    _set_version(project, 1)
    assert invoke_kspec("generate", cwd=project, timeout=120).rc == 0
    assert not orphan.exists()
