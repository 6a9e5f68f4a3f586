"""scripts/mutation_test.py: mutants of a spec's kernel side, made on the parsed bodies and expressions, and
how `kspec check` and `kspec verify` judge them (killed by check, killed by verify, survived, equivalent)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "mutation_test.py"

# A row max over a ragged column walk (60 columns in blocks of 8): the last block is masked.
ROWMAX = """\
kspec: 1
name: rowmax
doc: The largest element of each row, walking the columns in blocks.
params:
  bn: 8
inputs:
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, 1], dtype: x}
grid: {k: "cdiv(N, bn)"}
blocks:
  x: {block_shape: [M, bn], index_map: "k -> (0, k)"}
  o: {block_shape: [M, 1], index_map: "k -> (0, 0)"}
body: |
  @pl.when(k == 0)
  def _init():
      o_ref[...] = jnp.full_like(o_ref, -jnp.inf)

  cols = k * bn + lax.broadcasted_iota(jnp.int32, (M, bn), 1)
  x = jnp.where(cols < N, x_ref[...], -1e30)
  o_ref[...] = jnp.maximum(o_ref[...], jnp.max(x, axis=1, keepdims=True))
reference: |
  return jnp.max(x, axis=1, keepdims=True)
cases:
  - {name: ragged, M: 8, N: 60}
"""


def mutation_test(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "rowmax.yaml"
    spec.write_text(ROWMAX)
    return subprocess.run([sys.executable, SCRIPT, str(spec), *args], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


def test_list_shows_each_mutant_as_one_change_of_the_parsed_spec(tmp_path):
    r = mutation_test(tmp_path, "--list", "--operator", "compare_swap", "--operator", "index_off_by_one",
                      "--operator", "drop_init", "--operator", "grid_floordiv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "rowmax:compare_swap:20:17  body  [interpret]  `cols < N` -> `(cols <= N)`",
        "rowmax:drop_init:17:7  body  [interpret]  `o_ref[...] = jnp.full_like(o_ref, -jnp.inf)` -> `pass`",
        "rowmax:grid_floordiv:10:12  grid.k  [interpret]  `cdiv(N, bn)` -> `(N // bn)`",
        "rowmax:index_off_by_one:12:50  blocks.x.index_map  [interpret]  `k` -> `(k + 1)`",
        "4 mutant(s)",
    ]


def test_mutants_are_classified(tmp_path):
    """A comparison swap in the mask reads the padding: verify kills it. An index map past the last block:
    check kills it. 1e30 -> 1e+30 (c + 1 rounds back to c) leaves the generated code's tree unchanged:
    equivalent. -inf -> 0 as the running max's start passes on normal and large data, whose row maxima are
    positive: it survives. A mutant listed in the equivalents file is not run."""
    equivalents = tmp_path / "equivalents.yaml"
    equivalents.write_text("- {mutant: 'rowmax:drop_init:17:7', reason: listed for the test}\n")
    ids = ["rowmax:compare_swap:20:17", "rowmax:constant:12:47", "rowmax:constant:20:40",
           "rowmax:neg_inf_zero:17:41", "rowmax:drop_init:17:7"]
    args = [a for m in ids for a in ("--mutant", m)]
    r = mutation_test(tmp_path, *args, "--equivalents", str(equivalents), "--json", "r.json")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    got = {m["id"]: (m["outcome"], m["detail"]) for m in report["mutants"]}
    assert got == {
        "rowmax:compare_swap:20:17": ("verify", "fail: rowmax[interpret] ragged float32"),
        "rowmax:constant:12:47": ("check", "specs/rowmax.yaml:12:40: error[E502]: case `ragged`: x.index_map at "
                                           "grid point (0,) gives block index (1, 0); dim 0 is 1, valid 0..0"),
        "rowmax:constant:20:40": ("equivalent", "generated package AST-identical"),
        "rowmax:neg_inf_zero:17:41": ("survived", "verify passed"),
        "rowmax:drop_init:17:7": ("equivalent", "reviewed: listed for the test"),
    }
    lines = r.stdout.splitlines()
    assert lines[:5] == [
        "operator      mutants  killed by check  killed by verify  survived  equivalent  timeout  score",
        "compare_swap  1        0                1                 0         0           0        100%",
        "constant      2        1                0                 0         1           0        100%",
        "drop_init     1        0                0                 0         1           0        -",
        "neg_inf_zero  1        0                0                 1         0           0        0%",
    ]
    assert "survived: rowmax:neg_inf_zero:17:41  body  `-jnp.inf` -> `0.0`" in lines


def test_a_mutant_that_is_not_there_is_bad_usage(tmp_path):
    r = mutation_test(tmp_path, "--mutant", "rowmax:constant:1:1", "--list")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == ("mutation_test.py: error: no such mutant: rowmax:constant:1:1 "
                                          "(see --list)")


def test_a_run_split_by_check_only_and_resumed_runs_each_mutant_once(tmp_path):
    """--check-only judges what check and the generated tree decide and leaves the rest unjudged; --resume then
    runs only those, and the results file ends with every verdict."""
    ids = ["rowmax:compare_swap:20:17", "rowmax:constant:12:47", "rowmax:constant:20:40"]
    args = [a for m in ids for a in ("--mutant", m)]
    first = mutation_test(tmp_path, *args, "--check-only", "--resume", "r.json")
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert {m["id"]: m["outcome"] for m in report["mutants"]} == {
        "rowmax:compare_swap:20:17": "unjudged", "rowmax:constant:12:47": "check",
        "rowmax:constant:20:40": "equivalent"}
    assert first.stdout.splitlines()[:2] == [
        "operator      mutants  killed by check  killed by verify  survived  equivalent  timeout  unjudged  score",
        "compare_swap  1        0                0                 0         0           0        1         -",
    ]

    # A resumed run of a part of the mutants (here one, by --mutant) runs what it selected and keeps the rest
    # of the file as it was.
    third = mutation_test(tmp_path, "--mutant", ids[0], "--resume", "r.json")
    assert third.returncode == 0, third.stdout + third.stderr
    progress = [ln for ln in third.stderr.splitlines() if ln.startswith(("[", "0 of"))]
    assert progress == ["0 of 1 mutant(s) judged in r.json; running the rest",
                        "[1/1] rowmax:compare_swap:20:17: verify (" + progress[1].split("(")[1]]
    assert progress[1].endswith(") fail: rowmax[interpret] ragged float32")
    report = json.loads((tmp_path / "r.json").read_text())
    assert {m["id"]: m["outcome"] for m in report["mutants"]} == {
        "rowmax:compare_swap:20:17": "verify", "rowmax:constant:12:47": "check",
        "rowmax:constant:20:40": "equivalent"}
    assert "1 mutant(s) run in " in third.stdout and "judged before" not in third.stdout

    again = mutation_test(tmp_path, *args, "--resume", "r.json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 of 3 mutant(s) judged in r.json; running the rest" in again.stderr
    assert "0 mutant(s) run in " in again.stdout and again.stdout.rstrip().endswith("; 3 judged before")

    other = mutation_test(tmp_path, *args, "-b", "interpret", "--resume", "r.json")
    assert other.returncode == 2
    assert other.stderr.splitlines()[-1] == ("mutation_test.py: error: r.json: its mutants were judged on "
                                              "interpret, mosaic_tpu, not interpret")
