"""The train step: a pure function of (state, batch) under `jax.jit` with explicit shardings.

State is donated, so parameters and optimizer moments are updated in place. Activations are
pinned by logical names while tracing (`activation_sharding`), using the same rules table as
the parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from scone_jax.dist.rules import MeshAxes, activation_sharding, logical_to_spec, named_sharding
from scone_jax.train.state import ModelHandle

BATCH_AXES = {"inputs": ("batch", "seq"), "targets": ("batch", "seq")}


def batch_shardings(mesh: Mesh, rules: Mapping[str, MeshAxes], batch_size: int, seq_len: int,
                    max_n: int | None = None):
    """Shardings of a batch; SCONE batches (`max_n` set) also carry `fgram_index` and the
    prefix forest's node buffers (data/fgram_batches.py), one group per f-gram data shard."""
    out = {k: named_sharding(v, (batch_size, seq_len), mesh, rules) for k, v in BATCH_AXES.items()}
    if max_n:
        out["fgram_index"] = named_sharding(("batch", "seq"), (batch_size, seq_len), mesh, rules)
        out.update(node_shardings(mesh, rules))
    return out


def node_shardings(mesh: Mesh, rules: Mapping[str, MeshAxes]) -> dict[str, NamedSharding]:
    """The prefix forest's buffers ([G, N, B] tokens, [G, N, B, K] paths, [G, R] output slots):
    groups over the data shards."""
    return {"fgram_nodes": NamedSharding(mesh, logical_to_spec(("fgram/batch", None, None), rules)),
            "fgram_paths": NamedSharding(mesh, logical_to_spec(("fgram/batch", None, None, None), rules)),
            "fgram_outputs": NamedSharding(mesh, logical_to_spec(("fgram/batch", None), rules))}


def fgram_groups(mesh: Mesh, rules: Mapping[str, MeshAxes]) -> int:
    """How many data shards the f-gram model's batch has: one node group each."""
    entry = logical_to_spec(("fgram/batch",), rules)[0]
    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
    return int(np.prod([mesh.shape[a] for a in axes]))


def model_inputs(batch) -> dict:
    if "fgram_index" not in batch:
        return {}
    return {k: batch[k] for k in ("fgram_index", "fgram_nodes", "fgram_paths", "fgram_outputs")}


def token_losses(handle: ModelHandle, params, batch) -> jax.Array:
    """Per-token next-token cross entropy [B, T] in float32."""
    logits = handle.merge(params)(batch["inputs"], **model_inputs(batch))
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])


def fgram_metrics(params, grads) -> dict:
    """For a SCONE model: each model's gradient norm, and the RMS of the f-gram output gate (how
    much of F the backbone takes in), so a log shows which path a step moves."""
    if "fgram" not in grads:
        return {}
    out = {"grad_norm_fgram": optax.tree.norm(grads["fgram"]), "grad_norm_backbone": optax.tree.norm(grads["backbone"])}
    if "output_gate" in params["fgram"]:
        gate = params["fgram"]["output_gate"]
        out["fgram_gate_rms"] = jnp.sqrt(jnp.mean(jnp.square(getattr(gate, "value", gate))))
    return out


def make_train_step(handle: ModelHandle, tx: optax.GradientTransformation, schedule,
                    mesh: Mesh, rules: Mapping[str, MeshAxes], state_shardings, batch_sharding):
    def step_fn(state, batch):
        with activation_sharding(mesh, rules):
            def loss_fn(params):
                return jnp.mean(token_losses(handle, params, batch))

            loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state["step"]),
            **fgram_metrics(params, grads),
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, None), donate_argnums=(0,))


def make_eval_step(handle: ModelHandle, mesh: Mesh, rules: Mapping[str, MeshAxes], param_shardings,
                   batch_sharding):
    """Summed loss (nats), token count and predicted-target bytes for one batch."""

    def eval_fn(params, batch, token_bytes):
        with activation_sharding(mesh, rules):
            losses = token_losses(handle, params, batch)
        return {
            "nats": jnp.sum(losses),
            "tokens": jnp.asarray(losses.size, jnp.float32),
            "bytes": jnp.sum(token_bytes[batch["targets"]]).astype(jnp.float32),
        }

    return jax.jit(eval_fn, in_shardings=(param_shardings, batch_sharding, None))
