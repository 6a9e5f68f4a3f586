"""Hostile and odd spec files: refused fast with a located error, or rendered as inert text.

Every refused input must give exit code 2, a `path:line:col: error[CODE]` line, no
traceback, nothing under generated/, and must not run anything (the payloads try to
create a MARKER file in the working directory, which is tmp_path).
"""

from __future__ import annotations

import ast
import os
import warnings
from pathlib import Path

import pytest

from conftest import VALID_SPEC, mutate

V = VALID_SPEC
X_BLOCK = 'x: {block_shape: [bs], index_map: "i -> (i,)"}'
GRID = 'grid: ["cdiv(N, bs)"]'
TOUCH = "touch MARKER"

BILLION_LAUGHS = b"""\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""

# id -> (file content, the diagnostic's `line:col: error[CODE]`)
REJECTED = {
    "malformed": (b"name: [\n  - : :\n", "2:3: error[E101]"),
    "unclosed_quote": (mutate(V, ("name: tiny", 'name: "tiny')), "10:9: error[E101]"),
    "tab_indent": (b"name:\ttiny\n\tdoc: x\n", "1:6: error[E101]"),
    "two_documents": (V + "---\n" + V, "20:1: error[E101]"),
    "python_apply": (mutate(V, ("  bs: 8", f"  bs: !!python/object/apply:os.system ['{TOUCH}']")), "5:7: error[E104]"),
    "python_name": (mutate(V, ("name: tiny", "name: !!python/name:os.system")), "2:7: error[E104]"),
    "python_object": (b"!!python/object:os.system {}\n", "1:1: error[E104]"),
    "python_module": (mutate(V, ("  bs: 8", "  bs: !!python/module:os")), "5:7: error[E104]"),
    "local_tag": (mutate(V, ("  bs: 8", "  bs: !foo 8")), "5:7: error[E104]"),
    "binary_tag": (mutate(V, ("Doubles a vector.", "!!binary aGVsbG8=")), "3:6: error[E104]"),
    "set_tag": (mutate(V, ("  bs: 8", "  bs: !!set {a, b}")), "5:7: error[E104]"),
    "merge_key": (mutate(V, ("  bs: 8", "  <<: {bs: 8}")), "5:3: error[E104]"),
    "billion_laughs": (BILLION_LAUGHS, "1:4: error[E103]"),
    "alias_only": (mutate(V, ("  bs: 8", "  bs: *b")), "5:7: error[E103]"),
    "duplicate_key": (mutate(V, ("name: tiny", "name: tiny\nname: other")), "3:1: error[E102]"),
    "duplicate_nested_key": (mutate(V, ("  bs: 8", "  bs: 8\n  bs: 16")), "6:3: error[E102]"),
    "binary_junk": (bytes(range(256)) * 4, "2:118: error[E107]"),
    "invalid_utf8": (V.encode().replace(b"Doubles", b"Dou\xffbles"), "3:9: error[E107]"),
    "utf16": (V.encode("utf-16"), "1:1: error[E107]"),
    "nul_byte": (V.encode().replace(b"Doubles", b"Dou\x00bles"), "3:9: error[E107]"),
    "nul_escape": (mutate(V, ("Doubles a vector.", '"a\\0b"')), "3:6: error[E107]"),
    "lone_surrogate_escape": (mutate(V, ("Doubles a vector.", '"\\ud800"')), "3:6: error[E107]"),
    "empty": (b"", "1:1: error[E106]"),
    "only_whitespace": (b"  \n\n", "1:1: error[E106]"),
    "only_comment": (b"# nothing here\n", "1:1: error[E106]"),
    "top_level_list": (b"- name: tiny\n- doc: x\n", "1:1: error[E106]"),
    "top_level_scalar": (b"hello\n", "1:1: error[E106]"),
    "deep_brackets": (b"[" * 10_000, "1:33: error[E108]"),
    "deep_mappings": (b"a: " + b"{b: " * 5_000, "1:125: error[E108]"),
    "two_mib": (b"# " + b"x" * (2 << 20) + b"\n", "1:1: error[E105]"),
    "huge_int_dim": (mutate(V, ("N: 64", "N: " + "9" * 5_000)), "19:18: error[E109]"),
    "huge_int_param": (mutate(V, ("  bs: 8", "  bs: " + "1" * 100)), "5:7: error[E109]"),
    "long_string": (mutate(V, ("Doubles a vector.", "x" * 70_000)), "3:6: error[E109]"),
    "name_with_newline_and_code": (
        mutate(V, ("name: tiny", f"name: \"tiny\\nimport os; os.system('{TOUCH}')\"")),
        "2:7: error[E200]",
    ),
    "name_is_keyword": (mutate(V, ("name: tiny", "name: class")), "1:1: error[E400]"),
    "name_is_module": (mutate(V, ("name: tiny", "name: jax")), "1:1: error[E400]"),
    "non_string_key": (b"? [a, b]\n: 1\n", "1:3: error[E200]"),
    "index_map_import": (
        mutate(V, (X_BLOCK, f"x: {{block_shape: [bs], index_map: \"i -> (__import__('os').system('{TOUCH}'),)\"}}")),
        "12:44: error[E300]",
    ),
    "index_map_attribute": (mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> (i.real,)"}')), "12:44: error[E300]"),
    "index_map_lambda": (mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> ((lambda: 1)(),)"}')), "12:44: error[E300]"),
    "index_map_two_arrows": (mutate(V, (X_BLOCK, 'x: {block_shape: [bs], index_map: "i -> j -> (i,)"}')), "12:38: error[E302]"),
    "grid_open": (mutate(V, (GRID, "grid: [\"len(open('MARKER', 'w').name)\"]")), "10:9: error[E300]"),
    "grid_walrus": (mutate(V, (GRID, 'grid: ["(q := N)"]')), "10:10: error[E300]"),
    "grid_fstring": (mutate(V, (GRID, "grid: [\"f'{N}'\"]")), "10:9: error[E300]"),
    "grid_dunder": (mutate(V, (GRID, 'grid: ["N.__class__"]')), "10:9: error[E300]"),
    "grid_power_tower": (mutate(V, (GRID, 'grid: ["' + "*".join(["N"] * 200) + '"]')), "10:8: error[E303]"),
    "grid_deep_parens": (mutate(V, (GRID, 'grid: ["' + "(" * 300 + "N" + ")" * 300 + '"]')), "10:209: error[E300]"),
    "grid_float": (mutate(V, ("  bs: 8", "  bs: 8.5")), "10:8: error[E303]"),
    "grid_infinite": (mutate(V, ("  bs: 8", "  bs: 1e99999")), "10:8: error[E303]"),
    "param_nan": (mutate(V, ("  bs: 8", "  bs: .nan")), "5:7: error[E203]"),
    "grid_boolean": (mutate(V, (GRID, 'grid: ["N > 2"]')), "10:8: error[E303]"),
    "body_deep_parens": (mutate(V, ("o_ref[...] = x_ref[...] * 2", "o_ref[...] = " + "(" * 300 + "1" + ")" * 300)), "15:216: error[E600]"),
    "body_import": (mutate(V, ("o_ref[...] = x_ref[...] * 2", "import subprocess_tools\n  o_ref[...] = 1")), "15:3: error[E601]"),
    "dtype_follows_itself": (mutate(V, ("dtype: float32", "dtype: x")), "7:26: error[E407]"),
    "scratch_without_dtype": (mutate(V, ("cases:", "scratch:\n  acc: {shape: [bs]}\ncases:")), "19:3: error[E202]"),
}
# Inputs built to be slow if a limit were missing: each must be refused quickly.
BOMBS = {"billion_laughs", "deep_brackets", "deep_mappings", "two_mib", "huge_int_dim", "grid_power_tower",
         "grid_deep_parens", "body_deep_parens", "long_string"}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected(name, kspec, write_spec, tmp_path):
    content, where = REJECTED[name]
    path = write_spec(content, "hostile")
    r = kspec("generate", path)
    assert r.rc == 2, r.both
    assert r.out.startswith(f"{path.as_posix()}:{where}: "), r.out
    assert "Traceback" not in r.both
    assert r.err == ""
    assert not (tmp_path / "generated").exists()
    assert not (tmp_path / "MARKER").exists()  # the bombs' work and memory bounds: test_bounds.py


def test_nan_is_refused_where_it_is_written(kspec, write_spec):
    path = write_spec(mutate(V, ("  bs: 8", "  bs: .NaN")))
    r = kspec("check", path)
    assert r.rc == 2
    assert r.out.splitlines()[0] == (f"{path.as_posix()}:5:7: error[E203]: `.NaN` is not a number: a spec's "
                                     "numbers may not be NaN")


def test_huge_grid_is_checked_fast(kspec, write_spec, tmp_path):
    """2**37 grid points: the checks sample the grid instead of walking (or listing) it
    (test_bounds.py counts the work of such grids)."""
    path = write_spec(mutate(V, ("N: 64", "N: 1073741820")))  # not a multiple of bs: a ragged case, no W902
    r = kspec("check", path)
    assert (r.rc, r.out) == (0, "1 spec(s) OK\n"), r.both


def test_missing_file(kspec, tmp_path):
    r = kspec("check", "specs/nope.yaml")
    assert r.rc == 2
    assert r.out.startswith("specs/nope.yaml:1:1: error[E100]: ")
    assert "Traceback" not in r.both


def test_directory_named_like_a_spec(kspec, tmp_path):
    (tmp_path / "specs" / "dir.yaml").mkdir(parents=True)
    r = kspec("check", "specs/dir.yaml")
    assert r.rc == 2
    assert "Traceback" not in r.both


# -- accepted but tricky: spec text must reach generated code as inert data ------------

TRICKY_DOCS = {
    "triple_quotes": 'Has """ triple quotes """ inside',
    "jinja": "Has {{ name }} and {% if x %}y{% endif %} and {# c #} inside",
    "escape": 'Ends with a quote and a backslash \\ "',
    "breakout": 'x""";__import__("os").system("touch MARKER");"""#',
    "single_quotes": "'''; raise SystemExit; '''",
    "ends_with_triple_quote": 'Ends with """',
}
def _docs():
    return [pytest.param(name, id=name) for name in sorted(TRICKY_DOCS)]


