"""The `sharding:` section: schema, checks, the generated sharded.py, `kspec verify --devices`,
and a sharded kernel across two jax.distributed processes on the CPU."""

from __future__ import annotations

import subprocess
import sys

from kspec.codegen import project as pipeline
from kspec.codegen.checks import sharding
from conftest import REPO, VALID_SPEC, mutate

SHARDED = ("matmul_dp", "matmul_ksplit", "matmul_2d", "softmax_rows")


def _with_sharding(section: str) -> str:
    return mutate(VALID_SPEC, ("cases:", "sharding:\n" + section + "cases:"))


def test_unknown_sharding_key_is_a_schema_error(kspec, write_spec):
    write_spec(_with_sharding("  mesh: {d: 4}\n  spec: {x: [d]}\n"), "bad")
    r = kspec("check", "specs/bad.yaml")
    assert r.rc == 2 and "error[E201]: unknown key `spec` in sharding" in r.out


def test_model_of_the_example_specs():
    ksplit = pipeline.compile_spec(REPO / "specs" / "matmul_ksplit.yaml")
    assert ksplit.ok, ksplit.diagnostics
    sh = ksplit.spec.sharding
    assert [(a.name, a.size) for a in sh.mesh] == [("k", None)]
    assert sh.split("x", 2) == ((), ("k",)) and sh.split("o", 2) == ((), ())
    assert (sh.reductions["o"].op, sh.reductions["o"].axes) == ("psum", ("k",))
    assert sh.check_vma and sh.axis_names == ("k",)
    two_d = pipeline.compile_spec(REPO / "specs" / "matmul_2d.yaml").spec.sharding
    assert two_d.sizes(8) == {"data": 4, "model": 2} and two_d.sizes() == {"data": None, "model": 2}
    assert two_d.unfit(6) is None and "multiple of 2" in two_d.unfit(3)


def test_per_shard_rules_need_the_device_count():
    """A `devices` axis: kspec check cannot size the shards; verify checks them for N devices."""
    c = pipeline.compile_spec(REPO / "specs" / "matmul_ksplit.yaml")
    case = c.spec.cases[0]  # K = 1024: 128 per device on 8 devices, 64 on 16 (below bk = 128)
    assert sharding.case_checks(c.spec, case, c.spec.sharding.sizes(8)) == []
    found = sharding.case_checks(c.spec, case, c.spec.sharding.sizes(16))
    assert found and {d.code for d in found} == {"E806"}
    assert "per shard (M=128, N=128, K=64)" in found[0].message and "[E501]" in found[0].message
    assert [d.code for d in sharding.case_checks(c.spec, case, c.spec.sharding.sizes(3))] == ["E804"]


def test_sharded_module_only_for_sharded_specs():
    for name in SHARDED:
        text = (REPO / "generated" / name / "sharded.py").read_text()
        assert f"def {name}_sharded(" in text and "jax.shard_map(" in text
    assert not (REPO / "generated" / "matmul" / "sharded.py").exists()
    ksplit = (REPO / "generated" / "matmul_ksplit" / "sharded.py").read_text()
    assert 'return lax.psum(o, ("k",))' in ksplit and 'IN_SPECS = (P(None, "k"), P("k", None))' in ksplit
    kernel = (REPO / "generated" / "matmul" / "mosaic_tpu.py").read_text()
    assert "manual_axis_type=_signature.manual_axis_type(x, y)" in kernel


def test_verify_devices_8(kspec, repo_copy):
    specs = [f"specs/{n}.yaml" for n in ("matmul_ksplit", "softmax_rows")]
    r = kspec("verify", *specs, "--devices", "8", "--seed", "3", cwd=repo_copy, timeout=120)
    assert r.rc == 0, r.both
    rows = [ln.split() for ln in r.out.splitlines() if " sharded " in ln]
    assert {(row[0], row[1]) for row in rows} == {
        ("matmul_ksplit", "mosaic_tpu"), ("softmax_rows", "mosaic_tpu"), ("softmax_rows", "interpret")
    }
    assert all(row[5] == "pass" for row in rows)
    assert "skipped 4 interpret task(s): interpret=True pallas_calls fail inside shard_map(check_vma=True)" in r.out
    assert "skipped 1 mosaic_tpu task(s): mosaic_tpu needs N in whole blocks of bn" in r.out


