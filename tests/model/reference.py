"""F on each f-gram alone: the reference the prefix forest (training, export) is checked against."""

import jax
import jax.numpy as jnp


def fgram_alone(model, fgram_tokens: jax.Array, fgram_lengths: jax.Array) -> jax.Array:
    """F(w) for each f-gram by itself, through the f-gram model's plain call: [C, K] tokens
    (right-padded), [C] lengths -> [C, d]."""
    rows = model.backbone.table_rows(jnp.maximum(fgram_tokens, 0))
    return model.fgram(rows, fgram_lengths)