def _generated(tmp_path) -> dict:
    files = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "generated" / "tiny").glob("*.py")}
    assert files
    for name, text in files.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an invalid escape sequence means text was not escaped
            tree = ast.parse(text, filename=name)
        called = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "__import__" not in called and "SystemExit" not in called, name
    return files


def _generate_with(doc: str, old: str, new: str, kspec, write_spec, tmp_path) -> tuple:
    """Generate the valid spec with `old` replaced by `new` (holding {doc}, YAML-quoted).

    Returns (module docstring of __init__.py, docstring of the interpret kernel function).
    """
    quoted = "'" + doc.replace("'", "''") + "'"
    path = write_spec(mutate(V, (old, new.format(doc=quoted))))
    r = kspec("generate", path)
    assert r.rc == 0, r.both
    files = _generated(tmp_path)
    kernel = ast.parse(files["interpret.py"])
    fn = next(n for n in kernel.body if isinstance(n, ast.FunctionDef) and n.name == "tiny")
    assert not (tmp_path / "MARKER").exists()
    return ast.get_docstring(ast.parse(files["__init__.py"]), clean=False), ast.get_docstring(fn, clean=False)


@pytest.mark.parametrize("name", _docs())
def test_tricky_kernel_doc_is_literal(name, kspec, write_spec, tmp_path):
    doc = TRICKY_DOCS[name]
    module_doc, fn_doc = _generate_with(doc, "doc: Doubles a vector.", "doc: {doc}", kspec, write_spec, tmp_path)
    assert module_doc.startswith(doc + "\n")
    assert fn_doc.startswith(doc + "\n")


