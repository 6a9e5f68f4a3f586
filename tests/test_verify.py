"""`kspec verify`: the shipped library passes, planted bugs fail, runs are isolated."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import declared, invoke_kspec, run_kspec

ROOT = Path(__file__).resolve().parent.parent
PLANTED = Path(__file__).resolve().parent / "planted"


def kspec(*args, cwd=ROOT, timeout=600):
    """(rc, out, err) of `kspec *args`, run in this process (the kernels run in worker processes)."""
    return tuple(invoke_kspec(*args, cwd=cwd, timeout=timeout))


def project(tmp_path: Path, *specs: Path) -> Path:
    """A throwaway project holding `specs`, generated."""
    (tmp_path / "specs").mkdir()
    for spec in specs:
        shutil.copy(spec, tmp_path / "specs" / spec.name)
    rc, out, err = kspec("generate", cwd=tmp_path)
    assert rc == 0, out + err
    return tmp_path


ROW_FIELDS = ("kernel", "backend", "case", "dtype", "mode", "seed", "status", "max_abs_err", "max_rel_err", "rel_err",
              "frac_within_tol", "tolerance", "seconds", "message")  # every result row's, in order (docs/verify.md)


def results(path: Path) -> list:
    return json.loads(path.read_text())["results"]


# Mosaic GPU only (test_mesh runs the three row-streaming kernels in Mosaic GPU interpret mode).
GPU_ONLY = {"matmul_persistent", "matmul_bias_gelu_persistent", "matmul_pingpong", "matmul_bias_gelu_pingpong",
            "layer_norm_tma", "rms_norm_tma", "softmax_tma", "flash_attention_hopper"}


# The library's verify on the two CPU backends, in parts of one to three minutes each (for the suite's
# two processes): (backend, this part's number, the backend's number of parts); a part takes every
# n-th spec in name order. The fast suite runs the interpret parts; the mosaic_tpu parts (TPU interpret
# mode, some seven minutes on 2 cores) are slow tests, and `kspec verify`, the README's first command,
# runs the library on both. In the fast suite, test_surface runs the library's DMA, prefetch and
# multi-core specs in TPU interpret mode and test_lower_every_backend_for_its_platform lowers every
# mosaic_tpu kernel for TPU.
LIBRARY_PARTS = [pytest.param("interpret", i, 2, id=f"interpret-{i + 1}of2") for i in range(2)] + [
    pytest.param("mosaic_tpu", i, 4, id=f"mosaic_tpu-{i + 1}of4", marks=pytest.mark.slow) for i in range(4)]


@pytest.mark.heavy
@pytest.mark.parametrize("backend, part, parts", LIBRARY_PARTS)
def test_shipped_library_passes_on_interpret_and_tpu_interpret(tmp_path, backend, part, parts):
    # verify takes a spec's backward specs (its `vjp:`) along: a part names forward specs only.
    takes = {p: re.findall(r"\n +- spec: (\w+)\.yaml", p.read_text()) for p in (ROOT / "specs").glob("*.yaml")}
    backward = {name for names in takes.values() for name in names}
    named = sorted(p for p in takes if p.stem not in GPU_ONLY | backward)[part::parts]
    specs = named + sorted({ROOT / "specs" / f"{name}.yaml" for p in named for name in takes[p]})
    report = tmp_path / "verify.json"
    # One schedule per mosaic_tpu task and normal inputs alone keep this fast: test_multicore and the slow
    # tests run the schedules, test_inputs the other input kinds, and `kspec verify` (the README's first
    # command) the whole library with both.
    rc, out, err = kspec("verify", *[str(p.relative_to(ROOT)) for p in named], "--backend", backend,
                         "--schedules", "1", "--inputs", "normal", "--json", report)
    assert rc == 0, out + err
    rows = results(report)
    assert {r["backend"] for r in rows} == {backend}
    assert {r["kernel"] for r in rows} == {p.stem for p in specs if f"\n  {backend}:" in p.read_text()}
    skipped = sorted((r["kernel"], r["backend"], r["case"]) for r in rows if r["status"] == "skip")
    expected = [s for s in LIBRARY_SKIPS if s[1] == backend and s[0] in {p.stem for p in specs}]
    assert skipped == expected
    assert all(r["status"] == "pass" for r in rows if r["status"] != "skip"), [r for r in rows if r["status"] != "pass"]
    assert {tuple(r["inputs"]) for r in rows if r["status"] == "pass" and r["mode"] == "run"} == {("normal",)}
    assert out.splitlines()[-1].endswith(f"0 failed, 0 errors, {len(expected)} skipped")


# The library's skipped tasks on the CPU backends: ragged cases whose mosaic_tpu kernel rules them out:
# accumulate's in-place (aliased) output, and the sharded matmuls' partial column block (both for TPU
# interpret mode's sake; see the specs), and the derived cases made from those ragged cases; flash
# attention's cases of blocks one element apart, which name the backends they run on (one_key_blocks and
# one_row_blocks: interpret; one_token: mosaic_tpu), and the derived cases made from them; the query
# gradient's case of unequal blocks (ragged_blocks: interpret and triton); the norms'
# cases of a persistent grid walking rows, and their backward cases of rows read in column chunks (triton
# only); and the derived cases made for one backend only, which the declared and shared ones left without a
# property there (codegen/checks/derive.py), on the others
LIBRARY_SKIPS = [('accumulate', 'interpret', 'derived:steps1_M_2'),
                 ('accumulate', 'interpret', 'derived:steps1_N_2'),
                 ('accumulate', 'interpret', 'derived:steps2_M_2'),
                 ('accumulate', 'interpret', 'derived:steps3_M_2'),
                 ('accumulate', 'mosaic_tpu', 'derived:steps1_M'),
                 ('accumulate', 'mosaic_tpu', 'derived:steps1_N'),
                 ('accumulate', 'mosaic_tpu', 'derived:steps2_M'),
                 ('accumulate', 'mosaic_tpu', 'derived:steps3_M'),
                 ('accumulate', 'mosaic_tpu', 'ragged'),
                 ('add', 'interpret', 'derived:steps2_M_2'),
                 ('add_1d', 'interpret', 'derived:steps1_N_2'),
                 ('add_1d', 'interpret', 'derived:steps2_N_2'),
                 ('add_1d', 'interpret', 'derived:steps3_N_2'),
                 ('flash_attention', 'interpret', 'derived:steps1_S_2'),
                 ('flash_attention', 'interpret', 'derived:steps3_H'),
                 ('flash_attention', 'interpret', 'one_token'),
                 ('flash_attention', 'interpret', 'one_token'),
                 ('flash_attention', 'mosaic_tpu', 'derived:steps1_S'),
                 ('flash_attention', 'mosaic_tpu', 'derived:steps1_S_2'),
                 ('flash_attention', 'mosaic_tpu', 'derived:steps3_S'),
                 ('flash_attention', 'mosaic_tpu', 'derived:steps3_S_2'),
                 ('flash_attention', 'mosaic_tpu', 'one_key_blocks'),
                 ('flash_attention', 'mosaic_tpu', 'one_key_blocks'),
                 ('flash_attention', 'mosaic_tpu', 'one_row_blocks'),
                 ('flash_attention', 'mosaic_tpu', 'one_row_blocks'),
                 ('flash_attention_dkdv', 'interpret', 'derived:steps3_H_2'),
                 ('flash_attention_dkdv', 'interpret', 'one_token'),
                 ('flash_attention_dkdv', 'mosaic_tpu', 'derived:steps3_H'),
                 ('flash_attention_dkdv', 'mosaic_tpu', 'derived:steps3_S'),
                 ('flash_attention_dkdv', 'mosaic_tpu', 'one_key_blocks'),
                 ('flash_attention_dq', 'interpret', 'derived:steps1_S'),
                 ('flash_attention_dq', 'interpret', 'derived:steps3_H'),
                 ('flash_attention_dq', 'interpret', 'one_token'),
                 ('flash_attention_dq', 'mosaic_tpu', 'derived:steps1_S'),
                 ('flash_attention_dq', 'mosaic_tpu', 'derived:steps1_S_2'),
                 ('flash_attention_dq', 'mosaic_tpu', 'derived:steps3_S'),
                 ('flash_attention_dq', 'mosaic_tpu', 'one_key_blocks'),
                 ('flash_attention_dq', 'mosaic_tpu', 'ragged_blocks'),
                 ('layer_norm', 'interpret', 'row_loop'),
                 ('layer_norm', 'interpret', 'row_loop'),
                 ('layer_norm', 'mosaic_tpu', 'row_loop'),
                 ('layer_norm', 'mosaic_tpu', 'row_loop'),
                 ('layer_norm_bwd', 'interpret', 'chunked'),
                 ('layer_norm_bwd', 'interpret', 'chunked_even'),
                 ('layer_norm_bwd', 'interpret', 'chunked_odd'),
                 ('layer_norm_bwd', 'interpret', 'chunked_one'),
                 ('layer_norm_bwd', 'interpret', 'derived:steps1_M_2'),
                 ('layer_norm_bwd', 'mosaic_tpu', 'chunked'),
                 ('layer_norm_bwd', 'mosaic_tpu', 'chunked_even'),
                 ('layer_norm_bwd', 'mosaic_tpu', 'chunked_odd'),
                 ('layer_norm_bwd', 'mosaic_tpu', 'chunked_one'),
                 ('layer_norm_bwd', 'mosaic_tpu', 'derived:steps1_M_2'),
                 ('matmul_2d', 'interpret', 'derived:steps1_M'),
                 ('matmul_2d', 'interpret', 'derived:steps2_M_2'),
                 ('matmul_2d', 'interpret', 'derived:steps3_N'),
                 ('matmul_2d', 'mosaic_tpu', 'derived:steps2_M'),
                 ('matmul_2d', 'mosaic_tpu', 'ragged_n'),
                 ('matmul_bias_gelu', 'interpret', 'derived:steps3_M_2'),
                 ('matmul_dp', 'interpret', 'derived:steps1_M'),
                 ('matmul_dp', 'interpret', 'derived:steps2_M_2'),
                 ('matmul_dp', 'interpret', 'derived:steps2_N'),
                 ('matmul_dp', 'mosaic_tpu', 'derived:steps2_M'),
                 ('matmul_dp', 'mosaic_tpu', 'ragged_n'),
                 ('matmul_ksplit', 'interpret', 'derived:steps2_N'),
                 ('matmul_ksplit', 'mosaic_tpu', 'ragged_n'),
                 ('rms_norm', 'interpret', 'row_loop'),
                 ('rms_norm', 'interpret', 'row_loop'),
                 ('rms_norm', 'mosaic_tpu', 'row_loop'),
                 ('rms_norm', 'mosaic_tpu', 'row_loop'),
                 ('rms_norm_bwd', 'interpret', 'chunked'),
                 ('rms_norm_bwd', 'interpret', 'chunked_one'),
                 ('rms_norm_bwd', 'interpret', 'derived:steps1_M_2'),
                 ('rms_norm_bwd', 'mosaic_tpu', 'chunked'),
                 ('rms_norm_bwd', 'mosaic_tpu', 'chunked_one'),
                 ('rms_norm_bwd', 'mosaic_tpu', 'derived:steps1_M_2'),
                 ('softmax', 'interpret', 'derived:steps3_M'),
                 ('softmax', 'mosaic_tpu', 'derived:steps3_M'),
                 ('softmax_dx', 'interpret', 'derived:steps3_M'),
                 ('softmax_dx', 'mosaic_tpu', 'derived:steps3_M')]


@pytest.mark.slow  # about 2 minutes on 2 cores; the fast suite runs the Triton bodies of softmax and the norms
def test_shipped_triton_bodies_pass_in_pallas_interpret_mode(tmp_path):
    """Off a GPU, `--backend triton` runs every Triton body of the library in Pallas interpret mode: each
    declared and derived case passes, gradients included; the cases that name other backends are skipped."""
    report = tmp_path / "verify.json"
    rc, out, err = kspec("verify", "--backend", "triton", "--seed", "3", "--json", report)
    assert rc == 0, out + err
    rows = results(report)
    with_triton = {p.stem for p in (ROOT / "specs").glob("*.yaml") if "\n  triton:" in p.read_text()}
    assert {r["kernel"] for r in rows} == with_triton and {r["backend"] for r in rows} == {"triton"}
    assert {r["mode"] for r in rows} == {"run", "grad"}
    skipped = {r["case"] for r in rows if r["status"] == "skip"}
    assert skipped == {"derived:steps1_M", "derived:steps1_M_2", "derived:steps1_N_2", "derived:steps1_S",
                       "derived:steps1_S_2", "derived:steps2_M_2", "derived:steps2_N", "derived:steps2_N_2",
                       "derived:steps3_H", "derived:steps3_H_2", "derived:steps3_M_2", "derived:steps3_N",
                       "derived:steps3_N_2", "derived:steps3_S", "derived:steps3_S_2",
                       "one_key_blocks", "one_row_blocks", "one_token"}, skipped
    assert all(r["status"] == "pass" for r in rows if r["status"] != "skip"), [r for r in rows if r["status"] != "pass"]
    assert out.splitlines()[-1] == "196 passed, 0 failed, 0 errors, 36 skipped"


def test_json_report_is_complete_and_seed_reproduces(tmp_path):
    a, b, c = (tmp_path / f"{n}.json" for n in "abc")
    spec = ROOT / "specs" / "softmax.yaml"
    for path, seed in ((a, 7), (b, 7), (c, 8)):
        rc, out, _ = kspec("verify", spec, "--backend", "interpret", "--seed", seed, "--json", path)
        assert rc == 0
        assert f"seed: {seed}" in out
    doc = json.loads(a.read_text())
    assert {"kspec_version", "jax_version", "device", "seed", "results"} <= set(doc)
    # The fields docs/verify.md documents, in the order the reports write them; a run row adds its input kinds
    assert {(r["mode"], tuple(r)) for r in doc["results"]} == {("run", (*ROW_FIELDS, "inputs")), ("grad", ROW_FIELDS)}
    # every row passes but the derived case made for triton alone (interpret has its 3 row blocks elsewhere)
    assert {(r["case"], r["status"], r["message"]) for r in doc["results"] if r["status"] != "pass"} == {
        ("derived:steps3_M", "skip", "case `derived:steps3_M` runs only on triton")}
    errs = lambda p: [(r["case"], r["dtype"], r["max_abs_err"], r["rel_err"]) for r in results(p)]  # noqa: E731
    assert errs(a) == errs(b)
    assert errs(a) != errs(c)  # fresh data for another seed


@pytest.mark.slow  # every spec 20 times: minutes on 2 cores
def test_shipped_specs_pass_on_20_seeds_interpret(tmp_path):
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "--backend", "interpret", "--repeat", "20", "--seed", "1000", "--json", report)
    assert rc == 0, out + err
    rows = results(report)
    assert len({r["seed"] for r in rows}) == 20
    # every row passes but those of cases that name other backends (flash attention's one_token: mosaic_tpu)
    assert all(r["status"] == "pass" or (r["status"] == "skip" and "runs only on" in r["message"]) for r in rows)
    assert any(r["status"] == "pass" for r in rows)


@pytest.mark.slow
def test_shipped_specs_pass_on_20_schedules_tpu_interpret(tmp_path):
    # 5 input seeds x the default 4 schedules each: 20 schedules per task, all bitwise alike.
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "--backend", "mosaic_tpu", "--repeat", "5", "--seed", "2000", "--json", report, timeout=3600)
    assert rc == 0, out + err
    # the kernels' own runs; a grad task runs the forward and backward kernels once each
    assert {len(r["schedules"]) for r in results(report) if r["mode"] == "run"} == {4}


def test_planted_bugs_all_fail(tmp_path):
    bugs = ["off_by_one", "uninit_acc", "wrong_dtype", "unwritten"]
    proj = project(tmp_path, *(PLANTED / f"{b}.yaml" for b in bugs))
    report = tmp_path / "r.json"
    junit = tmp_path / "r.xml"
    rc, out, err = kspec("verify", "--seed", "3", "--schedules", "1", "--json", report, "--junit", junit, cwd=proj)
    assert rc == 1, out + err
    rows = results(report)
    assert {r["kernel"] for r in rows} == set(bugs)
    declared_rows = declared(rows)
    assert all(r["status"] == "fail" for r in declared_rows), declared_rows  # some derived shapes miss a bug (one row block)
    failed = [r for r in rows if r["status"] == "fail"]
    by_kernel = {r["kernel"]: r["message"] for r in declared_rows if r["backend"] == "interpret"}
    assert "elements outside tolerance" in by_kernel["off_by_one"]
    assert "are NaN/Inf where the reference is finite" in by_kernel["uninit_acc"]
    assert "are NaN/Inf where the reference is finite" in by_kernel["unwritten"]
    assert by_kernel["wrong_dtype"] == "output o has dtype bfloat16 but the reference returns float32"
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == str(len(failed))
    assert len(suite.findall("testcase/failure")) == len(failed)


HANG = """
name: {name}
inputs: {{x: {{shape: [N], dtype: float32}}}}
outputs: {{o: {{shape: [N], dtype: x}}}}
body: |
  {body}
