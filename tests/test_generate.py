"""`kspec generate`: drift, determinism, hand-edit protection, stale files, banners, imports."""

from __future__ import annotations

import ast
import hashlib
import stat
import sys
from pathlib import Path

import pytest

from kspec import __version__
from kspec.codegen import project as pipeline
from kspec.codegen.checks.semantic import ALLOWED_IMPORT_ROOTS
from conftest import REPO, invoke_kspec, keep_only, run_kspec


def _tree(root: Path) -> dict:
    """{relative path: bytes} of the .py files under root/generated."""
    gen = root / "generated"
    return {p.relative_to(gen).as_posix(): p.read_bytes() for p in sorted(gen.rglob("*.py"))}


def test_checked_in_generated_code_matches_the_specs():
    r = invoke_kspec("generate", "--check", cwd=REPO)
    assert r.rc == 0, r.both
    count = len(list((REPO / "specs").glob("*.yaml")))
    assert r.out.endswith(f"generated/ is up to date for {count} spec(s)\n")


def test_fresh_generation_equals_checked_in(repo_copy):
    """A fresh process (its own hash seed, nothing cached) renders the bytes checked in, which another
    process rendered: generation is deterministic across processes."""
    import shutil

    shutil.rmtree(repo_copy / "generated")
    r = run_kspec("generate", cwd=repo_copy, timeout=600)
    assert r.rc == 0, r.out + r.err
    assert _tree(repo_copy) == _tree(REPO)


# Specs whose rendering takes the most paths: a backward section, derived kernels, mesh kernels, scalar
# prefetch, sharding, grouped dims.
RENDERED_TWICE = ("flash_attention", "matmul_persistent", "matmul_bias_gelu_pingpong", "paged_attention", "gmm",
                  "layer_norm", "matmul_2d", "accumulate")


@pytest.mark.parametrize("name", RENDERED_TWICE)
def test_rendering_is_deterministic(name):
    """Within one process too: compiling and rendering a spec again gives the same files."""
    path = REPO / "specs" / f"{name}.yaml"
    first = pipeline.plan(pipeline.compile_spec(path), REPO / "generated")
    second = pipeline.plan(pipeline.compile_spec(path), REPO / "generated")
    assert first == second


@pytest.fixture
def add_copy(repo_copy):
    """The library's copy cut down to add and matmul: what these tests do to add, matmul must not see."""
    return keep_only(repo_copy, "add", "matmul")


def test_second_generate_writes_nothing(add_copy):
    r = invoke_kspec("generate", "specs/add.yaml", cwd=add_copy)
    assert r.rc == 0, r.both
    n = len(list((add_copy / "generated" / "add").glob("*.py")))
    assert r.out == f"add: 0 file(s) written, {n} unchanged -> generated/add\n"


def test_check_lists_files_that_drifted(add_copy):
    spec = add_copy / "specs" / "add.yaml"
    spec.write_text(spec.read_text().replace("Elementwise sum", "Elementwise total"))
    before = _tree(add_copy)
    r = invoke_kspec("generate", "--check", cwd=add_copy)
    assert r.rc == 1, r.both
    drifted = r.out.splitlines()
    # every add/ file carries the spec's sha256 in its banner, so all of them drift
    assert "generated/add/__init__.py: out of date" in drifted
    assert "generated/add/interpret.py: out of date" in drifted
    assert not any("matmul" in line for line in drifted)
    assert _tree(add_copy) == before  # --check writes nothing


def test_check_reports_a_missing_file(add_copy):
    (add_copy / "generated" / "add" / "triton.py").unlink()
    r = invoke_kspec("generate", "--check", cwd=add_copy)
    assert r.rc == 1
    assert "generated/add/triton.py: missing" in r.out.splitlines()