@pytest.mark.parametrize("name", _docs())
def test_tricky_param_doc_is_literal(name, kspec, write_spec, tmp_path):
    doc = TRICKY_DOCS[name]
    _, fn_doc = _generate_with(doc, "  bs: 8", "  bs: {{default: 8, doc: {doc}}}", kspec, write_spec, tmp_path)
    assert f"bs: {doc} Default: 8." in fn_doc


@pytest.mark.parametrize("name", _docs())
def test_tricky_operand_doc_is_literal(name, kspec, write_spec, tmp_path):
    doc = TRICKY_DOCS[name]
    old = "x: {shape: [N], dtype: float32}"
    _, fn_doc = _generate_with(doc, old, "x: {{shape: [N], dtype: float32, doc: {doc}}}", kspec, write_spec, tmp_path)
    assert f"x: [N] float32. {doc}" in fn_doc


def test_jinja_in_body_is_literal(kspec, write_spec, tmp_path):
    line = "o_ref[...] = x_ref[...] * 2  # {{ name }} {% raw %} {#"
    path = write_spec(mutate(V, ("o_ref[...] = x_ref[...] * 2", line)))
    r = kspec("generate", path)
    assert r.rc == 0, r.both
    assert "    " + line + "\n" in _generated(tmp_path)["interpret.py"]


def _special(tmp_path, kind: str) -> Path:
    """A spec path that is not a regular file: a FIFO (reading it would block), a link to
    /dev/zero (reading it would never end) or a folder."""
    path = tmp_path / "specs" / "special.yaml"
    path.parent.mkdir(exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO"), ("dev_zero", "a character device"), ("folder", "a folder")])
def test_a_spec_that_is_not_a_regular_file_is_refused(kind, what, kspec, tmp_path):
    _special(tmp_path, kind)
    r = kspec("check", "specs/special.yaml", timeout=30)
    assert r.rc == 2, r.both
    assert r.out.splitlines()[0] == f"specs/special.yaml:1:1: error[E110]: cannot read the spec file: it is {what}, not a regular file"


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_backward_spec_that_is_not_a_regular_file_is_refused(kind, kspec, write_spec, tmp_path):
    _special(tmp_path, kind).rename(tmp_path / "specs" / "dx.yaml")
    vjp = "vjp:\n  backward:\n    - spec: dx.yaml\n      inputs: {g: grad(o)}\n      grads: {dx: x}\n"
    path = write_spec(V + vjp)
    r = kspec("check", path, timeout=30)
    assert r.rc == 2, r.both
    assert "error[E420]" in r.out and "not a regular file" in r.out, r.out


@pytest.mark.parametrize("value, says", [(".inf", "inf is greater than the maximum of 1000"), ("1.0e6", "1000000.0 is greater than the maximum of 1000")])
def test_a_tolerance_that_would_pass_anything_is_refused(value, says, kspec, write_spec):
    path = write_spec(mutate(V, ("cases:", f"tolerance: {{float32: {{atol: {value}}}}}\ncases:")))
    r = kspec("check", path)
    assert r.rc == 2
    assert r.out.splitlines()[0] == f"{path.as_posix()}:18:29: error[E200]: tolerance.float32.atol: {says}"
