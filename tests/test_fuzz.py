"""Fuzzing: random and mutated specs never crash kspec, and every answer is well formed.

Three sources of input, all run through the in-process pipeline (compile_spec on a
file, then render and the writer's banner check for what is accepted):

- mutations of the shipped specs/*.yaml: byte flips, line deletions and
  duplications, key renames, value swaps, type changes and random YAML fragments;
- specs built to be valid (random names, ranks, dtypes, docs, backends, compiler
  params), so that the render path is fuzzed as well as the rejection path;
- random schema-valid documents from hypothesis-jsonschema.

The property: no exception escapes; a rejected spec has at least one diagnostic and
every diagnostic is registered and located inside the file; an accepted spec renders
modules that parse, that the writer recognises as its own, and that import; and no
spec code runs (no MARKER file appears).

Built specs also carry hostile fields: comments and line breaks in expressions, names
the generated code uses, names with a trailing newline, non-finite floats, deep nesting.
A fourth source fuzzes tuning files: mutated JSON beside a valid spec.

CI runs a few hundred examples. KSPEC_FUZZ=1 runs the `slow` tests with the "fuzz"
profile, at least 10,000 cases:  KSPEC_FUZZ=1 python -m pytest -m slow tests/test_fuzz.py
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kspec.codegen.checks import instances
from kspec.codegen.checks import semantic as checks
from kspec.codegen import project as pipeline
from kspec.codegen.emit import writer
from kspec.codegen.diagnostics import CODES
from conftest import REPO, VALID_SPEC as V, invoke_kspec, mutate

FUZZ = os.environ.get("KSPEC_FUZZ") == "1"
_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, print_blob=True)
settings.register_profile("ci", max_examples=200, **_COMMON)
settings.register_profile("fuzz", max_examples=10_000, **_COMMON)
CI, PROFILE_FUZZ = settings.get_profile("ci"), settings.get_profile("fuzz")

SHIPPED = {p.name: p.read_bytes() for p in sorted((REPO / "specs").glob("*.yaml"))}
MAX_LINE_PAST_END = 1  # a diagnostic may point just past the last line (end of file)


@pytest.fixture(autouse=True)
def _small_grid_walk(monkeypatch):
    """Walk at most 1,024 grid points per case (sample beyond): keeps each example fast.

    The sampling path is what large grids take anyway; test_bounds.py checks the real limit.
    """
    monkeypatch.setattr(instances, "MAX_GRID_POINTS", 1 << 10)


# -- the property -----------------------------------------------------------------


class Workdir:
    """One project folder per test: specs/fuzz.yaml is rewritten for each example. The
    shipped specs sit beside it, so the backward specs a `vjp:` names are there."""

    def __init__(self, root: Path):
        self.root = root
        (self.root / "specs").mkdir()
        for name, content in SHIPPED.items():
            (self.root / "specs" / name).write_bytes(content)
        self.spec = self.root / "specs" / "fuzz.yaml"
        self.counts = {"accepted": 0, "rejected": 0}
        self.imported = 0


@pytest.fixture
def work(tmp_path):
    return Workdir(tmp_path)


def run_pipeline(content: bytes, work: Workdir, imports: bool = True, also: tuple = ()) -> pipeline.Compiled:
    """compile_spec + render (+ import); assert the property; return the result."""
    work.spec.write_bytes(content)
    compiled = pipeline.compile_spec(work.spec)
    if compiled.ok:
        work.counts["accepted"] += 1
        planned = assert_renders(compiled, work.root / "generated")
        if imports:
            assert_imports(compiled, planned, work)
    else:
        work.counts["rejected"] += 1
        assert_located(compiled, content, also)
    assert not (work.root / "MARKER").exists() and not Path("MARKER").exists(), "spec code ran"
    return compiled


def assert_imports(compiled: pipeline.Compiled, planned: dict, work: Workdir) -> None:
    """The rendered package imports (each of its modules), under a package name of its own, and
    importing it runs nothing of the spec's (the bodies and references are only defined)."""
    work.imported += 1
    name = f"_fuzz_out_{work.imported}"
    root = work.root / "imports" / name
    root.mkdir(parents=True)
    for path, text in pipeline.root_files(root).items():
        path.write_text(text)
    todo, done = [(compiled, planned)], set()
    while todo:  # the package, and the backward packages its vjp imports
        c, files = todo.pop()
        if c.spec.name in done:
            continue
        done.add(c.spec.name)
        (root / c.spec.name).mkdir()
        for path, text in files.items():
            (root / c.spec.name / path.name).write_text(text)
        todo += [(b, pipeline.plan(b, work.root / "generated")[1]) for b in c.backward if b.ok]
    sys.path.insert(0, str(root.parent))
    try:
        for path in planned:
            module = path.stem if path.stem != "__init__" else ""
            importlib.import_module(".".join(filter(None, (name, compiled.spec.name, module))))
    finally:
        sys.path.remove(str(root.parent))
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def assert_located(compiled: pipeline.Compiled, content: bytes, also: tuple = ()) -> None:
    """Every diagnostic registered and located: in the spec, or in one of the files `also` names."""
    assert compiled.diagnostics, "rejected without a diagnostic"
    n_lines = len(re.split(rb"\r\n|\r|\n", content))  # YAML's line breaks; U+2028 and kin are refused
    for d in compiled.diagnostics:
        assert d.code in CODES, d
        if d.loc.path in also:
            assert d.loc.line >= 1 and d.loc.col >= 1, d
            continue
        assert d.loc.path == str(compiled.path), d
        assert 1 <= d.loc.line <= n_lines + MAX_LINE_PAST_END and d.loc.col >= 1, d
        head = d.format().splitlines()[0]
        assert re.match(rf"{re.escape(str(compiled.path))}:\d+:\d+: (error\[E|warning\[W)\d{{3}}\]: \S", head), head