def test_hand_edited_file_is_refused_then_forced(add_copy):
    target = add_copy / "generated" / "add" / "interpret.py"
    edited = target.read_text() + "# my local tweak\n"
    target.write_text(edited)
    spec = add_copy / "specs" / "add.yaml"
    spec.write_text(spec.read_text().replace("Elementwise sum", "Elementwise total"))

    r = invoke_kspec("generate", "--check", cwd=add_copy)
    assert r.rc == 1
    assert "generated/add/interpret.py: edited by hand" in r.out.splitlines()

    r = invoke_kspec("generate", cwd=add_copy)
    assert r.rc == 1, r.both
    assert "generated/add/interpret.py: refused: edited by hand (use --force to overwrite)" in r.out
    assert target.read_text() == edited
    # all of the kernel's files are refused together, so the package stays consistent
    assert "Elementwise total" not in (add_copy / "generated" / "add" / "__init__.py").read_text()

    r = invoke_kspec("generate", "--force", cwd=add_copy)
    assert r.rc == 0, r.both
    assert "my local tweak" not in target.read_text()
    assert "Elementwise total" in target.read_text()
    assert invoke_kspec("generate", "--check", cwd=add_copy).rc == 0


def test_stale_generated_file_is_removed(add_copy):
    spec = add_copy / "specs" / "add.yaml"
    text = spec.read_text()
    triton = text[text.index("  triton:\n") : text.index("  mosaic_tpu:\n")]
    spec.write_text(text.replace(triton, ""))
    assert spec.read_text() != text
    r = invoke_kspec("generate", "specs/add.yaml", cwd=add_copy)
    assert r.rc == 0, r.both
    assert not (add_copy / "generated" / "add" / "triton.py").exists()
    assert "'triton'" not in (add_copy / "generated" / "add" / "__init__.py").read_text()


def test_hand_written_file_in_a_kernel_folder_is_kept(add_copy):
    mine = add_copy / "generated" / "add" / "notes.py"
    mine.write_text("# mine\n")
    r = invoke_kspec("generate", cwd=add_copy)
    assert r.rc == 1
    assert "generated/add/notes.py: refused: not generated by kspec; remove it or use --force" in r.out
    assert mine.read_text() == "# mine\n"
    assert invoke_kspec("generate", "--check", cwd=add_copy).out.count("notes.py") == 1
    assert invoke_kspec("generate", "--force", cwd=add_copy).rc == 0
    assert not mine.exists()


def _import_roots(tree: ast.AST) -> set:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted((REPO / "generated").rglob("*.py")), ids=lambda p: p.relative_to(REPO).as_posix())
def test_generated_modules_import_only_jax_numpy_and_stdlib(path):
    roots = _import_roots(ast.parse(path.read_text(encoding="utf-8")))
    assert roots <= {"jax", "numpy"} | set(sys.stdlib_module_names), roots
    assert ALLOWED_IMPORT_ROOTS == {"jax", "numpy"} | set(sys.stdlib_module_names)


@pytest.mark.parametrize("spec", sorted((REPO / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_banner(spec):
    sha = hashlib.sha256(spec.read_bytes()).hexdigest()
    name = spec.stem
    files = sorted((REPO / "generated" / name).glob("*.py"))
    assert files
    for path in files:
        head = path.read_text(encoding="utf-8").splitlines()[:4]
        assert head[0] == f"# Generated by kspec {__version__} from specs/{name}.yaml -- DO NOT EDIT."
        assert head[1] == f"# Regenerate with: kspec generate specs/{name}.yaml"
        assert head[2] == f"# spec-sha256: {sha}"
        assert head[3].startswith("# content-sha256: ")


def test_atomic_write_leaves_no_temp_files(add_copy):
    spec = add_copy / "specs" / "add.yaml"
    spec.write_text(spec.read_text().replace("Elementwise sum", "Elementwise total"))
    assert invoke_kspec("generate", cwd=add_copy).rc == 0
    leftovers = [p for p in (add_copy / "generated").rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_generated_files_have_ordinary_permissions(add_copy):
    import shutil

    shutil.rmtree(add_copy / "generated")
    assert invoke_kspec("generate", cwd=add_copy).rc == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (add_copy / "generated").rglob("*.py")}
    assert all(mode & 0o044 == 0o044 for mode in modes.values()), modes
