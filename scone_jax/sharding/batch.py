"""The shardings of a batch: tokens over the data axes, the prefix forest's buffers one group per
f-gram data shard (so the f-gram model's attention never leaves a shard)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from jax.sharding import Mesh, NamedSharding

from scone_jax.sharding.rules import MeshAxes, logical_to_spec, named_sharding

BATCH_AXES = {"inputs": ("batch", "seq"), "targets": ("batch", "seq")}


def batch_shardings(
    mesh: Mesh,
    rules: Mapping[str, MeshAxes],
    batch_size: int,
    seq_len: int,
    max_n: int | None = None,
    microbatches: int = 1,
    index_links: int = 0,
):
    """Shardings of a batch; SCONE batches (`max_n` set) also carry `fgram_index` ([B, T], or
    [B, T, `index_links`] with suffix rows) and the prefix forest's node buffers
    (scone_jax/forest/), one group per f-gram data shard."""
    out = {k: named_sharding(v, (batch_size, seq_len), mesh, rules) for k, v in BATCH_AXES.items()}
    if max_n:
        links = (index_links,) if index_links else ()
        out["fgram_index"] = named_sharding(
            ("batch", "seq", *(None for _ in links)), (batch_size, seq_len, *links), mesh, rules
        )
        out.update(node_shardings(mesh, rules, microbatches))
    return out


def node_shardings(
    mesh: Mesh, rules: Mapping[str, MeshAxes], microbatches: int = 1
) -> dict[str, NamedSharding]:
    """The prefix forest's buffers ([G, N, B] tokens, [G, N, B, K] paths, [G, R] output slots,
    each with a leading microbatch axis when there are several): groups over the data shards."""
    lead = (None,) if microbatches > 1 else ()

    def sharding(*rest):
        return NamedSharding(mesh, logical_to_spec((*lead, "fgram/batch", *rest), rules))

    return {
        "fgram_nodes": sharding(None, None),
        "fgram_paths": sharding(None, None, None),
        "fgram_outputs": sharding(None),
    }


def fgram_groups(mesh: Mesh, rules: Mapping[str, MeshAxes]) -> int:
    """How many data shards the f-gram model's batch has: one node group each."""
    entry = logical_to_spec(("fgram/batch",), rules)[0]
    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
    return int(np.prod([mesh.shape[a] for a in axes]))