def assert_renders(compiled: pipeline.Compiled, out_root: Path) -> dict:
    kernel_dir, planned = pipeline.plan(compiled, out_root)
    assert planned and all(p.parent == kernel_dir and p.suffix == ".py" for p in planned)
    for path, text in planned.items():
        ast.parse(text, filename=str(path))
        assert not writer.hand_edited(text), f"{path}: the writer would take its own output for a hand edit"
    return planned


# -- mutations of the shipped specs -------------------------------------------------

KEYS = ["name", "doc", "params", "inputs", "outputs", "grid", "blocks", "body", "reference", "cases", "shape",
        "dtype", "block_shape", "index_map", "default", "choices", "scratch", "backends", "interpret", "triton",
        "mosaic_gpu", "mosaic_tpu", "compiler_params", "tolerance", "atol", "bench", "constraints", "expr",
        "kspec", "cost_estimate", "flops", "dtypes", "kind", "memory_space", "x", "y", "o", "M", "N", "K", "bm",
        "__class__", "class", "jnp", "_x", "Ünï", "a-b", "1x", ""]
VALUES = ["[]", "{}", "null", "~", "true", "1.5", '"s"', "-1", "0", "1180591620717411303424", "[1, [2]]",
          "{a: 1}", "''", ".nan", ".inf", "-.inf", "2001-12-14", "0x1F", "0o17", "1e999", "-0", "'{{ x }}'",
          "|\n  x", "\"\\x00\"", "\"\\ud800\"", "'''", "i -> (i,)", "cdiv(M, bm)", "M * N", "float32", "x"]
FRAGMENTS = ["{", "}", "[", "]", ": ", "- ", "&a ", "*a", "!!str ", "!!python/name:os.system ", "!foo ", "? ",
             "|", ">-", "'", '"', "# c", "\t", "<<: {}", "...", "---", "%YAML 1.2", "\ufeff", "{{ name }}",
             "{% if x %}", '"""', "\\", "é", "\u2028"]
_KEY_RE = re.compile(rb"([A-Za-z_][A-Za-z0-9_]*)(?=:)")
_VALUE_RE = re.compile(rb"(?<=: )[^\s{}\[\],#][^,{}\[\]#\n]*")


