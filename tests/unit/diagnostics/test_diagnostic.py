"""diagnostics/: how a diagnostic reads, on a terminal and piped, and the codes it may carry.
tests/test_diagnostics.py pins the text of every code through `kspec check`."""

from __future__ import annotations

import pytest

from kspec.codegen.diagnostics import Diagnostic, Location, SpecError, did_you_mean


def test_terminal_format_quotes_the_line_with_a_caret():
    d = Diagnostic("E401", "x: unknown dtype `float31`", Location("specs/bad.yaml", 2, 7), "did you mean `float32`?")
    lines = ["inputs:", "  x: {float31}"]
    assert d.format(lines) == (
        "specs/bad.yaml:2:7: error[E401]: x: unknown dtype `float31`\n"
        "   2 |   x: {float31}\n"
        "             ^\n"
        "  = help: did you mean `float32`?"
    )
    assert d.format() == (
        "specs/bad.yaml:2:7: error[E401]: x: unknown dtype `float31`\n  = help: did you mean `float32`?"
    )


def test_unregistered_code_is_refused():
    with pytest.raises(ValueError, match="E999"):
        Diagnostic("E999", "nope", Location("x"))


def test_a_spec_error_carries_its_diagnostics_in_file_order():
    late = Diagnostic("E201", "unknown key `b`", Location("s.yaml", 9, 1))
    early = Diagnostic("E401", "x: unknown dtype `f`", Location("s.yaml", 2, 7))
    same_place = Diagnostic("E201", "unknown key `a`", Location("s.yaml", 2, 7))
    error = SpecError([late, early, same_place])
    assert error.diagnostics == [same_place, early, late]  # by place, then by code
    assert str(error) == "\n".join(d.format() for d in error.diagnostics)


def test_did_you_mean_offers_the_closest_name_if_any_is_close():
    assert did_you_mean("flaot32", ["float16", "float32", "int32"]) == "did you mean `float32`?"
    assert did_you_mean("shape", ["dtype", "doc"]) is None
