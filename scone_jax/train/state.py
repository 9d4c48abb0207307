"""The train state (params, optimizer state, step) and its shardings, born sharded inside jit.

Parameters are kept as a pure nested dict of arrays (`nnx.to_pure_dict`): that is what the
jitted step, optax and orbax see. The model's static structure (`graphdef`) is split off once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scone_jax.sharding.rules import MeshAxes, named_sharding


@dataclass
class ModelHandle:
    """What the step needs to rebuild the model from pure params: graphdef + non-param state."""

    graphdef: Any
    rest: Any
    logical_axes: Any  # pure dict, same structure as params, leaves = tuples of names

    def merge(self, params):
        return nnx.merge(self.graphdef, params, self.rest)


def param_logical_axes(abstract_model: nnx.Module) -> Any:
    """Pure dict of each parameter's `logical_axes`; a parameter without them is a bug."""
    _, params, _ = nnx.split(abstract_model, nnx.Param, ...)

    def names(var):
        axes = getattr(var, "logical_axes", None)
        if axes is None or len(axes) != var.get_value().ndim:
            raise ValueError(f"parameter of shape {var.get_value().shape} has logical_axes={axes}")
        return PartitionSpec(*axes)  # a pytree leaf holding the names

    return nnx.to_pure_dict(jax.tree.map(names, params, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def state_shardings(abstract_state, logical_axes, mesh: Mesh, rules: Mapping[str, MeshAxes]):
    """Shardings for {params, opt_state, step}: optimizer moments follow their parameter."""
    param_sh = jax.tree.map(lambda spec, leaf: named_sharding(tuple(spec), leaf.shape, mesh, rules),
                            logical_axes, abstract_state["params"])
    replicated = NamedSharding(mesh, PartitionSpec())
    param_struct = jax.tree.structure(abstract_state["params"])

    def opt_shardings(node):
        # any subtree shaped like params (adam mu/nu) gets the param shardings
        if jax.tree.structure(node) == param_struct:
            return param_sh
        return jax.tree.map(lambda _: replicated, node)

    opt_sh = jax.tree.map(opt_shardings, abstract_state["opt_state"],
                          is_leaf=lambda n: jax.tree.structure(n) == param_struct)
    return {"params": param_sh, "opt_state": opt_sh, "step": replicated}


@dataclass
class TrainSetup:
    """Everything about the state except its values: structure, shapes, shardings, a creator."""

    handle: ModelHandle
    abstract_state: Any
    shardings: Any
    create: Callable[[], Any]  # jitted, returns the freshly initialised, sharded state


def setup_train_state(build_model: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
                      seed: int, mesh: Mesh, rules: Mapping[str, MeshAxes]) -> TrainSetup:
    """Shapes and shardings of {params, opt_state, step}; `create()` initialises inside jit
    with out_shardings, so every array is born sharded (no host copy of the full model)."""
    abstract_model = nnx.eval_shape(lambda: build_model(nnx.Rngs(seed)))
    graphdef, _, rest = nnx.split(abstract_model, nnx.Param, ...)
    handle = ModelHandle(graphdef=graphdef, rest=rest, logical_axes=param_logical_axes(abstract_model))

    def init():
        model = build_model(nnx.Rngs(seed))
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    abstract_state = jax.eval_shape(init)
    shardings = state_shardings(abstract_state, handle.logical_axes, mesh, rules)
    return TrainSetup(handle=handle, abstract_state=abstract_state, shardings=shardings,
                      create=jax.jit(init, out_shardings=shardings))


def abstract_with_shardings(state_shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        state_shapes, shardings)