def _pick(draw, items):
    return items[draw(st.integers(0, len(items) - 1))] if items else None


@st.composite
def mutation(draw, data: bytes) -> bytes:
    lines = data.split(b"\n")
    kind = draw(st.sampled_from(["flip", "delete", "duplicate", "rename", "swap", "retype", "fragment"]))
    if kind == "flip":
        i = draw(st.integers(0, len(data) - 1))
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    if kind in ("delete", "duplicate"):
        i = draw(st.integers(0, len(lines) - 1))
        lines[i : i + 1] = [] if kind == "delete" else [lines[i], lines[i]]
    elif kind == "rename":
        hit = _pick(draw, [(i, m) for i, line in enumerate(lines) for m in _KEY_RE.finditer(line)])
        if hit:
            i, m = hit
            lines[i] = lines[i][: m.start()] + draw(st.sampled_from(KEYS)).encode() + lines[i][m.end() :]
    elif kind in ("swap", "retype"):
        found = [(i, m) for i, line in enumerate(lines) for m in _VALUE_RE.finditer(line)]
        a, b = _pick(draw, found), _pick(draw, found)
        if a and b and a[0] != b[0]:
            (i, ma), (j, mb) = a, b
            new_b = ma.group() if kind == "swap" else draw(st.sampled_from(VALUES)).encode()
            new_a = mb.group() if kind == "swap" else ma.group()
            lines[i] = lines[i][: ma.start()] + new_a + lines[i][ma.end() :]
            lines[j] = lines[j][: mb.start()] + new_b + lines[j][mb.end() :]
    else:
        pieces = draw(st.lists(st.sampled_from(FRAGMENTS + VALUES + [k + ": " for k in KEYS]), min_size=1, max_size=4))
        lines.insert(draw(st.integers(0, len(lines))), b" " * draw(st.integers(0, 6)) + "".join(pieces).encode())
    return b"\n".join(lines)


@st.composite
def mutated_spec(draw) -> bytes:
    data = SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))]
    for _ in range(draw(st.integers(1, 3))):
        data = draw(mutation(data))
    return data


def _mutations(work: Workdir, profile: settings) -> None:
    @profile
    @given(mutated_spec())
    def check(content):
        run_pipeline(content, work)

    check()
    print(f"\nmutations: {work.counts}")
    # the mutations are small enough that some still pass: both paths were fuzzed
    assert work.counts["accepted"] and work.counts["rejected"], work.counts


def test_mutated_shipped_specs(work):
    _mutations(work, settings(CI, max_examples=300))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_specs_pass_the_property(name, work):
    """The unmutated specs are accepted: the mutation fuzzer starts from valid input."""
    assert run_pipeline(SHIPPED[name], work).ok


# -- specs built to be valid ----------------------------------------------------------

DTYPES = ["float32", "bfloat16", "float16", "int32", "int8", "uint8", "bool", "float64"]
# Printable text (YAML refuses control characters; test_hostile covers those), quotes and braces included.
WILD_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"], include_characters="\n\t"), max_size=60)
IDENT = st.from_regex(r"\A[a-z][a-z0-9_]{0,8}\Z")
COMPILER_PARAMS = {
    "interpret": st.just(None),
    "triton": st.fixed_dictionaries({}, optional={"num_warps": st.sampled_from([1, 2, 4, 8, 16, 32]),
                                                  "num_stages": st.integers(1, 8)}),
    "mosaic_gpu": st.fixed_dictionaries({}, optional={"approx_math": st.booleans(),
                                                      "max_concurrent_steps": st.integers(1, 16),
                                                      "lowering_semantics": st.sampled_from(["lane", "warpgroup"])}),
    "mosaic_tpu": st.fixed_dictionaries({}, optional={"vmem_limit_bytes": st.integers(1, 1 << 40),
                                                      "has_side_effects": st.booleans(),
                                                      "disable_bounds_checks": st.booleans()}),
}