reference: |
  return x
cases: [{{N: 128}}]
"""


def test_crash_hang_and_memory_blowup_fail_only_their_own_case(tmp_path):
    (tmp_path / "specs").mkdir()
    bodies = {
        "a_hang": "while True: pass",
        "b_crash": "import os; os._exit(3)",
        "c_oom": "np.ones((1 << 50,), np.uint8)",
        "d_fine": "o_ref[...] = x_ref[...]",
    }
    for name, body in bodies.items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(HANG.format(name=name, body=body))
    rc, out, err = kspec("generate", cwd=tmp_path)
    assert rc == 0, out + err
    report = tmp_path / "r.json"
    # As a user runs it: the stdout of `python -m kspec` also holds what its workers print, and no
    # traceback may be there.
    rc, out, err = run_kspec("verify", "--timeout", "20", "--json", report, cwd=tmp_path, timeout=600)
    assert rc == 1
    status = {r["kernel"]: (r["status"], r["message"]) for r in results(report)}
    assert status["a_hang"] == ("error", "timed out after 20 s")
    assert status["b_crash"] == ("error", "worker died: exit code 3")
    assert status["c_oom"][0] == "error" and "MemoryError" in status["c_oom"][1]
    assert status["d_fine"] == ("pass", "")
    assert "Traceback" not in out


def test_stale_generated_files_stop_verify(tmp_path):
    proj = project(tmp_path, ROOT / "specs" / "add.yaml")
    target = proj / "generated" / "add" / "interpret.py"
    target.write_text(target.read_text().replace("x_ref[...] + y_ref[...]", "x_ref[...] - y_ref[...]"))
    rc, out, _ = kspec("verify", cwd=proj)
    assert rc == 1
    assert "generated/add/interpret.py: edited by hand" in out
    assert "generated/ is out of date: run `kspec generate` first" in out


@pytest.mark.heavy
def test_lower_every_backend_for_its_platform(tmp_path):
    report = tmp_path / "lower.json"
    rc, out, err = kspec("verify", "--lower", "--json", report)
    assert rc == 0, out + err
    rows = [r for r in results(report) if r["status"] != "skip"]
    assert {r["backend"] for r in rows} == {"triton", "mosaic_gpu", "mosaic_tpu"}
    assert all(r["status"] == "pass" and r["mode"] in ("lower", "lower-grad") for r in rows)
    platforms = {r["backend"]: r["message"].split()[2] for r in rows}
    assert platforms == {"triton": "cuda", "mosaic_gpu": "cuda", "mosaic_tpu": "tpu"}


# 1-D blocks on mosaic_tpu: Mosaic TPU asks the chip for their tiling while it lowers.
VECTOR_SPEC = """\
kspec: 1
name: scale_vector
params:
  bs: {default: 1024, choices: [256, 512, 1024]}
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
cases:
  - {name: even, N: 4096}
  - {name: ragged, N: 5000, dtype: float32}
