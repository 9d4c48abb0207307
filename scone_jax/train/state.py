"""The train state (params, optimizer state, step) and its shardings, born sharded inside jit.

Parameters are kept as a pure nested dict of arrays (`nnx.to_pure_dict`): that is what the
jitted step, optax and orbax see. The model's static structure (`graphdef`) is split off once
(model/build.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from scone_jax.model.build import ModelHandle, split_model
from scone_jax.sharding.rules import MeshAxes
from scone_jax.sharding.state import state_shardings


@dataclass
class TrainSetup:
    """Everything about the state except its values: structure, shapes, shardings, a creator."""

    handle: ModelHandle
    abstract_state: Any
    shardings: Any
    create: Callable[[], Any]  # jitted, returns the freshly initialised, sharded state


def setup_train_state(
    build_model: Callable[[nnx.Rngs], nnx.Module],
    tx: optax.GradientTransformation,
    seed: int,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes],
) -> TrainSetup:
    """Shapes and shardings of {params, opt_state, step}; `create()` initialises inside jit
    with out_shardings, so every array is born sharded (no host copy of the full model)."""
    handle, _ = split_model(build_model, seed)

    def init():
        model = build_model(nnx.Rngs(seed))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    abstract_state = jax.eval_shape(init)
    shardings = state_shardings(abstract_state, handle.logical_axes, mesh, rules)
    return TrainSetup(
        handle=handle,
        abstract_state=abstract_state,
        shardings=shardings,
        create=jax.jit(init, out_shardings=shardings),
    )
