"""The one table of backends: checks, rendering, dispatch and verify all read it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    doc: str
    # jax.default_backend() values this backend can run on
    platforms: tuple
    # the platform `kspec verify --lower` lowers it for (None: nothing to lower)
    lowering_platform: str | None
    # how the generated module spells its CompilerParams class (None: has none)
    compiler_params_class: str | None
    # extra imports of the generated module, beyond jax/jnp/lax/pl/np
    imports: tuple = ()
    # the `interpret=` argument to pallas_call ("interpret" means: the function's own arg)
    interpret: str = "False"
    # the template in templates/ that renders its module (kernel.py.j2: a pallas_call)
    template: str = "kernel.py.j2"


BACKENDS: dict = {
    b.name: b
    for b in (
        Backend(
            "interpret",
            "Pallas interpret mode; runs on any platform, on the CPU in CI.",
            platforms=("cpu", "gpu", "tpu"),
            lowering_platform=None,
            compiler_params_class=None,
            # scratch buffers are declared with TPU memory spaces, which interpret mode accepts
            imports=("from jax.experimental.pallas import tpu as pltpu",),
            interpret="True",
        ),
        Backend(
            "triton",
            "Pallas Triton, for NVIDIA and AMD GPUs.",
            platforms=("gpu",),
            lowering_platform="cuda",
            compiler_params_class="pltriton.CompilerParams",
            imports=("from jax.experimental.pallas import triton as pltriton",),
        ),
        Backend(
            "mosaic_gpu",
            "Pallas Mosaic GPU, for NVIDIA Hopper and later.",
            platforms=("gpu",),
            lowering_platform="cuda",
            compiler_params_class="plgpu.CompilerParams",
            imports=("from jax.experimental.pallas import mosaic_gpu as plgpu",),
            # plgpu.kernel + plgpu.emit_pipeline: pallas_call no longer lowers for Mosaic GPU in jax 0.11
            template="mosaic_gpu.py.j2",
        ),
        Backend(
            "mosaic_tpu",
            "Pallas Mosaic TPU; on the CPU it runs in TPU interpret mode.",
            platforms=("tpu",),
            lowering_platform="tpu",
            compiler_params_class="pltpu.CompilerParams",
            imports=("from jax.experimental.pallas import tpu as pltpu",),
            interpret="interpret",
        ),
    )
}

# What backend="auto" prefers on each platform; the spec's order breaks ties.
AUTO = {"cpu": ("interpret",), "gpu": ("mosaic_gpu", "triton"), "tpu": ("mosaic_tpu",)}
DEFAULT_BACKENDS = ("interpret",)
