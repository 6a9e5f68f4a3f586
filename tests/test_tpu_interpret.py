"""verify's TPU interpret mode beyond the schedules (test_multicore): device numerics on the CPU, where
a bfloat16 dot is rounded to bfloat16 as a TPU (or a GPU kernel) rounds it, and deadlocked semaphore waits reported as
failures that name the semaphore and the grid point, not as timeouts."""

from __future__ import annotations

from test_multicore import _place
from conftest import declared
from test_verify import PLANTED, kspec, project, results

from kspec.codegen.run import deadlock, pool

WITHOUT_START = (
    "deadlock: core 0, grid point (0,), waits at WAIT on DMA semaphore sem for 4096 bytes; it holds 0 and no DMA "
    "started on it is pending (a wait without its start, or on another semaphore than the DMA's?); core 1, grid "
    "point (2,), waits at WAIT on DMA semaphore sem too [TPU interpret mode, schedule 1 of 4: seed 7, on_wait DMAs, "
    "2 cores]"
)
WRONG_SEMAPHORE = (
    "deadlock: core 0 waits at WAIT on DMA semaphore in_sem[1] for 4096 bytes; it holds 0 and no DMA started on it "
    "is pending (a wait without its start, or on another semaphore than the DMA's?); core 1 has no grid point left "
    "to run [TPU interpret mode, schedule 1 of 4: seed 7, on_wait DMAs, 2 cores]"
)


def test_only_the_simulating_worker_keeps_every_rounding():
    from kspec.codegen.backends import BACKENDS

    kept = {(b, p) for b in BACKENDS for p in ("cpu", "gpu", "tpu") if BACKENDS[b].rounds_as_a_device_on(p)}
    # Off a GPU, a Triton body runs in Pallas interpret mode (when --backend triton names it), as interpret does,
    # and a Mosaic GPU body in Mosaic GPU interpret mode (when --backend mosaic_gpu names it)
    assert kept == {("interpret", "cpu"), ("mosaic_tpu", "cpu"), ("mosaic_tpu", "gpu"), ("triton", "cpu"),
                    ("triton", "tpu"), ("mosaic_gpu", "cpu"), ("mosaic_gpu", "tpu")}
    assert pool.worker_env(tpu_numerics=True)["XLA_FLAGS"].split()[-1] == "--xla_allow_excess_precision=false"
    assert "--xla_allow_excess_precision=false" not in pool.worker_env(8)["XLA_FLAGS"]
    flags = pool.worker_env(8, tpu_numerics=True)["XLA_FLAGS"].split()
    assert flags[-2:] == ["--xla_force_host_platform_device_count=8", "--xla_allow_excess_precision=false"]


def test_where_jax_runs_only_on_the_cpu_one_worker_keeping_every_rounding_runs_every_task(monkeypatch):
    """Every backend runs simulated or interpreted on the CPU: a run there starts the one worker that keeps
    every rounding, not a second one first for `info` alone."""
    import types

    import jax

    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert not pool.only_the_cpu()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert pool.only_the_cpu()
    monkeypatch.delenv("JAX_PLATFORMS")
    if pool.only_the_cpu():  # no PJRT plugin and no libtpu installed: jax has the CPU alone
        assert {d.platform for d in jax.devices()} == {"cpu"}
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    workers = pool.Workers(None, 120)
    try:
        assert workers.info["platform"] == "cpu" and list(workers._sessions) == [True]
        for backend in ("interpret", "triton", "mosaic_gpu", "mosaic_tpu"):
            assert workers._for(types.SimpleNamespace(backend=backend)) is workers._sessions[True]
        assert list(workers._sessions) == [True]
    finally:
        workers.close()


def test_bf16_dot_without_f32_result_fails_in_tpu_and_pallas_interpret_mode(tmp_path):
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
    # the declared case alone (the cases derived from it fail alike)
    rc, out, err = kspec("verify", "--seed", "3", "--schedules", "2", "--case", "case0", "--json", report, cwd=proj)
    assert rc == 1, out + err
    rows = {(r["kernel"], r["backend"]): r for r in results(report)}
    assert {k: r["status"] for k, r in rows.items()} == {
        ("matmul_bf16_f32_partials", "interpret"): "pass",
        ("matmul_bf16_f32_partials", "mosaic_tpu"): "pass",
        # XLA on the CPU would keep the bfloat16 dot in float32 (excess precision); the worker of the
        # simulated kernels rounds it to bfloat16 first, as a TPU and a GPU do, in TPU interpret mode
        # and in Pallas interpret mode alike
        ("matmul_bf16_partials", "interpret"): "fail",
        ("matmul_bf16_partials", "mosaic_tpu"): "fail",
    }
    assert rows[("matmul_bf16_partials", "interpret")]["message"] == (
        "output o: 4428 of 16384 elements outside tolerance; worst at (21, 29): got -71.5625, expected -71.3747"
    )
    assert rows[("matmul_bf16_partials", "mosaic_tpu")]["message"] == (
        "output o: 4428 of 16384 elements outside tolerance; worst at (21, 29): got -71.5625, expected -71.3747 "
        "[TPU interpret mode, the same under all 2 schedules]"
    )
    assert rows[("matmul_bf16_f32_partials", "mosaic_tpu")]["rel_err"] < 1e-6


def test_deadlocked_dma_waits_fail_naming_the_semaphore_and_the_grid_point(tmp_path):
    bugs = ("dma_wait_without_start", "dma_wait_wrong_semaphore")
    proj = project(tmp_path, *(PLANTED / f"{b}.yaml" for b in bugs))
    report = tmp_path / "r.json"
    # a timeout that is never reached: each deadlock is found within a few polls
    rc, out, err = kspec("verify", "--seed", "7", "--timeout", "120", "--json", report, cwd=proj)
    assert rc == 1, out + err
    rows = {r["kernel"]: r for r in declared(results(report))}
    assert {k: r["status"] for k, r in rows.items()} == dict.fromkeys(bugs, "fail")
    generated = proj / "generated"
    wait = _place(generated / bugs[0] / "mosaic_tpu.py", "copy.wait()")
    assert rows[bugs[0]]["message"] == WITHOUT_START.replace("WAIT", wait)
    wait = _place(generated / bugs[1] / "mosaic_tpu.py", "copy_in(steps - 1, (steps - 1) % 2).wait()")
    assert rows[bugs[1]]["message"] == WRONG_SEMAPHORE.replace("WAIT", wait)
    assert "0 passed, 8 failed, 0 errors, 0 skipped" in out  # the declared cases and those derived from them


def test_grid_points_per_core_split_the_parallel_axes_as_tpu_interpret_mode_does():
    assert deadlock.points_per_core((4,), [0], 2) == [2, 2]
    assert deadlock.points_per_core((5,), [0], 2) == [3, 2]
    assert deadlock.points_per_core((3, 2, 4), [0, 1], 2) == [12, 12]
    assert deadlock.points_per_core((4, 3), [], 2) == [12, 0]  # no parallel axis: core 0 runs them all
    assert deadlock.points_per_core((), [], 2) == [1, 0]
