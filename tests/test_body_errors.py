"""A body or a reference that raises while verify runs it: the message names the spec's file, line and
column of the line that raised, then the error."""

from __future__ import annotations

from kspec.cli import EXAMPLE_SPEC

BODY = "  o_ref[...] = (x_ref[...].astype(jnp.float32) * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)\n"
REFERENCE = "  return (x.astype(jnp.float32) * w.astype(jnp.float32)).astype(x.dtype)\n"


def verify(kspec, write_spec, text):
    path = write_spec(text, "scale_rows")
    assert kspec("generate", str(path)).rc == 0
    return kspec("verify", str(path), "--backend", "interpret", "--case", "square", "--inputs", "normal",
                 "--seed", "1", timeout=300)


def test_a_body_that_raises_is_located_in_the_spec(kspec, write_spec):
    assert BODY in EXAMPLE_SPEC
    bad = "  x = x_ref[...].reshape(3, 7)\n" + BODY
    r = verify(kspec, write_spec, EXAMPLE_SPEC.replace(BODY, bad))
    assert r.rc == 1, r.both
    line = 1 + EXAMPLE_SPEC[:EXAMPLE_SPEC.index(BODY)].count("\n")
    assert (f"    specs/scale_rows.yaml:{line}:3: in body: x = x_ref[...].reshape(3, 7)\n"
            "    TypeError: cannot reshape array of shape (8, 128) (size 1024) into shape (3, 7) (size 21)\n") in r.out


def test_a_reference_that_raises_is_located_in_the_spec(kspec, write_spec):
    assert REFERENCE in EXAMPLE_SPEC
    bad = "  x = x.reshape(3, 7)\n" + REFERENCE
    r = verify(kspec, write_spec, EXAMPLE_SPEC.replace(REFERENCE, bad))
    assert r.rc == 1, r.both
    line = 1 + EXAMPLE_SPEC[:EXAMPLE_SPEC.index(REFERENCE)].count("\n")
    assert f"    specs/scale_rows.yaml:{line}:3: in reference: x = x.reshape(3, 7)\n" in r.out, r.out


def test_traceback_shows_the_whole_stack(kspec, write_spec):
    bad = "  x = x_ref[...].reshape(3, 7)\n" + BODY
    path = write_spec(EXAMPLE_SPEC.replace(BODY, bad), "scale_rows")
    assert kspec("generate", str(path)).rc == 0
    args = ("verify", str(path), "--backend", "interpret", "--case", "square", "--inputs", "normal", "--seed", "1")
    short, whole = kspec(*args, timeout=300), kspec(*args, "--traceback", timeout=300)
    assert "Traceback (most recent call last):" not in short.out
    assert "Traceback (most recent call last):" in whole.out and whole.out.count('    File "') > short.out.count('    File "')
    assert "/scale_rows/interpret.py" in whole.out, whole.out
