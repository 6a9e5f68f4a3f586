"""spec/loader.py: YAML text to plain data with the place of every node, and the located refusals.

tests/test_hostile.py and tests/test_bounds.py throw hostile files at `kspec check`; here the
loader's own API: the values it builds, where it says they are, and its diagnostics.
"""

from __future__ import annotations

import pytest

from kspec.codegen.diagnostics import Location, SpecError
from kspec.codegen.spec import loader
from conftest import VALID_SPEC

PATH = "specs/tiny.yaml"


def refused(text: str) -> list:
    with pytest.raises(SpecError) as info:
        loader.load_text(text, "p.yaml")
    return [d.format() for d in info.value.diagnostics]


def test_the_valid_spec_loads_as_plain_data():
    doc = loader.load_text(VALID_SPEC, PATH)
    assert (doc.path, doc.text) == (PATH, VALID_SPEC)
    assert doc.data["params"] == {"bs": 8}
    assert doc.data["inputs"] == {"x": {"shape": ["N"], "dtype": "float32"}}
    assert doc.data["grid"] == ["cdiv(N, bs)"]
    assert doc.data["body"] == "o_ref[...] = x_ref[...] * 2\n"
    assert doc.data["cases"] == [{"name": "c", "N": 64}]


def test_every_node_has_its_place_and_its_key_place():
    doc = loader.load_text(VALID_SPEC, PATH)
    assert doc.loc(("params", "bs")) == Location(PATH, 5, 7)
    assert doc.key_loc(("params", "bs")) == Location(PATH, 5, 3)
    assert doc.loc(("cases", 0, "N")) == Location(PATH, 19, 18)
    assert doc.key_loc(("grid", 0)) == doc.loc(("grid", 0)) == Location(PATH, 10, 8)  # a list item has no key
    # a path that is not in the file: its nearest ancestor that is (here the root)
    assert doc.loc(("nope", "deeper")) == Location(PATH, 1, 1)
    assert doc.loc(("params", "bs", "default")) == doc.loc(("params", "bs"))


def test_text_loc_points_inside_a_string():
    """Column and line of a character inside a plain, quoted or block scalar (expression errors use it)."""
    doc = loader.load_text(VALID_SPEC, PATH)
    assert doc.info(("grid", 0)).style == '"'
    assert doc.text_loc(("grid", 0), 0, 5) == Location(PATH, 10, 14)  # the `N` of "cdiv(N, bs)", after the quote
    assert doc.info(("body",)).style == "|"
    assert doc.text_loc(("body",), 0, 14) == Location(PATH, 15, 17)  # block content starts a line down, indented
    assert doc.info(("name",)).style is None
    assert doc.text_loc(("name",), 0, 2) == Location(PATH, 2, 9)


def test_scalars_are_built_by_yaml_core_rules_and_exponents_are_numbers():
    text = 'a: 1e-5\nb: "1e-5"\nc: 0x1F\nd: ~\ne: true\nf: 2001-12-14\ng: [1, {h: 2.5}]\ni: -0\n'
    assert loader.load_text(text, "p.yaml").data == {
        "a": 1e-05, "b": "1e-5", "c": 31, "d": None, "e": True, "f": "2001-12-14", "g": [1, {"h": 2.5}], "i": 0,
    }


def test_every_error_of_the_file_is_raised_at_once_in_file_order():
    assert refused("a: 1\na: 2\nb: !!set {x}\nc: .nan\n") == [
        "p.yaml:2:1: error[E102]: duplicate key `a` (first defined at line 1)\n  = help: remove one of the two entries",
        "p.yaml:3:4: error[E104]: tag `tag:yaml.org,2002:set` is not allowed\n"
        "  = help: specs hold plain strings, numbers, booleans, lists and mappings only",
        "p.yaml:4:4: error[E203]: `.nan` is not a number: a spec's numbers may not be NaN",
    ]


@pytest.mark.parametrize("text, expected", [
    ("a: &x 1\nb: *x\n", "p.yaml:1:4: error[E103]: anchor `&x` is not allowed\n"
                         "  = help: write the value out in full; kspec specs do not use anchors or aliases"),
    ("a: [1, 2\n", "p.yaml:2:1: error[E101]: while parsing a flow sequence expected ',' or ']', but got '<stream end>'"),
    ("", "p.yaml:1:1: error[E106]: spec is empty\n  = help: start from specs/add.yaml"),
    ("- a\n- b\n", "p.yaml:1:1: error[E106]: a spec must be a mapping of keys to values, not a list"),
    ("? [a]\n: 1\n", "p.yaml:1:3: error[E200]: mapping keys must be plain strings"),
    ("a: " + "9" * 41 + "\n", "p.yaml:1:4: error[E109]: number longer than 40 characters"),
    ("a: x\u2028b: y\n", "p.yaml:1:5: error[E107]: character U+2028 is not allowed in a spec\n"
                         "  = help: YAML reads it as a line break and editors do not; in a double-quoted string, "
                         "write it as the escape \\u2028"),
    ('a: "\\0"\n', "p.yaml:1:4: error[E107]: character U+0000 is not allowed in a spec"),
])
def test_refusals_are_located(text, expected):
    assert refused(text) == [expected]


def test_nesting_is_bounded():
    """The top-level mapping and 31 lists inside it are 32 levels: the most a spec may nest."""
    deep = "a: " + "[" * (loader.MAX_DEPTH - 1) + "]" * (loader.MAX_DEPTH - 1) + "\n"
    assert loader.load_text(deep, "p.yaml").data["a"]
    assert refused("a: " + "[" * (loader.MAX_DEPTH + 1) + "\n") == ["p.yaml:1:35: error[E108]: nesting deeper than 32 levels"]


def test_read_text_checks_the_file(tmp_path):
    spec = tmp_path / "s.yaml"
    with pytest.raises(SpecError) as info:
        loader.read_text(spec)
    assert [d.format() for d in info.value.diagnostics] == [f"{spec}:1:1: error[E100]: No such file or directory"]
    spec.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(SpecError) as info:
        loader.read_text(spec)
    assert [d.format() for d in info.value.diagnostics] == [
        f"{spec}:2:7: error[E107]: byte 0xe9 is not valid UTF-8\n  = help: spec files are UTF-8 text"
    ]
    spec.write_bytes(b"#" * (loader.MAX_FILE_BYTES + 1))
    with pytest.raises(SpecError) as info:
        loader.read_text(spec)
    assert [d.format() for d in info.value.diagnostics] == [f"{spec}:1:1: error[E105]: spec file is larger than 1024 KiB"]
    spec.write_text(VALID_SPEC)
    assert loader.load(spec).data == loader.load_text(VALID_SPEC, str(spec)).data
