"""The train step: a pure function of (state, batch) under `jax.jit` with explicit shardings.

State is donated, so parameters and optimizer moments are updated in place. Activations are
pinned by logical names while tracing (`activation_sharding`), using the same rules table as
the parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from scone_jax.sharding.rules import MeshAxes, activation_sharding
from scone_jax.train.state import ModelHandle
from scone_jax.train.votes import reduce_votes


def device_arrays(batch) -> dict:
    """A host batch's arrays that go to the device, by batch-sharding key (host-only fields left
    out)."""
    out = {"inputs": batch["inputs"], "targets": batch["targets"]}
    if "forest" in batch:
        out.update(batch["forest"].arrays())
    return out


def model_inputs(batch) -> dict:
    if "fgram_index" not in batch:
        return {}
    return {k: batch[k] for k in ("fgram_index", "fgram_nodes", "fgram_paths", "fgram_outputs")}


def microbatch_rows(batch: dict, microbatches: int) -> dict:
    """The device batch as [M, ...] microbatches: microbatch m is rows m, m + M, ... (a local
    reshape when M divides each data shard's rows); the f-gram buffers already are per
    microbatch (forest/microbatch.py)."""

    def split(key, x):
        if key in ("fgram_nodes", "fgram_paths", "fgram_outputs"):
            return x
        rows = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:])
        return jnp.swapaxes(rows, 0, 1)

    return {key: split(key, x) for key, x in batch.items()}


def over_microbatches(fn, batch: dict, microbatches: int, carry):
    """`carry = fn(carry, microbatch)` for each microbatch in turn (`lax.scan`), or once over
    the whole batch when there is one: only one microbatch's activations are live at a time."""
    if microbatches == 1:
        return fn(carry, batch)
    carry, _ = jax.lax.scan(
        lambda c, mb: (fn(c, mb), None), carry, microbatch_rows(batch, microbatches)
    )
    return carry


def token_losses(handle: ModelHandle, params, batch, dropout_key=None) -> jax.Array:
    """Per-token next-token cross entropy [B, T] in float32; a `dropout_key` turns on the
    model's training-only noise."""
    noise = {} if dropout_key is None else {"dropout_key": dropout_key}
    logits = handle.merge(params)(batch["inputs"], **model_inputs(batch), **noise)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])


def fgram_metrics(params, grads) -> dict:
    """For a SCONE model: each model's gradient norm, and the RMS of the f-gram output gate (how
    much of F the backbone takes in), so a log shows which path a step moves."""
    if "fgram" not in grads:
        return {}
    out = {
        "grad_norm_fgram": optax.tree.norm(grads["fgram"]),
        "grad_norm_backbone": optax.tree.norm(grads["backbone"]),
    }
    if "output_gate" in params["fgram"]:
        gate = params["fgram"]["output_gate"][...]
        out["fgram_gate_rms"] = jnp.sqrt(jnp.mean(jnp.square(gate)))
    return out


def make_train_step(
    handle: ModelHandle,
    tx: optax.GradientTransformation,
    schedule,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes],
    state_shardings,
    batch_sharding,
    microbatches: int = 1,
    dropout_seed: int | None = None,
    votes_sharding=None,
):
    """With `microbatches` M > 1 the gradient is the mean of the M microbatches' gradients
    (float32 sums), which equals the whole batch's: microbatches have equal token counts.
    With a `dropout_seed` the model's training noise is drawn from it, the step number and the
    microbatch, so a resumed run draws what an uninterrupted one does. With a `votes_sharding`
    the step takes the processes' votes (train/votes.py) as a third argument and returns their
    reductions with its metrics."""

    def loss_fn(params, microbatch, key):
        return jnp.mean(token_losses(handle, params, microbatch, key))

    def loss_and_grads(params, batch, key):
        if microbatches == 1:  # no accumulator: the step keeps one gradient tree
            return jax.value_and_grad(loss_fn)(params, batch, key)

        def accumulate(carry, microbatch):
            total, summed, index = carry
            micro_key = None if key is None else jax.random.fold_in(key, index)
            loss, grads = jax.value_and_grad(loss_fn)(params, microbatch, micro_key)
            summed = jax.tree.map(lambda a, g: a + g.astype(a.dtype), summed, grads)
            return total + loss, summed, index + 1

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        start = (jnp.zeros((), jnp.float32), zeros, jnp.zeros((), jnp.int32))
        total, summed, _ = over_microbatches(accumulate, batch, microbatches, start)
        grads = jax.tree.map(lambda g, p: (g / microbatches).astype(p.dtype), summed, params)
        return total / microbatches, grads

    def step_fn(state, batch, votes=None):
        key = None
        if dropout_seed is not None:
            key = jax.random.fold_in(jax.random.key(dropout_seed), state["step"])
        with activation_sharding(mesh, rules):
            loss, grads = loss_and_grads(state["params"], batch, key)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state["step"]),
            **fgram_metrics(params, grads),
            **({} if votes is None else reduce_votes(votes)),
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    votes_in = () if votes_sharding is None else (votes_sharding,)
    return jax.jit(
        step_fn,
        in_shardings=(state_shardings, batch_sharding, *votes_in),
        out_shardings=(state_shardings, None),
        donate_argnums=(0,),
    )


def make_eval_step(
    handle: ModelHandle,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes],
    param_shardings,
    batch_sharding,
    microbatches: int = 1,
):
    """Summed loss (nats), token count and predicted-target bytes for one batch (its
    microbatches in turn, as the train step runs them)."""

    def eval_fn(params, batch, token_bytes):
        def add(totals, microbatch):
            losses = token_losses(handle, params, microbatch)
            return {
                "nats": totals["nats"] + jnp.sum(losses),
                "tokens": totals["tokens"] + losses.size,
                "bytes": totals["bytes"]
                + jnp.sum(token_bytes[microbatch["targets"]]).astype(jnp.float32),
            }

        zero = jnp.zeros((), jnp.float32)
        with activation_sharding(mesh, rules):
            return over_microbatches(
                add, batch, microbatches, {"nats": zero, "tokens": zero, "bytes": zero}
            )

    return jax.jit(eval_fn, in_shardings=(param_shardings, batch_sharding, None))
