"""Build the (data, fsdp, tensor) device mesh from config sizes, with Auto axis types."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from scone_jax.errors import UserError
from scone_jax.sharding.rules import MESH_AXES


def resolve_mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """Fill in the one -1 axis; the product must equal the device count."""
    sizes = [data, fsdp, tensor]
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if num_devices % known:
            raise UserError(
                f"mesh data={data} fsdp={fsdp} tensor={tensor} does not divide the "
                f"{num_devices} available devices"
            )
        sizes[sizes.index(-1)] = num_devices // known
    if int(np.prod(sizes)) != num_devices:
        raise UserError(
            f"mesh data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]} needs "
            f"{int(np.prod(sizes))} devices, but {num_devices} are available"
        )
    return tuple(sizes)  # type: ignore[return-value]


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A mesh over `devices` (default: all) with classic GSPMD (Auto) propagation."""
    devices = list(devices) if devices is not None else jax.devices()
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)