backends:
  interpret:
  mosaic_tpu:
"""


def test_lower_names_a_tpu_chip_so_that_1d_blocks_lower_off_a_tpu(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "scale_vector.yaml").write_text(VECTOR_SPEC)
    assert kspec("generate", cwd=tmp_path)[0] == 0
    report = tmp_path / "lower.json"
    rc, out, err = kspec("verify", "--lower", "--backend", "mosaic_tpu", "--json", report, cwd=tmp_path)
    assert rc == 0, out + err
    rows = declared(results(report))
    assert [(r["case"], r["dtype"], r["mode"], r["status"]) for r in rows] == [
        ("even", "float32", "lower", "pass"), ("even", "bfloat16", "lower", "pass"), ("ragged", "float32", "lower", "pass"),
    ]
    assert all(r["message"].startswith("lowered for tpu (TPU v5 lite) (") for r in rows), rows


def test_unknown_backend_is_a_usage_error():
    rc, _, err = kspec("verify", "--backend", "cuda")
    assert rc == 2
    assert "unknown backend 'cuda'" in err


ADD = ROOT / "specs" / "add.yaml"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_before_the_run(value, tmp_path):
    rc, out, err = kspec("verify", "--timeout", value, cwd=project(tmp_path, ADD))
    assert rc == 2
    shown = {"0": "0.0", "-1": "-1.0"}.get(value, value)
    assert f"Invalid value for '--timeout': {shown} is not a positive, finite number of seconds" in err
    assert "seed:" not in out  # refused before any worker started


def test_an_unknown_case_is_refused_with_the_known_ones(tmp_path):
    rc, out, err = kspec("verify", "--case", "squar", cwd=project(tmp_path, ADD))
    assert rc == 2
    assert err == "error: no case named 'squar' in the selected specs (did you mean `square`?); known: ragged, square\n"


def test_a_case_pattern_selects_the_cases_it_matches(tmp_path):
    where = project(tmp_path, ADD)
    rc, out, err = kspec("verify", "--backend", "interpret", "--case", "rag*", "--json", "-", cwd=where)
    assert rc == 0, err
    rows = json.loads(out)["results"]
    assert {r["case"] for r in rows} == {"ragged"}
    rc, out, err = kspec("verify", "--case", "wide_*", cwd=where)
    assert rc == 2
    assert err.startswith("error: no case named 'wide_*' in the selected specs")


@pytest.mark.parametrize("where, says", [("missing/r.json", "folder missing does not exist"), ("specs", "specs is a folder")])
def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(where, says, tmp_path):
    rc, out, err = kspec("verify", "--json", where, cwd=project(tmp_path, ADD))
    assert rc == 2
    assert f"Invalid value for '--json': {says}" in err
    assert "seed:" not in out


def test_json_to_standard_output_holds_the_report_alone(tmp_path):
    rc, out, err = kspec("verify", "--case", "ragged", "--backend", "interpret", "--json", "-", cwd=project(tmp_path, ADD))
    assert rc == 0, err
    report = json.loads(out)  # nothing else on standard output
    assert {r["case"] for r in report["results"]} == {"ragged"}
    assert err.splitlines()[-1] == "1 passed, 0 failed, 0 errors, 0 skipped"
    assert not (tmp_path / "-").exists()


def plant(spec: Path, old: str, new: str) -> None:
    """A bug planted in a project's spec: `old`, found once, becomes `new`; then the project is generated again."""
    text = spec.read_text()
    assert text.count(old) == 1, old
    spec.write_text(text.replace(old, new))
    assert kspec("generate", cwd=spec.parent.parent)[0] == 0


