"""`kspec tune` through the real machinery on the CPU: interpret backend, tiny spaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPEC = """
name: scale
params:
  bm: {default: 8, choices: [8, 16, 24, 32]}
  bn: {default: 128, choices: [128, 256]}
  wrong: {default: 0, choices: [0, 1]}
inputs:
  x: {shape: [M, N], dtype: float32}
outputs:
  o: {shape: [M, N], dtype: x}
constraints:
  - {expr: "M % bm == 0", message: "M must be a multiple of bm"}
grid: {i: "cdiv(M, bm)", j: "cdiv(N, bn)"}
blocks:
  x: {block_shape: [bm, bn], index_map: "i, j -> (i, j)"}
  o: {block_shape: [bm, bn], index_map: "i, j -> (i, j)"}
body: |
  o_ref[...] = x_ref[...] * (2.0 + wrong)
reference: |
  return x * 2.0
cases: [{M: 32, N: 256}]
bench: [{name: small, M: 64, N: 512}]
backends:
  interpret:
  mosaic_tpu:
"""


def kspec(*args, cwd):
    proc = subprocess.run(
        [sys.executable, "-c", "import cli; cli.run()", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    return proc.returncode, proc.stdout + proc.stderr


def project(tmp_path: Path) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "scale.yaml").write_text(SPEC)
    rc, out = kspec("generate", cwd=tmp_path)
    assert rc == 0, out
    return tmp_path


def entries(path: Path) -> list:
    return json.loads(path.read_text())["entries"]


def test_tune_prunes_rejects_wrong_configs_and_resumes(tmp_path):
    proj = project(tmp_path)
    rc, out = kspec("tune", "--backend", "interpret", "--seed", "1", "--samples", "3", cwd=proj)
    assert rc == 0, out
    table = proj / "tuning" / "scale" / "cpu.json"
    rows = entries(table)
    status = {(e["params"]["bm"], e["params"]["bn"], e["params"]["wrong"]): e["status"] for e in rows}
    assert len(status) == 16
    # bm=24 does not divide M=64: pruned by the constraint before compiling.
    assert {k for k, s in status.items() if s == "pruned"} == {(24, bn, w) for bn in (128, 256) for w in (0, 1)}
    pruned = next(e for e in rows if e["status"] == "pruned")
    assert pruned["message"] == "E501: case `small` (M=64, bm=24): M must be a multiple of bm"
    # wrong=1 computes x * 3: verified against the reference and rejected, never timed.
    assert all(s == "fail" for k, s in status.items() if k[2] == 1 and k[0] != 24)
    assert all(e["ms"] is None for e in rows if e["status"] != "pass")
    assert all(e["ms"] > 0 for e in rows if e["status"] == "pass")
    assert {e["jax_version"] for e in rows} and all(len(e["kernel_sha"]) == 64 for e in rows)
    assert all(e["bucket"] == [64, 512] and e["dtype"] == "float32" for e in rows)
    assert "16 configs, 4 pruned statically, 12 to try" in out
    assert "rejected {'bm': 8, 'bn': 128, 'wrong': 1}: fail" in out

    rc, out = kspec("tune", "--backend", "interpret", "--seed", "1", "--samples", "3", cwd=proj)
    assert rc == 0
    assert "16 configs, 4 pruned statically, 0 to try" in out  # resumed: nothing run twice
    assert len(entries(table)) == 16


def test_random_strategy_respects_the_trial_budget(tmp_path):
    proj = project(tmp_path)
    rc, out = kspec("tune", "--backend", "interpret", "--strategy", "random", "--budget-trials", "3",
                    "--seed", "5", "--samples", "3", "--tuning-dir", tmp_path / "t", cwd=proj)
    assert rc == 0, out
    tried = [e for e in entries(tmp_path / "t" / "scale" / "cpu.json") if e["status"] != "pruned"]
    assert len(tried) == 3


def test_unknown_strategy_is_a_usage_error(tmp_path):
    rc, out = kspec("tune", "--strategy", "genetic", cwd=project(tmp_path))
    assert rc == 2
    assert "--strategy must be exhaustive or random" in out


def test_tuned_entry_is_checked_against_constraints_with_the_untuned_params(monkeypatch):
    """A constraint may read an untuned param (matmul_persistent: K % tk == 0); resolving a
    tuned entry for this device must see it (it raised KeyError: 'tk' on an H200)."""
    import jax
    import jax.numpy as jnp

    from generated.matmul_persistent import _tuning

    kind = jax.devices()[0].device_kind
    key = (kind, "mosaic_gpu", "bfloat16", (8192, 8192, 8192), (("epi", 64), ("tk", 64)))
    monkeypatch.setitem(_tuning.TABLE, key, {"snake": 16, "steps": 3, "tm": 128, "tn": 64})
    a = jnp.zeros((8, 8), jnp.bfloat16)
    got = _tuning.resolve("mosaic_gpu", (a, a), (8192, 8192, 8192), {}, {"tk": 64, "epi": 64})
    assert got == {"tm": 128, "tn": 64, "steps": 3, "snake": 16}
    # the tuned config breaks the constraint for these dims (N % (2 * tn)): defaults instead
    got = _tuning.resolve("mosaic_gpu", (a, a), (8192, 8192, 8100), {}, {"tk": 64, "epi": 64})
    assert got == _tuning.DEFAULTS["mosaic_gpu"]