@st.composite
def built_spec(draw) -> dict:
    """An elementwise kernel over rank-r arrays with random names, docs and backends."""
    rank = draw(st.integers(1, 3))
    n_in = draw(st.integers(1, 3))
    dims = [f"D{d}" for d in range(rank)]
    inputs = [f"a{i}" for i in range(n_in)]
    doc = lambda: draw(WILD_TEXT)  # noqa: E731
    block = [draw(st.sampled_from([1, 2, 4, 8, 16])) for _ in range(rank)]
    index = ", ".join(f"g{d}" for d in range(rank))
    index_map = f"{index} -> ({index}{',' if rank == 1 else ''})"
    body = "o_ref[...] = " + " + ".join(f"{a}_ref[...]" for a in inputs) + "  # " + draw(WILD_TEXT).replace("\n", " ")
    spec = {
        "kspec": 1,
        "name": "k" + draw(IDENT),
        "doc": doc(),
        "params": {f"b{d}": {"default": block[d], "choices": [block[d]], "doc": doc()} for d in range(rank)},
        "inputs": {a: {"shape": dims, "dtype": draw(st.sampled_from(DTYPES)) if i == 0 else "a0", "doc": doc()}
                   for i, a in enumerate(inputs)},
        "outputs": {"o": {"shape": dims, "dtype": "a0", "doc": doc()}},
        "grid": [f"cdiv(D{d}, b{d})" for d in range(rank)],
        "blocks": {op: {"block_shape": [f"b{d}" for d in range(rank)], "index_map": index_map}
                   for op in inputs + ["o"]},
        "body": body + "\n",
        "reference": "return " + " + ".join(inputs) + "\n",
        "cases": [dict({"name": "c" + draw(IDENT)}, **{d: draw(st.integers(1, 64)) for d in dims})
                  for _ in range(draw(st.integers(1, 3)))],
    }
    if draw(st.booleans()):
        spec["tolerance"] = {draw(st.sampled_from(DTYPES)): {"atol": draw(st.floats(0, 1)), "rtol": 1e-3}}
    backends = draw(st.lists(st.sampled_from(sorted(COMPILER_PARAMS)), unique=True, max_size=4))
    if backends:
        spec["backends"] = {}
        for b in backends:
            cp = draw(COMPILER_PARAMS[b])
            spec["backends"][b] = {"compiler_params": cp} if cp else None
    # About one in four carries a hostile field (most are refused). Not `integers(0, 3) == 0`:
    # hypothesis draws small integers' ends far more often than the rest, so that made most examples
    # hostile and the share accepted a coin flip.
    if draw(st.sampled_from([False, False, False, True])):
        draw(HOSTILE)(draw, spec)
    return spec


PAYLOAD = '"""; open("MARKER", "w"); """'
RESERVED_NAMES = sorted(checks.TEMPLATE_NAMES | checks.TEMPLATE_LOCALS | {"jnp", "pl", "lambda", "print"})


def _comment_in_expression(draw, spec):
    spec["grid"][0] += " # " + draw(st.sampled_from([PAYLOAD, "", "x"]))


def _line_break_in_expression(draw, spec):
    text = spec["grid"][0]
    i = draw(st.integers(0, len(text)))
    spec["grid"][0] = text[:i] + draw(st.sampled_from(["\n", "\r", "\n" + PAYLOAD])) + text[i:]


def _reserved_name(draw, spec):
    name = draw(st.sampled_from(RESERVED_NAMES))
    where = draw(st.sampled_from(["params", "inputs", "name"]))
    if where == "params":
        spec["params"][name] = 1
    elif where == "inputs":
        spec["inputs"][name] = {"shape": list(spec["outputs"]["o"]["shape"]), "dtype": "a0"}
    else:
        spec["name"] = name


def _trailing_newline(draw, spec):
    where = draw(st.sampled_from(["params", "inputs", "name", "case"]))
    if where == "params":
        spec["params"]["p\n"] = 1
    elif where == "inputs":
        spec["inputs"]["a9\n"] = {"shape": list(spec["outputs"]["o"]["shape"]), "dtype": "a0"}
    elif where == "name":
        spec["name"] += "\n"
    else:
        spec["cases"][0]["name"] += "\n"