def skipped_unless_named(proj: Path, spec: str, backend: str, case: str, skipped: str) -> Path:
    """Verify one case of a GPU backend off a GPU: without --backend its tasks are skipped (`skipped`, a line of
    the output); named, they run and pass. The report of the second run."""
    rc, out, err = kspec("verify", spec, "--case", case, "--seed", "3", "--schedules", "1", cwd=proj)
    assert rc == 0, out + err
    assert skipped in out.splitlines()
    report = proj / "named.json"
    rc, out, err = kspec("verify", spec, "-b", backend, "--case", case, "--seed", "3", "--json", report, cwd=proj)
    assert rc == 0, out + err
    return report


def test_triton_bodies_run_in_pallas_interpret_mode_off_a_gpu_when_named(tmp_path):
    """Off a GPU, verify skips the Triton tasks unless `--backend triton` names them; named, it runs the Triton
    body in Pallas interpret mode, its gradient too, and a bug of that body alone fails there: softmax's masked
    load filling the pad past N 768 with 0.0 instead of -inf adds exp(-max) per padded column to each row's sum."""
    proj = project(tmp_path, ROOT / "specs" / "softmax.yaml", ROOT / "specs" / "softmax_dx.yaml")
    report = skipped_unless_named(proj, "specs/softmax.yaml", "triton", "bert", (
        "skipped 6 triton task(s): needs a gpu device; this machine's jax platform is cpu "
        "(`--backend triton` runs it here in Pallas interpret mode)"))
    # the spec's backward kernel, softmax_dx, comes along (its vjp: names it)
    assert sorted((r["kernel"], r["backend"], r["mode"], r["dtype"], r["status"]) for r in results(report)) == [
        ("softmax", "triton", "grad", "bfloat16", "pass"), ("softmax", "triton", "grad", "float32", "pass"),
        ("softmax", "triton", "run", "bfloat16", "pass"), ("softmax", "triton", "run", "float32", "pass"),
        ("softmax_dx", "triton", "run", "bfloat16", "pass"), ("softmax_dx", "triton", "run", "float32", "pass")]

    plant(proj / "specs" / "softmax.yaml", "other=-jnp.inf).astype", "other=0.0).astype")
    rc, out, err = kspec("verify", "specs/softmax.yaml", "-b", "triton", "--case", "bert", "--seed", "3",
                         "--json", report, cwd=proj)
    assert rc == 1, out + err
    failed = {(r["mode"], r["dtype"]): r["message"] for r in results(report)
              if r["status"] == "fail" and r["kernel"] == "softmax"}
    assert ("run", "float32") in failed and "elements outside tolerance" in failed[("run", "float32")]


