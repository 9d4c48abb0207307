"""A stack of transformer blocks, unrolled or scanned, with the config's rematerialization.

Unrolled (`model.scan_layers: false`), the blocks are a list and XLA compiles each layer's copy:
compile time grows with depth. Scanned, one block's parameters are stacked on a leading
"layers" axis and `lax.scan` runs them, so the body compiles once. The two layouts hold the
same values (`stack_layers` / `unstack_layers` convert a parameter tree) and compute the same
function. `model.remat` picks what the backward pass keeps of each block (`REMAT_POLICIES`); the
rest is recomputed, trading FLOPs for activation memory.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scone_jax.config.schema import ModelConfig
from scone_jax.model.layers import Block
from scone_jax.sharding.rules import axis_names

REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,  # keep every activation
    # keep the outputs of the weight matmuls (projections, MLP); recompute attention scores,
    # softmax, norms and activations
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "block": jax.checkpoint_policies.nothing_saveable,  # keep each block's input only
}
LAYERS_AXIS = "layers"


def make_blocks(cfg: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """`cfg.n_layers` blocks, initialised the same way in either layout."""
    blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)]
    return stacked_block(blocks) if cfg.scan_layers else nnx.List(blocks)


def stacked_block(blocks: list[Block]) -> Block:
    """One block whose every parameter is the blocks' parameters stacked on a "layers" axis."""
    graphdef = nnx.split(blocks[0])[0]
    states = [nnx.split(b)[1] for b in blocks]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    module = nnx.merge(graphdef, stacked)
    for _, var in nnx.iter_graph(module):
        if isinstance(var, nnx.Param):
            var.set_metadata("logical_axes", (*axis_names((LAYERS_AXIS,)), *var.logical_axes))
    return module


def is_stacked(blocks: nnx.Module) -> bool:
    return isinstance(blocks, Block)


def num_layers(blocks: nnx.Module) -> int:
    if is_stacked(blocks):
        return jax.tree.leaves(nnx.state(blocks))[0].shape[0]
    return len(blocks)


def block_at(blocks: nnx.Module, layer: int) -> Block:
    """Layer `layer` as a plain block (a slice of the stacked parameters when scanned)."""
    if not is_stacked(blocks):
        return blocks[layer]
    graphdef, state = nnx.split(blocks)
    return nnx.merge(graphdef, jax.tree.map(lambda v: v[layer], state))


def remat(call: Callable[[Block, jax.Array], jax.Array], graphdef, policy: str):
    """`call(block, x)` as a function (state, x) of the block's variables, rematerialized by
    `policy` (a pure function, so `jax.checkpoint` and `lax.scan` can take it)."""

    def pure(state, x):
        return call(nnx.merge(graphdef, state), x)

    if REMAT_POLICIES[policy] is None:
        return pure
    return jax.checkpoint(pure, policy=REMAT_POLICIES[policy])


def run_blocks(
    blocks: nnx.Module,
    x: jax.Array,
    call: Callable[[Block, jax.Array], jax.Array],
    policy: str,
    stop: int | None = None,
) -> jax.Array:
    """x through layers [0, stop) (all by default), each as `call(block, x)`."""
    stop = num_layers(blocks) if stop is None else stop
    if not is_stacked(blocks):
        for block in blocks[:stop]:
            graphdef, state = nnx.split(block)
            x = remat(call, graphdef, policy)(state, x)
        return x
    if stop == 0:
        return x
    graphdef, state = nnx.split(blocks)
    step = remat(call, graphdef, policy)
    x, _ = jax.lax.scan(
        lambda h, layer: (step(layer, h), None), x, jax.tree.map(lambda v: v[:stop], state)
    )
    return x


def stack_layers(params: dict) -> dict:
    """A parameter tree's `blocks` {0: tree, 1: tree, ...} -> one tree of [layers, ...] arrays
    (host arrays: for checkpoints and files, not inside jit)."""
    layers = params["blocks"]
    ordered = [layers[i] for i in sorted(layers, key=int)]
    return {**params, "blocks": jax.tree.map(lambda *xs: np.stack(xs), *ordered)}


def unstack_layers(params: dict) -> dict:
    """The inverse of `stack_layers`."""
    stacked = params["blocks"]
    count = jax.tree.leaves(stacked)[0].shape[0]
    return {
        **params,
        "blocks": {i: jax.tree.map(lambda v, i=i: np.asarray(v[i]), stacked) for i in range(count)},
    }


def layers_stacked(params: dict) -> bool | None:
    """Whether a parameter tree (a backbone's, or a SCONE model's) holds its layers stacked
    (scanned) or one subtree per layer (unrolled); None when it has no layers."""
    blocks = params.get("blocks", params.get("backbone", {}).get("blocks"))
    if not isinstance(blocks, dict):
        return None
    return not all(str(key).isdigit() for key in blocks)
