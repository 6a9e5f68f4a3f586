"""Resource bounds: hostile sizes are answered with bounded work and bounded memory.

Each input is checked (and rendered, if accepted) in a fresh interpreter that first
warms up on the valid spec, so that the work and the peak-RSS growth measured are
those of the input alone. Work is counted, not timed: the number of Python function
calls the check makes (a profile hook counts them), which a shared, loaded machine
does not change; a missing bound (a grid walked point by point, a space built whole)
multiplies it. The interpreter runs under an address-space limit, so a
missing bound fails the test instead of the machine. test_hostile.py pins the
diagnostics of the classic bombs through the CLI; here they get their memory bound,
and the sizes it does not cover get both.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from kspec.codegen.spec import loader
from conftest import REPO, VALID_SPEC, mutate
from test_hostile import BOMBS, REJECTED

V = VALID_SPEC
CALLS = 16_000_000  # Python function calls; the most any input here needs is ~11.5 million (rank-8 grid sample)
RSS_GROWTH_KIB = 64 * 1024
ADDRESS_SPACE = 3 << 30  # far above a normal run; a blow-up hits it and dies

PROBE = r"""
import json, resource, sys
from pathlib import Path
from kspec.codegen import project as pipeline

def run(path):
    compiled = pipeline.compile_spec(path)
    if compiled.ok:
        pipeline.plan(compiled, path.parent.parent / "generated")
    return compiled

run(Path(sys.argv[2]))  # imports, caches, the schema validator
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
calls = [0]

def count(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1

sys.setprofile(count)
compiled = run(Path(sys.argv[1]))
sys.setprofile(None)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"calls": calls[0], "rss_kib": grown, "ok": compiled.ok,
                  "diagnostics": [d.format() for d in compiled.diagnostics[:3]]}))