def test_an_out_of_bounds_store_fails_in_interpret_mode_with_its_spec_line(tmp_path):
    """layer_norm_bwd's Triton body clears its partial sums chunk by chunk under a mask; without it, the last
    chunk's store (columns 512 to 767 of a 700-column row) runs past the block. Interpret mode drops those
    elements, so the values still match; on a GPU they land in the next program's row. Verify counts the
    elements each store writes outside its ref and fails the task at the store's line."""
    proj = project(tmp_path, ROOT / "specs" / "layer_norm_bwd.yaml")
    spec = proj / "specs" / "layer_norm_bwd.yaml"
    lines = spec.read_text().splitlines(keepends=True)
    masked = "pltriton.store(dgamma_ref.at[:, pl.ds(c * width, width)], zeros, mask=inside(c))"
    assert lines[173].strip() == masked
    lines[173] = lines[173].replace(", mask=inside(c))", ")")
    spec.write_text("".join(lines))
    assert kspec("generate", cwd=proj)[0] == 0
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "-b", "triton", "--case", "chunked", "--seed", "3", "--json", report, cwd=proj)
    assert rc == 1, out + err
    [row] = results(report)
    assert row["status"] == "fail"
    assert row["message"] == (
        "out-of-bounds store: specs/layer_norm_bwd.yaml:174:15: in body: "
        "pltriton.store(dgamma_ref.at[:, pl.ds(c * width, width)], zeros): "
        "a store to [0:1, 512:768] of a (1, 700) ref writes 68 element(s) outside it\n"
        "(interpret mode drops the elements stored outside; compiled, they land in the next block's rows or past "
        "the array)")


