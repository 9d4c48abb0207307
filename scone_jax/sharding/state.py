"""The shardings of a train state {params, opt_state, step}: each parameter by its logical axes,
optimizer moments like their parameter, everything else replicated."""

from __future__ import annotations

from collections.abc import Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scone_jax.sharding.rules import MeshAxes, named_sharding


def state_shardings(abstract_state, logical_axes, mesh: Mesh, rules: Mapping[str, MeshAxes]):
    """Shardings for {params, opt_state, step}: optimizer moments follow their parameter. A
    state without opt_state (a kept best, artifacts/best.py) gets none."""
    param_sh = jax.tree.map(
        lambda spec, leaf: named_sharding(tuple(spec), leaf.shape, mesh, rules),
        logical_axes,
        abstract_state["params"],
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    param_struct = jax.tree.structure(abstract_state["params"])

    def opt_shardings(node):
        # any subtree shaped like params (adam mu/nu) gets the param shardings
        if jax.tree.structure(node) == param_struct:
            return param_sh
        return jax.tree.map(lambda _: replicated, node)

    shardings = {"params": param_sh, "step": replicated}
    if "opt_state" in abstract_state:
        shardings["opt_state"] = jax.tree.map(
            opt_shardings,
            abstract_state["opt_state"],
            is_leaf=lambda n: jax.tree.structure(n) == param_struct,
        )
    return shardings
