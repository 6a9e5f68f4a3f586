"""Shared helpers: a tiny valid spec, a tmp_path project, and two ways to run `kspec`.

Where the tests are:

    tests/test_*.py           end to end: the `kspec` command on spec files in a tmp_path project
                              (check, generate, verify, bench, tune), and the generated packages
                              run on JAX
    tests/unit/<package>/     unit tests of one sub-package of kspec.codegen (spec/, emit/,
                              backends/, checks/, ...): small models built through the real
                              pipeline functions (loader -> schema -> model), no kspec process
    tests/planted/            specs with planted bugs that `kspec verify` must catch

Two ways to run `kspec`, both returning Result(rc, out, err):

- in this process (`invoke_kspec`, and the `kspec` fixture): typer's CliRunner over
  kspec.cli.app, in the given working directory, stdout and stderr captured apart. No
  interpreter start-up, so use it unless a process boundary is what the test is about.
  An exception that escapes the CLI fails the test with its traceback (the console entry
  point would turn it into exit 3). `kspec verify`, `bench` and `tune` still run their
  kernels in worker processes, as they do for a user.
- in a subprocess (`run_kspec`): `python -m kspec`, as a user runs it. For the exit codes
  of the real entry point, signals, timeouts, processes killed or run side by side, worker
  processes that die, `python -m kspec` itself, the environment, stdin.

Every test that runs `kspec` does so in its own tmp_path, with the spec under
tmp_path/specs/, so nothing in the repository is read or written, and a spec that
managed to run code (it must not) would leave its MARKER file there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kspec.codegen import project

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """The tests marked `heavy` (a minute or more) first, the others in their order after them: the
    suite's two processes (pytest-xdist) then share out the short tests at the end and finish
    together, instead of one of them starting a long test when the other is done."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)

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

    def __iter__(self):
        """`rc, out, err = kspec(...)`."""
        return iter((self.rc, self.out, self.err))


# What a terminal-less user's environment holds for kspec: no colours, a wide terminal.
CLI_ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def run_kspec(*args: str, cwd: Path, timeout: float = 60) -> Result:
    """`python -m kspec *args` in a subprocess, in `cwd`."""
    env = dict(os.environ, PYTHONPATH=str(REPO), **CLI_ENV)
    proc = subprocess.run(
        [*KSPEC, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
    )
    decode = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    return Result(proc.returncode, decode(proc.stdout), decode(proc.stderr))


class KspecTimeout(Exception):
    """An in-process run took longer than its timeout."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise KspecTimeout in the run after `seconds` (a subprocess run's timeout kills it instead)."""

    def expire(signum, frame):
        raise KspecTimeout(f"kspec did not finish in {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _process_state():
    """Put back the process-wide state a run could change, whatever it did: the environment,
    sys.path, the umask, the warnings filters, the root logger, the handlers of the signals a
    CLI may take over; and stop worker processes a run left behind (a leak: the test fails).

    The CLI keeps three lru_caches (spec/schema.py: the schema and its validator; emit/render.py:
    the Jinja environment). They hold package data that no run changes, so they stay warm
    from run to run, as they would in a long-lived process; everything a run reads from its
    project (specs, generated/, tuning/) is read afresh each time."""
    environ, path, mask = dict(os.environ), list(sys.path), os.umask(0o022)
    os.umask(mask)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    children = set(multiprocessing.active_children())
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for key in os.environ.keys() - environ.keys():  # only what changed: jax's threads may be reading it
            del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        sys.path[:] = path
        os.umask(mask)
        project._current.clear()  # the project the run found, for the next run (or test) to find its own
        root.handlers[:], root.level = handlers, level
        for s, handler in signals.items():
            signal.signal(s, handler)
        left = [p for p in multiprocessing.active_children() if p not in children]
        for p in left:
            p.kill()
            p.join(5)
    assert not left, f"kspec left {len(left)} worker process(es) running"


def _runner():
    from typer.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)  # click < 8.2: stderr apart only when asked
    except TypeError:
        return CliRunner()  # typer's own runner and click >= 8.2 keep them apart


def invoke_kspec(*args, cwd: Path, timeout: float = 60) -> Result:
    """`kspec *args` in this process, in `cwd`: as run_kspec, without starting an interpreter.

    An exception that escapes the CLI propagates (the test fails with its traceback)."""
    from kspec import cli

    with _process_state(), contextlib.chdir(cwd), _deadline(timeout):
        r = _runner().invoke(cli.app, [str(a) for a in args], env=CLI_ENV, catch_exceptions=False,
                             prog_name="python -m kspec")
    return Result(r.exit_code, r.stdout, r.stderr)


@pytest.fixture
def kspec(tmp_path):
    """kspec("check", "specs/x.yaml") -> Result, run in this process with tmp_path as the cwd."""

    def run(*args, cwd: Path | None = None, timeout: float = 60) -> Result:
        return invoke_kspec(*args, cwd=cwd or tmp_path, timeout=timeout)

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


def keep_only(root: Path, *names: str) -> Path:
    """Cut a copy of the repository down to the specs `names`, with their generated packages and tuning
    folders: for a test of `generate` or `check` whose subject is one or two specs, without checking and
    rendering the whole library each time it runs the CLI (test_generate checks the whole library's)."""
    for spec in (root / "specs").glob("*.yaml"):
        if spec.stem not in names:
            spec.unlink()
    for folder in ("generated", "tuning"):
        for package in (root / folder).iterdir() if (root / folder).is_dir() else ():
            if package.is_dir() and package.name not in names:
                shutil.rmtree(package)
    return root


# -- models for the unit tests: through the real stages, no kspec process ---------------------


def build_spec(text: str, path: str = "specs/tiny.yaml"):
    """The KernelSpec of spec `text`: loader -> schema -> model, as `kspec check` builds it (before
    the semantic checks). Raises SpecError with the diagnostics of a spec those stages refuse."""
    from kspec.codegen.spec import loader, model, schema

    doc = loader.load_text(text, path)
    schema.validate(doc)
    return model.build(doc)


def instance(spec, backend: str = "interpret", case: int = 0, dtypes: dict | None = None) -> tuple:
    """(Instance or None, diagnostics): `spec`'s variant for `backend` evaluated for its case number
    `case`, with `dtypes` (default: the case's first dtype combination), grid walk included."""
    from kspec.codegen.checks import instances

    chosen = spec.cases[case]
    dtypes = dtypes or next(iter(instances.dtype_assignments(spec, chosen)))
    return instances.instantiate(spec, spec.variants[backend], chosen, dtypes)


def declared(rows) -> list:
    """The result rows of the cases a spec declares: those verify derives (codegen/checks/derive.py)
    left out, for tests that pin a run's rows."""
    from kspec.codegen.checks.derive import PREFIX

    return [r for r in rows if not r["case"].startswith(PREFIX)]
