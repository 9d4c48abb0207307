"""SCONE: the backbone plus the f-gram model, combined at the input layer (SCONE.md section 3).

The f-gram model runs on buffers of f-grams, one per length ([C_n, n] tokens, no padding);
each position points into the buffers' rows concatenated with `fgram_index` (-1 = no
match). With deduplication each distinct f-gram of the batch is one row and the gather below
scatters the outputs back (its transpose sums the gradients of every position sharing a
row); without it, every matched position has its own row. Both give the same loss and
gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scone_jax.config.schema import FgramConfig, ModelConfig
from scone_jax.dist.rules import constrain
from scone_jax.model.fgram_model import FgramModel
from scone_jax.model.transformer import Transformer


class SconeModel(nnx.Module):
    def __init__(self, cfg: ModelConfig, fgram_cfg: FgramConfig, vocab_size: int, *, rngs: nnx.Rngs):
        self.backbone = Transformer(cfg, vocab_size, rngs=rngs)  # first: same init as the baseline
        self.fgram = FgramModel(fgram_cfg.model_config(cfg), cfg.d_model, rngs=rngs)
        self.combine = fgram_cfg.combine

    def fgram_embeddings(self, fgram_tokens: jax.Array, fgram_lengths: jax.Array) -> jax.Array:
        """F(w) for each f-gram in the buffer: [C, K] tokens (right-padded), [C] lengths -> [C, d]."""
        table = self.backbone.embed_table[...]
        return self.fgram(jnp.take(table, jnp.maximum(fgram_tokens, 0), axis=0), fgram_lengths)

    def input_embeddings(self, tokens, fgram_index, fgram_groups) -> jax.Array:
        """T(s_i), with the f-gram embedding replacing or added to it where a match exists."""
        x = self.backbone.embed(tokens)
        rows = jnp.concatenate([
            self.fgram_embeddings(group, jnp.full(group.shape[:1], group.shape[1], jnp.int32))
            for group in fgram_groups], axis=0).astype(x.dtype)
        matched = (fgram_index >= 0)[..., None]
        gathered = constrain(jnp.take(rows, jnp.maximum(fgram_index, 0), axis=0), ("batch", "seq", "embed"))
        if self.combine == "replace":
            return jnp.where(matched, gathered, x)
        return x + jnp.where(matched, gathered, jnp.zeros_like(gathered))

    def __call__(self, tokens, fgram_index, fgram_groups) -> jax.Array:
        x = self.input_embeddings(tokens, fgram_index, fgram_groups)
        return self.backbone.logits(self.backbone.hidden(x))