def _non_finite(draw, spec):
    spec["params"]["scale"] = draw(st.sampled_from([float("inf"), float("-inf"), float("nan")]))


def _deep(draw, spec):
    spec["grid"][0] = "-" * draw(st.integers(200, 600)) + "-" * 0 + spec["grid"][0]


HOSTILE = st.sampled_from([_comment_in_expression, _line_break_in_expression, _reserved_name, _trailing_newline,
                           _non_finite, _deep])


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # kspec refuses anchors: write shared values out
        return True


def _dump(doc: dict) -> bytes:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 20).encode()


def _built(work: Workdir, profile: settings) -> None:
    @profile
    @given(built_spec())
    def check(doc):
        compiled = run_pipeline(_dump(doc), work)
        if compiled.ok:  # the doc text arrives intact (up to line breaks and indent) in the docstring
            _, planned = pipeline.plan(compiled, work.root / "generated")
            init = next(text for path, text in planned.items() if path.name == "__init__.py")
            got = ast.get_docstring(ast.parse(init), clean=False)
            assert re.sub(r"\s", "", got).startswith(re.sub(r"\s", "", doc["doc"]))

    check()
    print(f"\nbuilt specs: {work.counts}")
    # Rejections are expected (each is asserted located above): mostly E701, a random block under
    # mosaic_tpu's (8, 128) tiling, in 30-50% of the examples depending on how hypothesis explores.
    # An eighth accepted keeps the render path well exercised without making the ratio a coin flip
    # (it was `accepted > rejected`, which failed a CI run at 74 to 76; a quarter of the examples
    # now carry a hostile field, which is mostly refused).
    assert work.counts["accepted"] >= profile.max_examples // 8, work.counts


def test_built_specs(work):
    _built(work, settings(CI, max_examples=150))


# -- tuning files ----------------------------------------------------------------------

TUNED_SPEC = V.replace("  bs: 8\n", "  bs: {default: 8, choices: [8, 16]}\n").encode()
JSON_FRAGMENTS = ["NaN", "Infinity", "-Infinity", "<<<<<<< HEAD\n", "=======\n", ">>>>>>> theirs\n", '"bs": "x"',
                  '"warps": 4', "[]", "{}", "null", "1e999", "-1", '"\\ud800"', "\xff", '"', ",", "}", "]"]


@st.composite
def tuning_file(draw, sha: str) -> bytes:
    entry = {"backend": "interpret", "bucket": [64], "case": "c", "dtype": "float32", "fixed": {},
             "jax_version": "0.10.2", "kernel_sha": sha, "message": "", "ms": draw(st.floats(0, 10)),
             "params": {"bs": draw(st.sampled_from([8, 16]))}, "status": draw(st.sampled_from(["pass", "error", "pruned"]))}
    data = json.dumps({"device_kind": "cpu", "entries": [entry] * draw(st.integers(0, 3)), "kernel": "tiny"},
                      indent=1, sort_keys=True).encode()
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            data = draw(mutation(data))
        else:
            i = draw(st.integers(0, len(data)))
            data = data[:i] + draw(st.sampled_from(JSON_FRAGMENTS)).encode("utf-8", "surrogateescape") + data[i:]
    return data


def _tuning_files(work: Workdir, profile: settings) -> None:
    work.spec.write_bytes(TUNED_SPEC)
    sha = pipeline.compile_spec(work.spec).spec.kernel_sha
    path = work.root / "tuning" / "tiny" / "cpu.json"
    path.parent.mkdir(parents=True)

    @profile
    @given(tuning_file(sha))
    def check(content):
        path.write_bytes(content)
        run_pipeline(TUNED_SPEC, work, also=(os.path.relpath(path), str(path)))

    check()
    print(f"\ntuning files: {work.counts}")
    assert work.counts["accepted"] and work.counts["rejected"], work.counts