def test_an_out_of_bounds_load_fails_in_interpret_mode_with_its_spec_line(tmp_path):
    """layer_norm's Triton body loads gamma as a power-of-two row under a mask. Unmasked, the load reads past the
    768 columns of gamma's (1, 768) block: interpret mode gives NaN there, which the masked store then leaves
    out, so the values match; on a GPU it reads past the array. Verify fails the task at the load's line."""
    proj = project(tmp_path, ROOT / "specs" / "layer_norm.yaml", ROOT / "specs" / "layer_norm_bwd.yaml")
    plant(proj / "specs" / "layer_norm.yaml", "scale = pltriton.load(gamma_ref.at[:, pl.ds(0, cols)], mask=mask, other=0.0)",
          "scale = pltriton.load(gamma_ref.at[:, pl.ds(0, cols)])")
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "specs/layer_norm.yaml", "-b", "triton", "--case", "bert", "--seed", "3",
                         "--json", report, cwd=proj)
    assert rc == 1, out + err
    failed = [r for r in results(report) if r["kernel"] == "layer_norm" and r["mode"] == "run"]
    assert [r["status"] for r in failed] == ["fail", "fail"]
    assert failed[0]["message"] == (
        "out-of-bounds load: specs/layer_norm.yaml:98:7: in body: scale = pltriton.load(gamma_ref.at[:, "
        "pl.ds(0, cols)]).astype(jnp.float32): a load from [0:1, 0:1024] of a (1, 768) ref reads 256 element(s) "
        "outside it\n(interpret mode reads NaN outside; compiled, a load reads whatever lies there, or faults)")


