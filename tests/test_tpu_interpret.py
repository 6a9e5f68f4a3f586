"""verify's TPU interpret mode beyond the schedules (test_multicore): TPU numerics on the CPU, where
a bfloat16 dot is rounded to bfloat16 as a TPU rounds it."""

from __future__ import annotations

from test_verify import PLANTED, kspec, project, results

from kspec.codegen.run import pool


def test_tpu_interpret_worker_keeps_every_rounding_and_the_other_worker_does_not():
    assert pool.worker_env(tpu_numerics=True)["XLA_FLAGS"].endswith("--xla_allow_excess_precision=false")
    assert "XLA_FLAGS" not in pool.worker_env() or pool.TPU_NUMERICS not in pool.worker_env()["XLA_FLAGS"]
    flags = pool.worker_env(8, tpu_numerics=True)["XLA_FLAGS"].split()
    assert flags[-2:] == ["--xla_force_host_platform_device_count=8", "--xla_allow_excess_precision=false"]


def test_bf16_dot_without_f32_result_fails_in_tpu_interpret_mode_only(tmp_path):
    planted = PLANTED / "matmul_bf16_partials.yaml"
    fixed = tmp_path / "fixed" / "matmul_bf16_f32_partials.yaml"
    fixed.parent.mkdir()
    text = planted.read_text().replace("name: matmul_bf16_partials", "name: matmul_bf16_f32_partials")
    text = text.replace("jnp.dot(x_ref[...], y_ref[...])  # BUG: no preferred_element_type=jnp.float32",
                        "jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)")
    assert text.count("preferred_element_type") == 3
    fixed.write_text(text)
    (tmp_path / "p").mkdir()
    proj = project(tmp_path / "p", planted, fixed)
    report = tmp_path / "r.json"
    rc, out, err = kspec("verify", "--seed", "3", "--schedules", "2", "--json", report, cwd=proj)
    assert rc == 1, out + err
    rows = {(r["kernel"], r["backend"]): r for r in results(report)}
    assert {k: r["status"] for k, r in rows.items()} == {
        ("matmul_bf16_f32_partials", "interpret"): "pass",
        ("matmul_bf16_f32_partials", "mosaic_tpu"): "pass",
        # XLA on the CPU keeps the bfloat16 dot in float32 (excess precision) ...
        ("matmul_bf16_partials", "interpret"): "pass",
        # ... and in TPU interpret mode rounds it to bfloat16 first, as a TPU does
        ("matmul_bf16_partials", "mosaic_tpu"): "fail",
    }
    assert rows[("matmul_bf16_partials", "mosaic_tpu")]["message"] == (
        "output o: 4428 of 16384 elements outside tolerance; worst at (21, 29): got -71.5625, expected -71.3747 "
        "[TPU interpret mode, the same under all 2 schedules]"
    )
    assert rows[("matmul_bf16_f32_partials", "mosaic_tpu")]["rel_err"] < 1e-6
