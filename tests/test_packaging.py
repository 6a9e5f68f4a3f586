"""kspec as a user installs it: the wheel holds one import package, `kspec`, with its schema,
templates and manual as package data, and the installed command runs a project's whole flow
outside the repository; the packages it generates import where kspec is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

SPEC = """\
kspec: 1
name: axpy
doc: a * x + y, elementwise.
params:
  bs: {default: 128, choices: [128, 256]}
  a: 2.0
inputs:
  x: {shape: [N], dtype: float32}
  y: {shape: [N], dtype: x}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  y: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = a * x_ref[...] + y_ref[...]
reference: |
  return a * x + y
cases:
  - {name: ragged, N: 1000}
"""


def test_the_wheel_lists_every_package_folder():
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"kspec", "kspec.schema", "kspec.templates", "kspec.docs"}
    for top in ("codegen", "generated"):
        folders |= {"kspec." + ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / top).rglob("__init__.py")}
    assert sorted(folders - declared) == [], "add these to [tool.setuptools] packages in pyproject.toml"
    assert sorted(declared - folders) == [], "pyproject.toml lists packages that do not exist"


def _venv(path: Path, deps: bool) -> Path:
    """A fresh virtual environment; with `deps`, this environment's site-packages are reachable
    through a .pth (a path line: the .pth files there, the editable kspec's among them, are not
    processed). Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    if deps:
        Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(REPO)], check=True, capture_output=True)
    (path,) = out.glob("kspec-*.whl")
    return path


def test_the_wheel_holds_one_import_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"kspec"}
    for needed in ("kspec/__main__.py", "kspec/cli.py", "kspec/schema/kspec.schema.json", "kspec/schema/tuning.schema.json",
                   "kspec/templates/kernel.py.j2", "kspec/docs/verify.md", "kspec/generated/softmax/__init__.py"):
        assert needed in names, needed


def test_the_installed_kspec_runs_a_project_outside_the_repository(wheel, tmp_path):
    python = _venv(tmp_path / "venv", deps=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip(), str(wheel)],
                   check=True, capture_output=True)
    where = subprocess.run([python, "-c", "import kspec; print(kspec.__file__)"], capture_output=True, text=True, check=True)
    assert str(tmp_path / "venv") in where.stdout, where.stdout  # the installed copy, not the repository's

    project = tmp_path / "proj"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def kspec(*args):
        r = subprocess.run([python, "-m", "kspec", *args], cwd=project, capture_output=True, text=True, env=env, timeout=600)
        return r.returncode, r.stdout + r.stderr

    assert kspec("--version")[1].startswith("kspec ")
    assert kspec("init")[0] == 0
    (project / "specs" / "axpy.yaml").write_text(SPEC)
    for args, says in [(("check",), "2 spec(s) OK"), (("generate",), "axpy: "), (("generate", "--check"), "up to date"),
                       (("verify", "--backend", "interpret"), " 0 failed, 0 errors")]:
        rc, out = kspec(*args)
        assert rc == 0 and says in out, out
    bare = _venv(tmp_path / "bare", deps=True)  # jax and numpy, and no kspec: the wheel is not installed here
    code = ("import importlib.util, numpy as np\n"
            "assert importlib.util.find_spec('kspec') is None\n"
            "from generated.axpy import axpy\n"
            "x = np.arange(1000, dtype=np.float32); y = np.ones(1000, np.float32)\n"
            "assert np.allclose(axpy(x, y), 2 * x + y)\n")
    r = subprocess.run([bare, "-c", code], cwd=project, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
