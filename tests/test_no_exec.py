"""`check` and `generate` run nothing from a spec, and generated code holds only what the templates make.

Every payload tries to create a MARKER file in the working directory (tmp_path). A
payload in a field that is a name, dtype or expression is refused with a located
diagnostic; in a free-text field it reaches the generated code only as string data:
the module's syntax tree, string constants blanked, equals that of the same spec
with harmless text. Body and reference code appear only inside their functions.
test_hostile.py covers the kernel, param and operand docs and the YAML-level
attacks (tags, aliases); this file covers every other field.
"""

from __future__ import annotations

import ast
import collections
import functools
import os
import re
import subprocess
import sys

import pytest

from kspec.codegen import project as pipeline
from conftest import REPO, VALID_SPEC, invoke_kspec, mutate

V = VALID_SPEC
PAYLOADS = {
    "triple_double": '"""; __import__("os").system("touch MARKER"); """',
    "triple_single": "'''; open('MARKER', 'w'); '''",
    "jinja_expr": "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "jinja_stmt": "{% set x = cycler.__init__.__globals__.os.system('touch MARKER') %}{# #}",
    "newline_code": "x\n__import__('os').system('touch MARKER')\n#",
    "shell": "$(touch MARKER) `touch MARKER`; touch MARKER",
    "backslashes": "\\\"\\'\\N{BULLET}\\x41\\u0041 \\",
    "format_braces": "{0.__class__} %s %(x)s {__import__}",
    # reads as a valid expression (`N`) to a parser that drops comments
    "comment_tail": 'N # """; __import__("os").system("touch MARKER"); """',
}
# Passes a `^...$` name pattern where `$` matches before a final newline (Python's re);
# an expression is stripped of surrounding whitespace, so there it is only `N`.
TRAILING_NEWLINE = "N\n"


def _quoted(payload: str) -> str:
    """The payload as a YAML double-quoted scalar (keeps newlines and backslashes exact)."""
    return '"' + payload.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


X_INPUT = "  x: {shape: [N], dtype: float32}"
X_FORMAT = X_INPUT.replace("{", "{{").replace("}", "}}")  # as a replacement that spec_with formats
SCRATCH = ("cases:", "scratch:\n  acc: {shape: [bs], dtype: float32}\ncases:")
TPU = ("cases:", "backends:\n  mosaic_tpu:\n    compiler_params: {dimension_semantics: [parallel]}\ncases:")
TRITON = ("cases:", "backends:\n  triton:\n    compiler_params: {num_warps: 4}\ncases:")
# field -> replacements that put {p} (the YAML-quoted payload) or {r} (its Python repr) there
REFUSED_FIELDS = {
    "name": [("name: tiny", "name: {p}")],
    "input_name": [("  x: {shape: [N], dtype: float32}", "  {p}: {{shape: [N], dtype: float32}}")],
    "param_name": [("  bs: 8", "  {p}: 8")],
    "dtype": [("dtype: float32", "dtype: {p}")],
    "dtype_in_list": [("dtype: float32", "dtype: [float32, {p}]")],
    "follows": [("dtype: x}", "dtype: {p}}}")],
    "shape": [("x: {shape: [N]", "x: {{shape: [{p}]")],
    "output_shape": [("o: {shape: [N]", "o: {{shape: [{p}]")],
    "grid": [('grid: ["cdiv(N, bs)"]', "grid: [{p}]")],
    "grid_axis_name": [('grid: ["cdiv(N, bs)"]', "grid: {{{p}: cdiv(N, bs)}}")],
    "block_shape": [("x: {block_shape: [bs]", "x: {{block_shape: [{p}]")],
    "index_map": [('x: {block_shape: [bs], index_map: "i -> (i,)"}', "x: {{block_shape: [bs], index_map: {p}}}")],
    "block_operand": [('  x: {block_shape', '  {p}: {{block_shape')],
    "constraint": [("cases:", "constraints: [{p}]\ncases:")],
    "cost_flops": [("cases:", "cost_estimate: {{flops: {p}}}\ncases:")],
    "case_name": [("{name: c, N: 64}", "{{name: {p}, N: 64}}")],
    "case_dim_key": [("{name: c, N: 64}", "{{name: c, N: 64, {p}: 2}}")],
    "case_dtype": [("{name: c, N: 64}", "{{name: c, N: 64, dtype: {p}}}")],
    "case_param": [("{name: c, N: 64}", "{{name: c, N: 64, params: {{{p}: 1}}}}")],
    "tolerance_key": [("cases:", "tolerance: {{{p}: {{atol: 0.1}}}}\ncases:")],
    "case_tolerance_key": [("{name: c, N: 64}", "{{name: c, N: 64, tolerance: {{{p}: {{atol: 0.1}}}}}}")],
    "scratch_name": [SCRATCH, ("  acc: {shape", "  {p}: {{shape")],
    "scratch_dtype": [SCRATCH, ("dtype: float32}\ncases", "dtype: {p}}}\ncases")],
    "scratch_shape": [SCRATCH, ("acc: {shape: [bs]", "acc: {{shape: [{p}]")],
    "backend_name": [("cases:", "backends:\n  {p}:\ncases:")],
    "compiler_param_value": [TRITON, ("num_warps: 4", "num_warps: {p}")],
    "compiler_param_key": [TRITON, ("num_warps: 4", "{p}: 4")],
    "dimension_semantics": [TPU, ("[parallel]", "[{p}]")],
    "backend_dtypes": [TPU, ("    compiler_params", "    dtypes: {{x: [{p}]}}\n    compiler_params")],
    "backend_param_name": [TPU, ("    compiler_params", "    params: {{{p}: 8}}\n    compiler_params")],
    "init_same_as": [(X_INPUT, X_FORMAT + "\n  y: {{shape: [N], dtype: x, init: {{same_as: {p}}}}}")],
    "init_low": [(X_INPUT, X_FORMAT + "\n  y: {{shape: [N], dtype: int32, init: {{kind: index, low: {p}, bound: N}}}}")],
    "init_bound": [(X_INPUT, X_FORMAT + "\n  y: {{shape: [N], dtype: int32, init: {{kind: index, bound: {p}}}}}")],
}
# Free text: accepted, and must stay text.
TEXT_FIELDS = {
    "output_doc": [("o: {shape: [N], dtype: x}", "o: {{shape: [N], dtype: x, doc: {p}}}")],
    "constraint_message": [("cases:", "constraints: [{{expr: N > 0, message: {p}}}]\ncases:")],
    "param_doc_under_backend": [TPU, ("    compiler_params", "    params: {{bs: {{default: 128, doc: {p}}}}}\n    compiler_params"),
                                ("{name: c, N: 64}", "{name: c, N: 1024}")],
    "body_comment": [("o_ref[...] = x_ref[...] * 2", "o_ref[...] = x_ref[...] * 2  # {r}")],
    "body_string": [("o_ref[...] = x_ref[...] * 2", "o_ref[...] = x_ref[...] * 2\n  _unused = {r}")],
    "reference_string": [("return x * 2", "_unused = {r}\n  return x * 2")],
    "init_code_string": [(X_INPUT, X_FORMAT + "\n  y:\n    shape: [N]\n    dtype: int32\n    init:\n      code: |\n"
                                            "        _unused = {r}\n        return jnp.zeros((N,), dtype)")],
}


def spec_with(field_table: dict, field: str, payload: str, name: str = "tiny") -> str:
    text = mutate(V, ("name: tiny", f"name: {name}")) if name != "tiny" else V
    quoted = _quoted(payload)
    for old, new in field_table[field]:
        new = new.format(p=quoted, r=repr(payload)) if "{p" in new or "{r}" in new else new
        text = mutate(text, (old, new))
    return text


REFUSED = [(f, p) for f in sorted(REFUSED_FIELDS) for p in sorted(PAYLOADS)]


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
def test_payload_in_a_name_or_expression_is_refused(field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    for key in sorted(PAYLOADS):
        path = tmp_path / "specs" / f"{key}.yaml"
        path.write_text(spec_with(REFUSED_FIELDS, field, PAYLOADS[key]), encoding="utf-8")
        compiled = pipeline.compile_spec(path)
        assert not compiled.ok, (field, key)
        for d in compiled.diagnostics:
            assert re.match(rf"{re.escape(str(path))}:\d+:\d+: error\[E\d{{3}}\]: ", d.format()), d.format()
    assert not (tmp_path / "MARKER").exists()


NAME_FIELDS = sorted(f for f in REFUSED_FIELDS if "name" in f or f in ("follows", "dtype", "dtype_in_list", "case_dim_key",
                                                                      "case_dtype", "case_param", "tolerance_key",
                                                                      "case_tolerance_key", "backend_dtypes", "compiler_param_key"))


@pytest.mark.parametrize("field", NAME_FIELDS)
def test_a_name_with_a_trailing_newline_is_refused(field, tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(spec_with(REFUSED_FIELDS, field, TRAILING_NEWLINE), encoding="utf-8")
    compiled = pipeline.compile_spec(path)
    assert not compiled.ok, field
    for d in compiled.diagnostics:
        assert re.match(rf"{re.escape(str(path))}:\d+:\d+: error\[E\d{{3}}\]: ", d.format()), d.format()


def test_the_schema_reads_a_final_dollar_as_the_end_of_the_text(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(spec_with(REFUSED_FIELDS, "param_name", TRAILING_NEWLINE), encoding="utf-8")
    (d,) = pipeline.compile_spec(path).diagnostics
    assert d.format().startswith(f"{path}:5:3: error[E200]: ")
    assert d.message == 'params: "N\\n" is not a valid name'
    assert d.hint == "names are Python identifiers: letters, digits and _"


def _blank_strings(tree: ast.AST) -> ast.AST:
    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node):
            return ast.Constant("S") if isinstance(node.value, str) else node

    return Blank().visit(tree)


def _skeleton(text: str, name: str) -> str:
    """The module's syntax tree with strings blanked and the body/reference functions emptied."""
    tree = _blank_strings(ast.parse(text))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in (f"_{name}_kernel", f"{name}_reference"):
            node.body = [ast.Pass()]
    return ast.dump(tree)


def _functions_holding(text: str, needle: str) -> set:
    """Names of the top-level functions whose source holds `needle` ("" for outside any)."""
    defs = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
    found = set()
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            found |= {n.name for n in defs if n.lineno <= i <= n.end_lineno} or {""}
    return found


def _plan(tmp_path, text: str) -> dict:
    path = tmp_path / "specs" / "tiny.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    compiled = pipeline.compile_spec(path)
    assert compiled.ok, [d.format() for d in compiled.diagnostics]
    _, planned = pipeline.plan(compiled, tmp_path / "generated")
    return {p.name: t for p, t in planned.items()}


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
def test_payload_in_free_text_stays_text(field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = _plan(tmp_path, spec_with(TEXT_FIELDS, field, "plain words"))
    for key in sorted(PAYLOADS):
        hostile = _plan(tmp_path, spec_with(TEXT_FIELDS, field, PAYLOADS[key]))
        assert sorted(hostile) == sorted(plain)
        for fname in plain:
            body = hostile[fname].split("\n", 4)[4]  # past the banner, which holds the sha256s
            assert _skeleton(body, "tiny") == _skeleton(plain[fname].split("\n", 4)[4], "tiny"), (field, key, fname)
        if field.startswith(("body", "reference")):  # code text lives only inside its own function
            marker = "touch MARKER" if "MARKER" in PAYLOADS[key] else None
            for fname, text in hostile.items():
                if marker and marker in text:
                    assert _functions_holding(text, marker) <= {"_tiny_kernel", "tiny_reference"}, (fname, key)
    assert not (tmp_path / "MARKER").exists()


def _top_level(text: str, name: str) -> set:
    """(kind, name) of each top-level statement; the kernel's name written as {name}."""
    out = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(("def", node.name.replace(name, "{name}")))
        elif isinstance(node, ast.Assign):
            out |= {("=", t.id) for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {("import", a.name) for a in node.names}
        else:
            out.add((type(node).__name__, None))
    return out


@functools.cache
def _library() -> list:
    """(compiled spec, {target: text} planned) of each shipped spec: compiled once for the tests below."""
    out = []
    for path in pipeline.discover([], root=REPO):
        compiled = pipeline.compile_spec(path)
        out.append((compiled, pipeline.plan(compiled, REPO / "generated")[1] if compiled.ok else {}))
    return out


def test_generated_modules_hold_only_what_the_templates_make():
    """Shipped specs: every top-level function is one a template defines, nothing but the
    module docstring is a bare expression, and spec code sits in its own function."""
    by_kind: dict = {}
    for compiled, planned in _library():
        assert compiled.ok
        spec = compiled.spec
        for target, text in planned.items():
            top = _top_level(text, spec.name)
            assert {kind for kind, _ in top} <= {"def", "=", "import", "Expr", "If", "Try"}, (target, top)
            tree = ast.parse(text)
            exprs = [n for n in tree.body if isinstance(n, ast.Expr)]
            assert exprs == tree.body[:1] and isinstance(exprs[0].value, ast.Constant), target
            by_kind.setdefault(target.name, []).append({n for kind, n in top if kind == "def"})
            variant = spec.variants.get(target.stem)
            code = {"reference.py": (spec.reference, f"{spec.name}_reference")}.get(target.name)
            code = code or ((variant.body, f"_{spec.name}_kernel") if variant else None)
            # a line written the same in two of the spec's code blocks (a prologue's and a body's
            # padded length, say) is in both functions
            blocks = [spec.reference, *(v.body for v in spec.variants.values()), *(c.body for c in spec.competitors)]
            blocks += [c for c in (spec.wrapper.prologue, spec.wrapper.epilogue) if c is not None] if spec.wrapper else []
            blocks += [op.init.code for op in spec.inputs if op.init is not None and op.init.code is not None]
            counts = collections.Counter(ln.strip() for b in blocks if b is not None
                                         for ln in set(b.source.splitlines()) if ln.strip())
            if code:
                for line in filter(str.strip, code[0].source.splitlines()):
                    if counts[line.strip()] == 1:
                        assert _functions_holding(text, line.strip()) == {code[1]}, (target, line)
            coded = [op for op in spec.inputs if op.init is not None and op.init.code is not None]
            if target.name == "reference.py":  # each competitor's body and input's init code in its own function
                for c in spec.competitors:
                    for line in filter(str.strip, c.body.source.splitlines()):
                        if counts[line.strip()] == 1:
                            assert _functions_holding(text, line.strip()) == {f"{spec.name}_{c.name}"}, (target, line)
                for op in coded:
                    for line in filter(str.strip, op.init.code.source.splitlines()):
                        if counts[line.strip()] == 1:
                            assert _functions_holding(text, line.strip()) == {f"{spec.name}_init_{op.name}"}, (target, line)
            # a template's def named after a competitor or an input, as the competitors and inputs this spec declares
            by_kind[target.name][-1] = {
                "{name}_{{ c.name }}" if any(d == f"{{name}}_{c.name}" for c in spec.competitors) else
                "{name}_init_{{ i.input }}" if any(d == f"{{name}}_init_{op.name}" for op in coded) else d
                for d in by_kind[target.name][-1]
            }
    template_defs = {
        name.replace("{{ name }}", "{name}")
        for path in (REPO / "templates").glob("*.j2")
        for name in re.findall(r"^(?:def|class) ([^(:]+)[(:]", path.read_text(), re.M)
    }
    for kind, defs in by_kind.items():
        assert set().union(*defs) <= template_defs, (kind, set().union(*defs) - template_defs)


def test_cli_check_generate_and_import_run_no_payload(tmp_path):
    """All payloads at once through the CLI; then import what was generated: no MARKER."""
    specs = tmp_path / "specs"
    specs.mkdir()
    for i, (field, key) in enumerate(REFUSED):
        (specs / f"r{i}.yaml").write_text(spec_with(REFUSED_FIELDS, field, PAYLOADS[key]), encoding="utf-8")
    for command in ("check", "generate"):
        r = invoke_kspec(command, cwd=tmp_path, timeout=120)
        assert r.rc == 2, r.out[-2000:] + r.err[-2000:]
        assert f"error(s) in {len(REFUSED)} of {len(REFUSED)} spec(s)" in r.out
        assert "Traceback" not in r.both
    assert not (tmp_path / "generated").exists()
    for p in specs.iterdir():
        p.unlink()
    names = []
    for i, (field, key) in enumerate((f, k) for f in sorted(TEXT_FIELDS) for k in sorted(PAYLOADS)):
        names.append(f"t{i}")
        (specs / f"t{i}.yaml").write_text(spec_with(TEXT_FIELDS, field, PAYLOADS[key], name=f"t{i}"), encoding="utf-8")
    r = invoke_kspec("generate", cwd=tmp_path, timeout=120)
    assert r.rc == 0, r.out[-2000:] + r.err[-2000:]
    modules = sorted(f"generated.{p.parent.name}.{p.stem}" for p in (tmp_path / "generated").glob("*/*.py"))
    assert {m.split(".")[1] for m in modules} == set(names)
    imports = "import " + ", ".join(modules)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{REPO}", NO_COLOR="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", imports], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "MARKER").exists()


def test_spec_file_name_cannot_inject_code(tmp_path):
    """The banner quotes the spec's path in comments: a newline in the file name must stay in the comment."""
    name = "x\n__import__('os').system('touch MARKER')\n#"
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / f"{name}.yaml").write_text(V, encoding="utf-8")
    r = invoke_kspec("generate", cwd=tmp_path, timeout=120)
    assert r.rc == 0, r.both
    for path in (tmp_path / "generated" / "tiny").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# Generated by kspec ") and "from specs/x\\n__import__" in text.splitlines()[0]
        assert "__import__" not in {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}, path
    r = invoke_kspec("generate", "--check", cwd=tmp_path)
    assert r.rc == 0, r.out  # the banner still matches its content
    assert not (tmp_path / "MARKER").exists()


def test_a_comment_in_an_expression_is_refused_where_it_starts(tmp_path):
    """`N # ...` parses as `N`: the comment would otherwise ride along in the spec's text."""
    path = tmp_path / "tiny.yaml"
    payload = 'N # """; __import__("os").system("touch MARKER"); """'
    path.write_text(mutate(V, ("o: {shape: [N]", f"o: {{shape: [{_quoted(payload)}]")), encoding="utf-8")
    (d,) = pipeline.compile_spec(path).diagnostics
    assert d.format() == f"{path}:9:18: error[E300]: a comment (`#`) is not allowed in an expression"


def test_a_line_break_in_an_expression_is_refused_where_it_is(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(mutate(V, ('grid: ["cdiv(N, bs)"]', 'grid: ["cdiv(N,\\n bs)"]')), encoding="utf-8")
    (d,) = pipeline.compile_spec(path).diagnostics
    assert d.format() == f"{path}:10:16: error[E300]: a line break is not allowed in an expression"


def test_generated_docstrings_show_expressions_reprinted(tmp_path):
    """The docstrings show each shape from its checked tree, not the spec's spelling."""
    planned = _plan(tmp_path, mutate(V, ("o: {shape: [N]", "o: {shape: [ N+0 ]")))
    assert "o [N + 0]" in planned["interpret.py"] and "N+0" not in planned["interpret.py"]



def _code_names(code) -> set:
    """Every identifier in a spec's code (its own names, which the checks do not restrict)."""
    try:
        tree = ast.parse(code.source)
    except SyntaxError:
        return set()
    out = set()
    for n in ast.walk(tree):
        out |= {n.id} if isinstance(n, ast.Name) else {n.name} if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else set()
        out |= {n.arg} if isinstance(n, ast.arg) else set()
    return out


def test_the_names_the_templates_bind_are_reserved():
    """Derived from the library's generated code: every name a generated module binds at its top
    level, and every local of the functions that take the spec's inputs and params, is reserved
    (or starts with `_`, which spec names may not), unless the spec itself gave it."""
    from kspec.codegen.checks.semantic import RESERVED, TEMPLATE_LOCALS

    module_level, wrapper_locals = set(), set()
    for compiled, planned in _library():
        spec, linked = compiled.spec, {b.name for b in compiled.linked}
        operands = spec.operands + spec.kernel_only
        own = {o.name for o in operands} | {f"{o.name}_ref" for o in operands} | set(spec.dims)
        own |= {o.given_flag for o in spec.inputs if o.optional}  # has_<name>, named after the spec's input
        for v in spec.variants.values():
            own |= {p.name for p in v.params} | {a.name for a in v.grid if a.name} | {f"{s.name}_ref" for s in v.scratch}
            own |= _code_names(v.body)
        own |= _code_names(spec.reference) | {n for c in spec.competitors for n in _code_names(c.body)}
        wrapped = (spec.wrapper.prologue, spec.wrapper.epilogue) if spec.wrapper else ()
        own |= {n for code in wrapped if code is not None for n in _code_names(code)}

        def theirs(name: str) -> bool:
            return name.startswith("_") or name in own or spec.name in name or any(b in name for b in linked)

        for text in planned.values():
            tree = ast.parse(text)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    module_level.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    module_level |= {(a.asname or a.name).split(".")[0] for a in node.names}
                elif isinstance(node, ast.Assign):
                    module_level |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            module_level = {n for n in module_level if not theirs(n)}
            for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in (spec.name, f"{spec.name}_sharded")):
                # an index map's lambda takes the spec's own grid index names, and a comprehension's
                # variables live in a scope of their own
                lambdas = {id(a) for lam in ast.walk(fn) if isinstance(lam, ast.Lambda) for a in ast.walk(lam.args)}
                lambdas |= {id(a) for c in ast.walk(fn) if isinstance(c, ast.comprehension) for a in ast.walk(c.target)}
                for n in ast.walk(fn):
                    if id(n) in lambdas:
                        continue
                    name = n.id if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) else n.arg if isinstance(n, ast.arg) else None
                    if name and not theirs(name):
                        wrapper_locals.add(name)
    assert sorted(module_level - RESERVED - {"__all__"}) == []
    assert sorted(wrapper_locals - RESERVED - TEMPLATE_LOCALS) == []


@pytest.mark.parametrize("where, name, says", [
    ("kernel", "select_backend", "kernel `select_backend`"),
    ("kernel", "importlib", "kernel `importlib`"),
    ("param", "params", "param `params`"),
    ("param", "bind", "param `bind`"),
    ("input", "module", "input `module`"),
    ("input", "importlib", "input `importlib`"),
])
def test_a_name_the_generated_code_uses_is_refused(where, name, says, tmp_path):
    edits = {
        "kernel": [("name: tiny", f"name: {name}")],
        "param": [("  bs: 8", f"  bs: 8\n  {name}: 1")],
        "input": [("  x: {shape: [N], dtype: float32}", f"  x: {{shape: [N], dtype: float32}}\n  {name}: {{shape: [N], dtype: float32}}")],
    }[where]
    path = tmp_path / "tiny.yaml"
    path.write_text(mutate(V, *edits), encoding="utf-8")
    messages = [d.message for d in pipeline.compile_spec(path).diagnostics if d.code == "E400"]
    assert f"{says} clashes with a name the generated code uses" in messages


def test_an_infinite_param_default_is_a_float_literal(tmp_path):
    planned = _plan(tmp_path, mutate(V, ("  bs: 8", "  bs: 8\n  scale: .inf"), ("x_ref[...] * 2", "x_ref[...] * 2 + 0 * scale")))
    assert "scale=float('inf')" in planned["interpret.py"]
    namespace: dict = {}
    exec(compile("x = float('inf')", "<literal>", "exec"), namespace)  # the literal evaluates to inf
    assert namespace["x"] == float("inf")


def test_a_deeply_nested_expression_is_refused_before_rendering(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(mutate(V, ('grid: ["cdiv(N, bs)"]', 'grid: ["' + "-" * 480 + 'cdiv(N, bs)"]')), encoding="utf-8")
    (d,) = pipeline.compile_spec(path).diagnostics
    assert d.format() == f"{path}:10:9: error[E300]: expression nested more than 256 deep"