"""


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def probe(tmp_path, content, timeout: float = 30) -> dict:
    """Check `content` in a fresh, memory-limited interpreter; calls made, RSS growth, outcome."""
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    target, warm = specs / "hostile.yaml", specs / "warm.yaml"
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    warm.write_text(V)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "specs/hostile.yaml", "specs/warm.yaml"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def assert_bounded(result: dict) -> None:
    assert result["calls"] < CALLS, result
    assert result["rss_kib"] < RSS_GROWTH_KIB, result


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_hostile_bombs_use_bounded_memory(name, tmp_path):
    result = probe(tmp_path, REJECTED[name][0])
    assert_bounded(result)
    assert not result["ok"]
    assert f":{REJECTED[name][1]}: " in result["diagnostics"][0]


def _huge_grid(size: str) -> str:
    """A grid of `size` steps whose blocks all stay at block 0 (a legit, if slow, kernel)."""
    return mutate(
        V,
        ('grid: ["cdiv(N, bs)"]', f"grid: [{size}]"),
        ('x: {block_shape: [bs], index_map: "i -> (i,)"}', 'x: {block_shape: [N], index_map: "i -> (0,)"}'),
        ('o: {block_shape: [bs], index_map: "i -> (i,)"}', 'o: {block_shape: [N], index_map: "i -> (0,)"}'),
    )


RANK8 = mutate(
    V,
    ("x: {shape: [N]", "x: {shape: [N, N, N, N, N, N, N, N]"),
    ("o: {shape: [N]", "o: {shape: [N, N, N, N, N, N, N, N]"),
    ('grid: ["cdiv(N, bs)"]', "grid: [" + ", ".join(['"cdiv(N, bs * 1024)"'] * 6) + "]"),  # 2**27 steps: fits int32
    ('x: {block_shape: [bs], index_map: "i -> (i,)"}',
     'x: {block_shape: [bs, bs, bs, bs, bs, bs, N, N], index_map: "a, b, c, d, e, f -> (a, b, c, d, e, f, 0, 0)"}'),
    ('o: {block_shape: [bs], index_map: "i -> (i,)"}',
     'o: {block_shape: [bs, bs, bs, bs, bs, bs, N, N], index_map: "a, b, c, d, e, f -> (a, b, c, d, e, f, 0, 0)"}'),
    ("N: 64", "N: 1099511627776"),
    ("cases:", "backends:\n  interpret:\n  triton:\n  mosaic_gpu:\n  mosaic_tpu:\ncases:"),
)
PARAMS_64 = V.replace(
    "params:\n  bs: 8\n",
    "params:\n  bs: 8\n"
    + "".join(f"  p{i}: {{default: 1, choices: [{', '.join(map(str, range(1, 65)))}]}}\n" for i in range(63)),
)
PADDED = V + "# " + "x" * (loader.MAX_FILE_BYTES - len(V) - 10) + "\n"
LONG_EXPR = mutate(V, ('grid: ["cdiv(N, bs)"]', 'grid: ["cdiv(' + " + ".join(["N"] * 240) + ' - 239 * N, bs)"]'))
BIG_BODY = mutate(V, ("o_ref[...] = x_ref[...] * 2", "\n  ".join(["o_ref[...] = x_ref[...] * 2"] * 2300)))

# id -> (content, None if accepted, else the `line:col: error[CODE]` of the first diagnostic)
SIZES = {
    "grid_1e12_steps": (_huge_grid("1000000000000"), "10:8: error[E508]"),
    "grid_6_axes_of_1e12": (
        mutate(_huge_grid(", ".join(["1000000000000"] * 6)), *(
            (f'{op}: {{block_shape: [N], index_map: "i -> (0,)"}}',
             f'{op}: {{block_shape: [N], index_map: "a, b, c, d, e, f -> (0,)"}}') for op in "xo")),
        "10:8: error[E508]",
    ),
    "grid_product_overflows_int64": (mutate(_huge_grid('"N * N * N * N"'), ("N: 64", "N: 1099511627776")),
                                     "10:8: error[E303]"),
    "param_beyond_int64": (mutate(V, ("  bs: 8", "  bs: 9223372036854775807")), "10:8: error[E303]"),
    "block_and_shape_products_overflow": (RANK8, "12:3: error[E722]"),
    "block_bigger_than_memory": (mutate(V, ("cases:", "backends:\n  mosaic_tpu:\ncases:"),
                                        ("  bs: 8", "  bs: 1099511627776"), ("N: 64", "N: 1099511627776")),
                                 "19:3: error[E703]"),
    "float_1e308_param": (mutate(V, ("  bs: 8", "  bs: 1.0e308")), "10:8: error[E303]"),
    "longest_expression": (LONG_EXPR, None),
    "expression_too_long": (mutate(V, ('grid: ["cdiv(N, bs)"]', 'grid: ["' + "+".join(["N"] * 501) + '"]')),
                            "10:7: error[E203]"),
    "params_64_with_64_choices": (PARAMS_64, "6:3: error[E415]"),  # refused: 64**63 configs to tune
    "body_of_2300_lines": (BIG_BODY, None),
    "file_just_under_the_limit": (PADDED, None),
    "90k_unknown_keys": (V + "".join(f"k{i}: 1\n" for i in range(90_000)), "4990:8: error[E105]"),
    "80k_params": (mutate(V, ("  bs: 8\n", "  bs: 8\n" + "".join(f"  p{i}: 1\n" for i in range(80_000)))),
                   "5000:10: error[E105]"),
    "flow_list_of_300k": ("cases: [" + "1, " * 300_000 + "]\n", "1:30000: error[E105]"),
    "4900_unknown_keys": (V + "".join(f"k{i}: 1\n" for i in range(4_900)), "20:1: error[E201]"),
    "900_cases": (V.replace("cases:\n", "cases:\n" + "".join(f"  - {{N: 64, name: c{i}}}\n" for i in range(900))),
                  "19:3: error[E200]"),
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_sizes_are_answered_with_bounded_work_and_memory(name, tmp_path):
    content, where = SIZES[name]
    result = probe(tmp_path, content)
    assert_bounded(result)
    if where is None:
        assert result["ok"], result
    else:
        assert not result["ok"], result
        assert result["diagnostics"][0].startswith(f"specs/hostile.yaml:{where}: "), result


def test_schema_diagnostics_stop_at_a_hundred(tmp_path):
    result = probe(tmp_path, V + "".join(f"k{i}: 1\n" for i in range(4_900)))
    from kspec.codegen import project as pipeline

    path = tmp_path / "specs" / "hostile.yaml"
    compiled = pipeline.compile_spec(path)
    assert len(compiled.diagnostics) == 100
    assert compiled.diagnostics[-1].format().startswith(f"{path}:119:1: error[E201]: unknown key `k99`")
    assert result["calls"] < CALLS, result


def test_too_many_items_says_how_many(tmp_path):
    result = probe(tmp_path, SIZES["900_cases"][0])
    assert result["diagnostics"] == ["specs/hostile.yaml:19:3: error[E200]: cases has 901 items; at most 256 allowed"]


# -- bounds the semantic checks (checks.py) keep: E507, the grid walk budget, E508 ------

DTYPES_16 = "[float32, bfloat16, float16, int32, int8, uint8, int16, uint16, int64, uint32, bool, uint64, float64, " \
            "float8_e4m3fn, float8_e5m2, complex64]"
DTYPE_EXPLOSION = mutate(
    V,
    ("  x: {shape: [N], dtype: float32}\n",
     "".join(f"  x{i or ''}: {{shape: [N], dtype: {DTYPES_16}}}\n" for i in range(32))),
    ("o: {shape: [N], dtype: x}", "o: {shape: [N], dtype: float32}"),
)
MANY_BIG_CASES = V.split("cases:")[0] + "cases:\n" + "".join(f"  - {{name: c{i}, N: 65536}}\n" for i in range(256)) \
    + "bench:\n" + "".join(f"  - {{name: b{i}, N: 65536}}\n" for i in range(64))


def test_dtype_combinations_are_bounded(tmp_path):
    assert_bounded(probe(tmp_path, DTYPE_EXPLOSION, timeout=5))


def test_many_cases_with_large_grids_are_checked_fast(tmp_path):
    assert_bounded(probe(tmp_path, MANY_BIG_CASES, timeout=5))


def test_grid_axis_beyond_int32_is_rejected(tmp_path):
    result = probe(tmp_path, SIZES["grid_1e12_steps"][0])
    assert not result["ok"], result


# -- verification: a kernel that kills its worker --------------------------------------


def test_segfaulting_kernel_fails_only_its_own_case(tmp_path):
    """test_verify.py covers exit, hang and MemoryError; a signal death is the case left."""
    from test_verify import HANG, results

    (tmp_path / "specs").mkdir()
    bodies = {"a_segv": "import ctypes; ctypes.string_at(0)", "b_fine": "o_ref[...] = x_ref[...]"}
    for name, body in bodies.items():
        (tmp_path / "specs" / f"{name}.yaml").write_text(HANG.format(name=name, body=body))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = lambda *a: subprocess.run([sys.executable, "-m", "kspec", *a], cwd=tmp_path,  # noqa: E731
                                    env=env, capture_output=True, text=True, timeout=300)
    assert run("generate").returncode == 0
    r = run("verify", "--backend", "interpret", "--json", "r.json", "--timeout", "60")
    assert r.returncode == 1, r.stdout + r.stderr
    status = {row["kernel"]: (row["status"], row["message"]) for row in results(tmp_path / "r.json")}
    assert status == {"a_segv": ("error", "worker died: SIGSEGV"), "b_fine": ("pass", "")}
    assert "Traceback" not in r.stdout
