"""The one table of backends: checks, rendering, dispatch and verify all read it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from kspec.codegen.spec.model import DimKind, MemorySpace, MeshRole, ScratchKind

# The backends there are: the keys of BACKENDS, and the names a spec's `backends:` may use.
BackendName = Literal["interpret", "triton", "mosaic_gpu", "mosaic_tpu"]

@dataclasses.dataclass(frozen=True)
class Backend:
    name: BackendName
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
    # how the generated function's docstring explains its own `interpret` arg
    interpret_doc: str = ""
    # the template in templates/ that renders its module (kernel.py.j2: a pallas_call)
    template: str = "kernel.py.j2"
    # What of the pallas_call surface it takes (checks read these; E410, E412 to E414):
    # block memory_space values it takes, each with how its module spells it
    memory_spaces: Mapping[MemorySpace, str] = dataclasses.field(default_factory=dict)
    block_kinds: tuple = (DimKind.BLOCKED, DimKind.SQUEEZED)  # block_shape entry kinds
    element_padding: bool = False  # element dims may have padding, pl.Element(n, (low, high))
    scratch_kinds: tuple = (ScratchKind.ARRAY,)
    prefetch: bool = False  # scalar-prefetch inputs (pltpu.PrefetchScalarGridSpec)
    aliases: bool = True  # input_output_aliases
    pipeline_mode: bool = False  # pl.Buffered
    # Ragged last blocks: Pallas Triton neither masks nor clips them, so its calls pad every blocked
    # dim to whole blocks and crop the outputs back
    pads_ragged_blocks: bool = False
    # Mesh kernels (`kind: mesh`; checks/mesh.py): the mesh axis roles it takes (none: no mesh
    # kernels), and the memory spaces a mesh kernel's refs may be in
    mesh_roles: tuple = ()
    ref_spaces: tuple = ()
    # Off its own platforms it runs in TPU interpret mode: a simulator, verified but never timed
    simulated: bool = False
    # Platforms where it interprets a device kernel although it runs there natively (interpret mode on
    # the CPU): verify keeps every bfloat16 rounding for it, as for a simulated backend
    interpreted_on: tuple = ()
    # Off its own platforms, verify can run its body in an interpret mode (off_device_mode), where a task is
    # asked for by name (`kspec verify --backend triton`): slower than the device, and not every one of the
    # device's own semantics is reproduced (a race between programs, the timing of asynchronous copies)
    interprets_off_device: bool = False
    # What runs it there: "pallas" (the generated function's interpret=True, Pallas interpret mode) or "mosaic_gpu"
    # (jax's Mosaic GPU interpret mode, around the call: it simulates GMEM, SMEM, barriers and TMA copies, and
    # raises on a copy outside its buffer)
    off_device_mode: str = "pallas"

    @property
    def off_device_name(self) -> str:
        """How the docs and messages name the mode that runs its body off its platforms."""
        return "Mosaic GPU interpret mode" if self.off_device_mode == "mosaic_gpu" else "Pallas interpret mode"

    def simulated_on(self, platform: str) -> bool:
        """Whether it runs in TPU interpret mode on this jax platform."""
        return self.simulated and platform not in self.platforms

    def rounds_as_a_device_on(self, platform: str) -> bool:
        """Whether verify runs it here with every bfloat16 rounding kept (codegen/run/pool.py,
        TPU_NUMERICS): where it stands in for a device it is not running on."""
        return self.simulated_on(platform) or platform in self.interpreted_on or self.interpreted_off_device(platform)

    def interpreted_off_device(self, platform: str) -> bool:
        """Whether verify runs its body here in Pallas interpret mode, off its own platforms."""
        return self.interprets_off_device and platform not in self.platforms


TPU_MEMORY_SPACES = {MemorySpace.ANY: "pl.ANY", MemorySpace.HBM: "pltpu.HBM", MemorySpace.VMEM: "pltpu.VMEM",
                     MemorySpace.SMEM: "pltpu.SMEM"}
TPU_SCRATCH_KINDS = (ScratchKind.ARRAY, ScratchKind.DMA_SEMAPHORE, ScratchKind.SEMAPHORE)
ALL_BLOCK_KINDS = (DimKind.BLOCKED, DimKind.SQUEEZED, DimKind.ELEMENT, DimKind.BOUNDED)

BACKENDS: dict[BackendName, Backend] = {
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
            interpreted_on=("cpu",),
            memory_spaces=TPU_MEMORY_SPACES,
            block_kinds=ALL_BLOCK_KINDS,
            element_padding=True,
            scratch_kinds=TPU_SCRATCH_KINDS,
            prefetch=True,
            pipeline_mode=True,
        ),
        Backend(
            "triton",
            "Pallas Triton, for NVIDIA and AMD GPUs.",
            platforms=("gpu",),
            lowering_platform="cuda",
            compiler_params_class="pltriton.CompilerParams",
            imports=("from jax.experimental.pallas import triton as pltriton",),
            # element dims, but unpadded: its lowering refuses pl.Element padding (jax 0.10.2)
            block_kinds=(DimKind.BLOCKED, DimKind.SQUEEZED, DimKind.ELEMENT),
            # any: the whole array, which the body indexes itself (e.g. a persistent row loop)
            memory_spaces={MemorySpace.ANY: "pl.ANY"},
            pads_ragged_blocks=True,
            interpret="interpret",
            interpret_doc="False to compile for the GPU, or True to run the Triton body in Pallas interpret\n"
            "            mode on any platform (as `kspec verify --backend triton` does off a GPU).",
            interprets_off_device=True,
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
            memory_spaces={MemorySpace.GMEM: "plgpu.GMEM", MemorySpace.SMEM: "plgpu.SMEM"},
            scratch_kinds=(ScratchKind.ARRAY, ScratchKind.BARRIER, ScratchKind.ACCUMULATOR),
            aliases=False,
            mesh_roles=(MeshRole.GRID, MeshRole.CLUSTER, MeshRole.THREADS),
            ref_spaces=(MemorySpace.GMEM,),
            interprets_off_device=True,
            off_device_mode="mosaic_gpu",
        ),
        Backend(
            "mosaic_tpu",
            "Pallas Mosaic TPU; on the CPU it runs in TPU interpret mode.",
            platforms=("tpu",),
            lowering_platform="tpu",
            compiler_params_class="pltpu.CompilerParams",
            imports=("from jax.experimental.pallas import tpu as pltpu",),
            interpret="interpret",
            interpret_doc="False to compile for TPU, or pltpu.InterpretParams(...) to run\n"
            "            on any platform in TPU interpret mode.",
            memory_spaces=TPU_MEMORY_SPACES,
            block_kinds=ALL_BLOCK_KINDS,
            element_padding=True,
            scratch_kinds=TPU_SCRATCH_KINDS,
            prefetch=True,
            pipeline_mode=True,
            mesh_roles=(MeshRole.CORES,),
            ref_spaces=(MemorySpace.ANY, MemorySpace.HBM),
            simulated=True,
        ),
    )
}

# What backend="auto" prefers on each platform; the spec's order breaks ties.
AUTO = {"cpu": ("interpret",), "gpu": ("mosaic_gpu", "triton"), "tpu": ("mosaic_tpu",)}
