"""Params with `default: null`: the body and the reference see None unless a case or a call passes a
value; verify runs both variants; a case may set null only where the default is null, and no
expression may read the param while it is None."""

from __future__ import annotations

import json

from conftest import declared, invoke_kspec, mutate

SCALED = """\
kspec: 1
name: scaled
params:
  bs: 8
  scale: {default: null, doc: "A factor; None doubles."}
inputs:
  x: {shape: [N], dtype: float32}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = x_ref[...] * (2.0 if scale is None else scale)
reference: |
  return x * (2.0 if scale is None else scale)
cases:
  - {name: doubled, N: 60}
  - {name: scaled, N: 64, params: {scale: 0.5}}
"""


def _check(tmp_path, text: str) -> list:
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "scaled.yaml").write_text(text)
    r = invoke_kspec("check", "specs/scaled.yaml", cwd=tmp_path)
    return [r.rc] + r.out.splitlines()


def test_both_variants_verify(tmp_path):
    assert _check(tmp_path, SCALED) == [0, "1 spec(s) OK"]
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    backend = (tmp_path / "generated" / "scaled" / "interpret.py").read_text()
    assert "def scaled(x, *, bs=8, scale=None):" in backend
    report = tmp_path / "r.json"
    r = invoke_kspec("verify", "--seed", "2", "--json", report, cwd=tmp_path, timeout=600)
    assert r.rc == 0, r.both[-2000:]
    rows = declared(json.loads(report.read_text())["results"])
    assert {(x["case"], x["status"]) for x in rows} == {("doubled", "pass"), ("scaled", "pass")}
    # a body that ignores the param fails the case that sets it, and only that one
    (tmp_path / "specs" / "scaled.yaml").write_text(mutate(SCALED, ("x_ref[...] * (2.0 if scale is None else scale)",
                                                                     "x_ref[...] * 2.0")))
    assert invoke_kspec("generate", cwd=tmp_path).rc == 0
    r = invoke_kspec("verify", "--seed", "2", "--json", report, cwd=tmp_path, timeout=600)
    assert r.rc == 1
    rows = declared(json.loads(report.read_text())["results"])
    assert {(x["case"], x["status"]) for x in rows} == {("doubled", "pass"), ("scaled", "fail")}


def test_null_only_where_the_default_is_null(tmp_path):
    assert _check(tmp_path, mutate(SCALED, ("params: {scale: 0.5}", "params: {bs: null}"))) == [
        2,
        "specs/scaled.yaml:20:5: error[E500]: case `scaled` sets `bs` to null, but its default is not null",
        "  = help: only a param with `default: null` takes None",
        "1 error(s) in 1 of 1 spec(s)",
    ]


def test_no_expression_reads_a_none_param(tmp_path):
    assert _check(tmp_path, mutate(SCALED, ('"cdiv(N, bs)"', '"cdiv(N, bs * (scale + 1))"'))) == [
        2,
        "specs/scaled.yaml:10:8: error[E303]: case `doubled`: grid: `scale` is None here: an expression cannot use it",
        "specs/scaled.yaml:10:8: error[E303]: case `scaled`: grid: `cdiv(N, bs * (scale + 1))` is 6.0, not an integer",
        "2 error(s) in 1 of 1 spec(s)",
    ]
