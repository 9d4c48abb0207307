"""A config's model, and its split into pure params (what the step, optax and orbax see) and the
handle that rebuilds the model from them: shared by training and by restoring a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx
from jax.sharding import PartitionSpec

from scone_jax.config import Config
from scone_jax.model.scone import SconeModel
from scone_jax.model.transformer import Transformer


def build_model_fn(cfg: Config, vocab: int):
    """The model constructor for this config: the backbone, or the backbone + f-gram model."""
    if cfg.fgrams.enabled:
        return lambda rngs: SconeModel(cfg.model, cfg.fgrams, vocab, rngs=rngs)
    return lambda rngs: Transformer(cfg.model, vocab, rngs=rngs)


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

    return nnx.to_pure_dict(
        jax.tree.map(names, params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    )


def split_model(
    build_model: Callable[[nnx.Rngs], nnx.Module], seed: int
) -> tuple[ModelHandle, Any]:
    """The handle and the abstract params (shapes only, nothing allocated) of `build_model`'s
    model."""
    abstract_model = nnx.eval_shape(lambda: build_model(nnx.Rngs(seed)))
    graphdef, params, rest = nnx.split(abstract_model, nnx.Param, ...)
    handle = ModelHandle(
        graphdef=graphdef, rest=rest, logical_axes=param_logical_axes(abstract_model)
    )
    return handle, nnx.to_pure_dict(params)
