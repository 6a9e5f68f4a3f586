"""What `kspec verify --lower` lowers a backend for: its platform and, for Mosaic TPU, a chip.

Mosaic TPU reads the chip while it lowers (the tiling of a 1-D block depends on its vreg
shape), from the device of the mesh in context, else from jax's default device. Off a TPU
that device is a CPU, which it refuses (`Unsupported TPU device kind: cpu`), so there the
lowering runs under an abstract mesh whose device is a named TPU chip, LOWERING_CHIP. On a
TPU the machine's own chip is used. Only the lowering is affected: nothing is compiled or run.
"""

from __future__ import annotations

import contextlib

from kspec.codegen.backends import BACKENDS

# The chip mosaic_tpu kernels are lowered for off a TPU, as jax names its device kind: TPU v5e.
LOWERING_CHIP = "TPU v5 lite"


def platform(backend: str) -> str | None:
    """The platform `lowering_platforms` names for the backend (None: nothing to lower)."""
    return BACKENDS[backend].lowering_platform


def named_chip(backend: str) -> str | None:
    """The chip the backend is lowered for on this machine when it is not the machine's own
    (None: no chip is named; the lowering needs none, or this machine has it)."""
    import jax

    if platform(backend) != "tpu" or jax.default_backend() == "tpu":
        return None
    return LOWERING_CHIP


def chip_mesh(axis_sizes: tuple = (1,), axis_names: tuple = ("_tpu",), axis_types: tuple | None = None):
    """An abstract mesh of LOWERING_CHIP devices: a mesh to lower a sharded function on (the sizes,
    names and types of the mesh it would run on), or, of one device, the context of a lowering (as
    the generated Mosaic TPU mesh kernels trace off a TPU)."""
    from jax.sharding import AbstractDevice, AbstractMesh

    device = AbstractDevice(device_kind=LOWERING_CHIP, num_cores=1, platform="tpu")
    if axis_types is None:
        return AbstractMesh(tuple(axis_sizes), tuple(axis_names), abstract_device=device)
    return AbstractMesh(tuple(axis_sizes), tuple(axis_names), axis_types=tuple(axis_types), abstract_device=device)


@contextlib.contextmanager
def target(backend: str):
    """The context to lower the backend's kernels in: on the named chip (see named_chip), if any."""
    if named_chip(backend) is None:
        yield
        return
    from jax.sharding import use_abstract_mesh

    with use_abstract_mesh(chip_mesh()):
        yield


def shown(backend: str) -> str:
    """What a lowering result names: `tpu (TPU v5 lite)`, `cuda`."""
    chip = named_chip(backend)
    return platform(backend) + (f" ({chip})" if chip else "")
