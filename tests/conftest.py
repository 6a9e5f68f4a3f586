"""Shared helpers: a tiny valid spec, and `kspec` run as a user runs it (a subprocess).

Every test that runs `kspec` does so in its own tmp_path, with the spec under
tmp_path/specs/, so nothing in the repository is read or written, and a spec that
managed to run code (it must not) would leave its MARKER file there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The smallest spec that exercises every section the checks read: a param, an
# input, an output sharing its dtype, a grid, blocks, a body, a reference, a case.
# Bad-spec tests change one line of it (see `mutate`); line numbers below matter.
VALID_SPEC = """\
kspec: 1
name: tiny
doc: Doubles a vector.
params:
  bs: 8
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
cases:
  - {name: c, N: 64}
"""

# `python -m kspec` runs what the `kspec` console script runs.
KSPEC = [sys.executable, "-m", "kspec"]


# The library's project configuration ([tool.kspec] in the repository's pyproject.toml): a copy of
# specs/ and generated/ needs it to render the same bytes (the docstrings name its import path).
LIBRARY_CONFIG = 'specs = "specs"\nout = "generated"\npackage = "kspec.generated"\ntuning = "tuning"\n'


def mutate(text: str, *replacements: tuple) -> str:
    """Replace each `old` by `new` once; fail loudly if `old` is not in the text."""
    for old, new in replacements:
        assert old in text, f"mutation target not in spec: {old!r}"
        text = text.replace(old, new, 1)
    return text


@dataclasses.dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def both(self) -> str:
        return self.out + self.err


def run_kspec(*args: str, cwd: Path, timeout: float = 60) -> Result:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1", COLUMNS="200")
    proc = subprocess.run(
        [*KSPEC, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
    )
    decode = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    return Result(proc.returncode, decode(proc.stdout), decode(proc.stderr))


@pytest.fixture
def kspec(tmp_path):
    """kspec("check", "specs/x.yaml") -> Result, run with tmp_path as the cwd."""

    def run(*args, cwd: Path | None = None, timeout: float = 60) -> Result:
        return run_kspec(*args, cwd=cwd or tmp_path, timeout=timeout)

    return run


@pytest.fixture
def write_spec(tmp_path):
    """write_spec(text_or_bytes, name="tiny") -> the path relative to tmp_path."""

    def write(content, name: str = "tiny") -> Path:
        path = tmp_path / "specs" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path.relative_to(tmp_path)

    return write


@pytest.fixture
def repo_copy(tmp_path):
    """A copy of the repository's specs/ and generated/ (plus what generation reads)."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(REPO / "specs", root / "specs")
    shutil.copytree(REPO / "generated", root / "generated", ignore=shutil.ignore_patterns("__pycache__", ".kspec.lock"))
    if (REPO / "tuning").is_dir():  # generation embeds the tuning tables
        shutil.copytree(REPO / "tuning", root / "tuning")
    (root / "kspec.toml").write_text(LIBRARY_CONFIG)  # the repository's [tool.kspec]: the import path
    return root
