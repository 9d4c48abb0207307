"""F on each f-gram alone: the reference the prefix forest (training, export) is checked against."""

import jax
import jax.numpy as jnp


def fgram_alone(model, fgram_tokens: jax.Array, fgram_lengths: jax.Array) -> jax.Array:
    """F(w) for each f-gram by itself, through the f-gram model's plain call: [C, K] tokens
    (right-padded), [C] lengths -> [C, d]."""
    rows = model.backbone.table_rows(jnp.maximum(fgram_tokens, 0))
    return model.fgram(rows, fgram_lengths)


def attention(q, k, v, mask):
    """Attention written out per head: q [B, Tq, H, D], k and v [B, Tk, KV, D] (each kv head
    shared by H / KV query heads), mask [B or 1, Tq, Tk] -> [B, Tq, H, D], in float32."""
    q, k, v = (jnp.asarray(a, jnp.float32) for a in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(mask[:, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
