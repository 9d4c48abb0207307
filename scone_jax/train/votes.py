"""What every process of a job tells the others each step: the signal it got (0: none) and its
f-gram counts. They travel into the jitted train step as one small array, are reduced there, and
come back with the step's metrics, read one step late like the rest.

Why not `multihost_utils.process_allgather`: it is not a host-side exchange but a jitted
all-gather queued on the devices behind the train step, so reading it makes the host wait for
that step to finish, and the next batch (the SCONE forest included) could never be built while
the accelerator runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

STOP = 0  # the signal column; the counts (forest/stats.stats_vector) follow it


def votes_sharding(mesh: Mesh) -> NamedSharding:
    """One row per device: every mesh axis splits the rows, so no row is replicated and each
    process owns its devices' rows whatever the mesh's layout."""
    return NamedSharding(mesh, P(tuple(mesh.axis_names)))


def process_votes(mesh: Mesh, vector: np.ndarray) -> jax.Array:
    """The global [devices, V] int32 array holding `vector` in one row of this process's (its
    first in row order) and zeros in every other row it owns."""
    sharding = votes_sharding(mesh)
    shape = (mesh.devices.size, len(vector))
    owned = sharding.addressable_devices_indices_map(shape).values()
    first = min(index[0].start or 0 for index in owned)
    row = np.asarray(vector, np.int32)[None]

    def rows(index):
        return row if (index[0].start or 0) == first else np.zeros_like(row)

    return jax.make_array_from_callback(shape, sharding, rows)


def reduce_votes(votes: jax.Array) -> dict[str, jax.Array]:
    """Inside the step: the signal any process got (the largest), and every count's sum."""
    return {"votes_stop": jnp.max(votes[:, STOP]), "votes_sum": jnp.sum(votes, axis=0)}


def read_votes(metrics: dict) -> tuple[int, np.ndarray] | None:
    """(the signal any process got, 0 if none; the processes' summed counts) from a step's
    fetched metrics, or None when the step took no votes. Pops them."""
    if "votes_sum" not in metrics:
        return None
    stop = int(metrics.pop("votes_stop"))
    return stop, np.delete(np.asarray(metrics.pop("votes_sum"), np.int64), STOP)
