"""Held-out perplexity and bits per byte through the serving path (backbone + table)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scone_jax.metrics.perplexity import eval_result
from scone_jax.serve.engine import Engine
from scone_jax.serve.input_layer import prefetch_prepared


def evaluate_engine(
    engine: Engine, eval_sets: dict[str, list[dict]], token_bytes: np.ndarray
) -> dict:
    """`eval_sets`: name -> batches with `inputs`, `targets` and (SCONE) `fgram_ids`."""

    @jax.jit
    def batch_nats(logits, targets):
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    results = {}
    for name, batches in eval_sets.items():
        nats = tokens = nbytes = 0.0

        def prepare(batch):
            return engine.prepare(batch["fgram_ids"]) if engine.lookup else {}

        for batch, prepared in prefetch_prepared(batches, prepare):
            logits = engine.logits(batch["inputs"], prepared=prepared)
            nats += float(batch_nats(logits, batch["targets"]))
            tokens += batch["targets"].size
            nbytes += float(token_bytes[batch["targets"]].sum())
        results[name] = eval_result(nats, tokens, nbytes)
    return results