def test_mosaic_gpu_mesh_kernels_run_in_mosaic_gpu_interpret_mode_off_a_gpu_when_named(tmp_path):
    """Off a GPU, `--backend mosaic_gpu` runs a mesh kernel's Mosaic GPU body in jax's Mosaic GPU interpret mode, its
    gradient too (softmax_dx, its backward kernel, on this machine's own backend). A CTA's row count one too many
    makes two CTAs copy row 600 of a 600-row x in with a TMA copy that promises to stay in bounds: the values of
    rows 0 to 599 stay right, and the simulator raises on the copy, which fails the task, naming the body, the
    slices the copy took and the buffer's shape."""
    proj = project(tmp_path, ROOT / "specs" / "softmax_tma.yaml", ROOT / "specs" / "softmax_dx.yaml")
    report = skipped_unless_named(proj, "specs/softmax_tma.yaml", "mosaic_gpu", "ragged", (
        "skipped 2 mosaic_gpu task(s): needs a gpu device; this machine's jax platform is cpu "
        "(`--backend mosaic_gpu` runs it here in Mosaic GPU interpret mode)"))
    assert sorted((r["kernel"], r["mode"], r["status"]) for r in results(report)) == [
        ("softmax_tma", "grad", "pass"), ("softmax_tma", "run", "pass")]

    plant(proj / "specs" / "softmax_tma.yaml", "n = (M - sm + ctas_total - 1)", "n = (M - sm + ctas_total + 1)")
    rc, out, err = kspec("verify", "specs/softmax_tma.yaml", "-b", "mosaic_gpu", "--case", "ragged", "--seed", "3",
                         "--json", report, cwd=proj)
    assert rc == 1, out + err
    run = [r for r in results(report) if r["mode"] == "run"]
    assert [r["status"] for r in run] == ["fail"]
    assert run[0]["message"] == (
        "out-of-bounds load or copy: in the mosaic_gpu body of softmax_tma: reads [600:601, 0:256] of a (600, 256) "
        "buffer\n(Mosaic GPU interpret mode raises on it; compiled, a TMA copy that promises to stay in bounds, or a "
        "load, reads or writes whatever lies past the array)")


def test_mosaic_gpu_pipelined_and_unsupported_bodies_are_skipped_in_mosaic_gpu_interpret_mode(tmp_path):
    """A pipelined Mosaic GPU kernel (kind: pallas_call, rendered with emit_pipeline) is skipped off a GPU: TMA clips
    its ragged blocks on a GPU, and the simulator would raise on them. A body the simulator cannot run (the
    persistent matmul's wgmma accumulator) is skipped with jax's words for what it lacks."""
    proj = project(tmp_path, ROOT / "specs" / "add.yaml", ROOT / "specs" / "matmul_persistent.yaml")
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "-b", "mosaic_gpu", "--case", "ragged", "--case", "square", "--json", report,
                         cwd=proj)
    assert rc == 0, out + err
    why = {r["kernel"]: r["message"] for r in results(report)}
    assert why["add"] == ("Mosaic GPU interpret mode runs the mesh kernels (kind: mesh) here: a pipelined kernel's "
                          "partial blocks, which TMA clips on a GPU, raise there as out-of-bounds reads")
    assert why["matmul_persistent"] == "Mosaic GPU interpret mode of this jax does not run this body: nan + cluster_barrier"