def test_verify_devices_reports_a_mesh_that_does_not_fit(kspec, repo_copy):
    r = kspec("verify", "specs/matmul_2d.yaml", "--devices", "3", "-b", "mosaic_tpu", cwd=repo_copy, timeout=120)
    assert r.rc == 0, r.both
    assert "skipped 5 mosaic_tpu task(s): mesh (data=devices, model=2) needs a multiple of 2 devices, have 3" in r.out


# A sharded kernel with 1-D blocks: lowering its shard_map for Mosaic TPU needs a TPU chip.
SHARDED_VECTOR = """\
kspec: 1
name: scale_shards
params:
  bs: {default: 1024, choices: [256, 1024]}
inputs:
  x: {shape: [N], dtype: [float32, bfloat16]}
outputs:
  o: {shape: [N], dtype: x}
grid: ["cdiv(N, bs)"]
blocks:
  x: {block_shape: [bs], index_map: "i -> (i,)"}
  o: {block_shape: [bs], index_map: "i -> (i,)"}
body: |
  o_ref[...] = x_ref[...] * 2
reference: |
  return x * 2
sharding:
  mesh: {d: devices}
  specs:
    x: [d]
    o: [d]
cases:
  - {name: c, N: 8192, dtype: float32}
backends:
  interpret:
  triton:
  mosaic_tpu:
"""


def test_verify_lower_with_devices_lowers_the_sharded_variants(kspec, repo_copy):
    """`--lower --devices N` lowers each sharded function on a mesh of N devices for its backend's
    platform (Mosaic TPU for a named chip), where `--devices N` alone would run it."""
    import json
    import re

    (repo_copy / "specs" / "scale_shards.yaml").write_text(SHARDED_VECTOR)
    assert kspec("generate", "specs/scale_shards.yaml", cwd=repo_copy).rc == 0
    r = kspec("verify", "specs/softmax_rows.yaml", "specs/scale_shards.yaml", "--lower", "--devices", "2",
              "--case", "square", "--case", "c", "--json", "lower.json", cwd=repo_copy, timeout=120)
    assert r.rc == 0, r.both
    rows = json.loads((repo_copy / "lower.json").read_text())["results"]
    ran = [(x["kernel"], x["backend"], x["dtype"], x["mode"], x["status"]) for x in rows if x["status"] != "skip"]
    assert ran == [
        ("softmax_rows", "triton", "float32", "lower-sharded", "pass"),
        ("softmax_rows", "triton", "bfloat16", "lower-sharded", "pass"),
        ("softmax_rows", "mosaic_tpu", "float32", "lower-sharded", "pass"),
        ("softmax_rows", "mosaic_tpu", "bfloat16", "lower-sharded", "pass"),
        ("scale_shards", "triton", "float32", "lower-sharded", "pass"),
        ("scale_shards", "mosaic_tpu", "float32", "lower-sharded", "pass"),
    ]
    said = {x["backend"]: re.sub(r" \(\d+ characters of StableHLO\)$", "", x["message"]) for x in rows if x["status"] == "pass"}
    assert said == {"triton": "lowered for cuda on a mesh of 2 devices",
                    "mosaic_tpu": "lowered for tpu (TPU v5 lite) on a mesh of 2 devices"}
    assert "skipped 3 interpret task(s): nothing to lower: runs in interpret mode" in r.out


def test_two_processes_with_jax_distributed():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "distributed_verify.py"), "--timeout", "50"],
        capture_output=True, text=True, timeout=60,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("process ")]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert len(lines) == 2 and all("4 local of 8 devices" in ln and ln.endswith("pass") for ln in lines)
