"""kspec in a project of the user's own: `kspec init`, the configuration (kspec.toml or
[tool.kspec]), the project found upward from the working directory, and nothing written outside it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import VALID_SPEC


def test_init_makes_a_project_that_checks_generates_and_verifies(tmp_path, kspec):
    r = kspec("init")
    assert r.rc == 0, r.both
    assert r.out.splitlines()[:4] == [
        "created kspec.toml",
        "created specs/scale_rows.yaml",
        "created .kspec/kspec.schema.json (the schema the specs' $schema comment names, for editors)",
        "created .gitignore",
    ]
    assert (tmp_path / ".gitignore").read_text().splitlines() == ["generated/.kspec.lock", ".kspec/cache/", "__pycache__/"]
    assert kspec("check").out == "1 spec(s) OK\n"
    assert kspec("generate").rc == 0
    assert kspec("generate", "--check").rc == 0
    r = kspec("verify", "--backend", "interpret", timeout=300)
    assert r.rc == 0 and r.out.splitlines()[-1] == "6 passed, 0 failed, 0 errors, 0 skipped", r.both
    run = subprocess.run([sys.executable, "-c", "import numpy as np; from generated.scale_rows import scale_rows; "
                          "x = np.ones((40, 128), np.float32); w = np.arange(40, dtype=np.float32)[:, None]; "
                          "assert np.allclose(scale_rows(x, w), x * w)"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_init_adds_to_an_existing_pyproject_and_refuses_to_run_twice(tmp_path, kspec):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    (tmp_path / ".gitignore").write_text(".venv/\n")
    assert kspec("init").rc == 0
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith('[project]\nname = "mine"\n') and "[tool.kspec]" in text
    assert (tmp_path / ".gitignore").read_text().splitlines() == [".venv/", "generated/.kspec.lock", ".kspec/cache/", "__pycache__/"]
    r = kspec("init")
    assert r.rc == 2
    assert r.out.splitlines() == [
        "pyproject.toml:1:1: error[E142]: is already a kspec project's configuration; kspec init writes nothing over it",
        "specs/scale_rows.yaml:1:1: error[E142]: exists; kspec init writes nothing over it",
    ]


def test_the_project_is_found_from_a_subfolder(tmp_path, kspec):
    assert kspec("init").rc == 0
    (tmp_path / "src" / "deep").mkdir(parents=True)
    r = kspec("generate", cwd=tmp_path / "src" / "deep")
    assert r.rc == 0 and r.out.startswith("scale_rows: 6 file(s) written"), r.both
    assert (tmp_path / "generated" / "scale_rows" / "__init__.py").exists()
    assert not (tmp_path / "src" / "generated").exists()


def test_the_configuration_names_the_folders_and_the_import_path(tmp_path, kspec, write_spec):
    (tmp_path / "kspec.toml").write_text('specs = "kernels"\nout = "src/app/gen"\npackage = "app.gen"\n')
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "tiny.yaml").write_text(VALID_SPEC)
    r = kspec("generate")
    assert r.rc == 0, r.both
    init = (tmp_path / "src" / "app" / "gen" / "tiny" / "__init__.py").read_text()
    assert "    from app.gen.tiny import tiny, tiny_reference\n" in init
    assert kspec("generate", "--check").rc == 0


def test_a_spec_outside_the_specs_folder_writes_into_the_project(tmp_path, kspec):
    """`kspec generate row.yaml` in a project folder writes generated/ there, not beside its parent."""
    (tmp_path / "kspec.toml").write_text("")
    (tmp_path / "row.yaml").write_text(VALID_SPEC)
    assert kspec("generate", "row.yaml").rc == 0
    assert (tmp_path / "generated" / "tiny").is_dir() and not (tmp_path.parent / "generated" / "tiny").exists()


@pytest.mark.parametrize("config, first", [
    ('specs = "specs"\nouts = "x"\n', "kspec.toml:2:1: error[E140]: unknown key `outs` in the kspec configuration"),
    ('out = 3\n', "kspec.toml:1:1: error[E140]: `out` must be a non-empty string (the folder generate writes the packages to (default generated))"),
    ('out = "../elsewhere"\n', "kspec.toml:1:1: error[E141]: out `../elsewhere` is outside the project at {root}"),
    ('package = "my-kernels"\n', "kspec.toml:1:1: error[E140]: package `my-kernels` is not an import path"),
    ("out = [\n", "kspec.toml:1:1: error[E140]: not valid TOML: "),
])
def test_a_bad_configuration_is_a_located_error(config, first, tmp_path, kspec, write_spec):
    (tmp_path / "kspec.toml").write_text(config)
    write_spec(VALID_SPEC)
    r = kspec("check")
    assert r.rc == 2
    assert r.out.splitlines()[0].startswith(first.format(root=tmp_path.resolve())), r.out


def test_out_outside_the_project_is_refused(tmp_path, kspec, write_spec):
    write_spec(VALID_SPEC)
    r = kspec("generate", "--out", str(tmp_path.parent / "elsewhere"))
    assert r.rc == 2
    assert r.out.splitlines()[0] == (f"{tmp_path.parent / 'elsewhere'}:1:1: error[E141]: out `{tmp_path.parent / 'elsewhere'}` "
                                     f"is outside the project at {tmp_path.resolve()}")
    assert not (tmp_path.parent / "elsewhere").exists()
    assert kspec("generate", "--out", "build/gen").rc == 0
    assert (tmp_path / "build" / "gen" / "tiny" / "__init__.py").exists()


def test_schema_prints_the_format(kspec):
    import json

    assert json.loads(kspec("schema").out)["title"] == "kspec kernel spec, format v1"
    assert json.loads(kspec("schema", "--tuning").out)["title"] == "kspec tuning file"