def test_tuning_files(work, monkeypatch):
    monkeypatch.chdir(work.root)
    _tuning_files(work, settings(CI, max_examples=100))


# -- schema-valid documents -------------------------------------------------------


def _schema_strategy():
    hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema")
    from kspec.codegen.spec import schema

    return hypothesis_jsonschema.from_schema(schema.schema())


def _schema_valid(work: Workdir, profile: settings) -> None:
    @profile
    @given(_schema_strategy())
    def check(doc):
        try:
            content = _dump(doc)
        except yaml.YAMLError:
            assume(False)
        run_pipeline(content, work)

    check()
    print(f"\nschema-valid documents: {work.counts}")


def test_schema_valid_documents(work):
    """hypothesis-jsonschema draws slowly (~0.4 s a document) and each runs the pipeline: CI takes a few."""
    _schema_valid(work, settings(CI, max_examples=10))


# -- the fuzz profile: KSPEC_FUZZ=1 -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("source", ["mutations", "built", "tuning"])
def test_fuzz_profile(source, work, monkeypatch):
    if not FUZZ:
        pytest.skip("the 10,000-case fuzz profile runs with KSPEC_FUZZ=1")
    monkeypatch.chdir(work.root)
    {"mutations": _mutations, "built": _built, "tuning": _tuning_files}[source](work, PROFILE_FUZZ)


@pytest.mark.slow
def test_fuzz_profile_schema_valid(work):
    if not FUZZ:
        pytest.skip("the fuzz profile runs with KSPEC_FUZZ=1")
    _schema_valid(work, settings(PROFILE_FUZZ, max_examples=500))


# -- end to end through the CLI -----------------------------------------------------


def _cli_samples() -> list:
    """A fixed sample of mutations (reproducible without hypothesis' database)."""
    out = []

    @settings(CI, max_examples=12, derandomize=True)
    @given(mutated_spec())
    def collect(content):
        out.append(content)

    collect()
    return out


def test_cli_rejects_with_exit_2_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.undo()  # kspec runs in this process: with its own grid walk limit, as a user's does
    samples = _cli_samples()
    codes = []
    for i, content in enumerate(samples):
        root = tmp_path / f"p{i}"
        (root / "specs").mkdir(parents=True)
        (root / "specs" / "fuzz.yaml").write_bytes(content)
        rc, out, err = invoke_kspec("generate", "specs/fuzz.yaml", cwd=root, timeout=120)
        codes.append(rc)
        assert "Traceback" not in out + err
        if rc == 2:
            assert not (root / "generated").exists()
            # not hints, nor the warnings a spec with errors may also have
            *heads, summary = [ln for ln in out.splitlines() if not ln.startswith(" ") and "warning[" not in ln]
            assert heads and all(re.match(r"specs/fuzz\.yaml:\d+:\d+: error\[E\d{3}\]: ", h) for h in heads), out
            assert summary == f"{len(heads)} error(s) in 1 of 1 spec(s)", out
        else:
            assert rc == 0, out + err
            for path in (root / "generated").rglob("*.py"):
                ast.parse(path.read_text(encoding="utf-8"))
    assert 2 in codes, codes


# -- what the fuzzer found ------------------------------------------------------------


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_hidden_line_breaks_are_refused(char, work):
    """YAML counts U+2028, U+2029 and U+0085 as line breaks, editors do not: every line
    number after one would be off. Raw, they are refused; escaped in a string they are text."""
    compiled = run_pipeline(mutate(V, ("Doubles a vector.", f"Doubles{char}a vector.")).encode(), work)
    assert [d.format() for d in compiled.diagnostics] == [
        f"{work.spec}:3:13: error[E107]: character U+{ord(char):04X} is not allowed in a spec\n"
        f"  = help: YAML reads it as a line break and editors do not; in a double-quoted string, "
        f"write it as the escape \\u{ord(char):04x}"
    ]
    assert run_pipeline(mutate(V, ("Doubles a vector.", f'"Doubles\\u{ord(char):04x}a vector."')).encode(), work).ok
