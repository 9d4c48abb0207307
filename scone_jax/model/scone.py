"""SCONE: the backbone plus the f-gram model, combined at the input layer (SCONE.md section 3).

The f-gram model runs once per node of the batch's prefix forest (`fgram_nodes` tokens,
`fgram_paths`; see scone_jax/forest/) and each position takes the output (`fgram_outputs`) that
`fgram_index` points at (-1 = no match); with `fgrams.suffix_rows` it points at K - 1 outputs
per position, the f-gram's and its suffixes' in the set, and the position takes their sum.
The gather's transpose sums the gradients of every position sharing a node. With deduplication
each distinct prefix is one node; without it every matched position has its own chain. Both give
the same loss and gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scone_jax.config.schema import FgramConfig, ModelConfig
from scone_jax.model.fgram_model import FgramModel
from scone_jax.model.transformer import Transformer
from scone_jax.sharding.rules import constrain


def sum_of_links(rows: jax.Array, links: jax.Array) -> jax.Array:
    """rows [R, d], links [..., L] of row indices -> [..., d]: the sum of each position's rows
    (its f-gram's, then with suffix rows its suffixes'; -1 past a chain's end). Training and
    the export both sum this way. The first link is taken as is (clamped at 0: the caller
    masks a position without a match)."""
    total = jnp.take(rows, jnp.maximum(links[..., 0], 0), axis=0)
    for link in range(1, links.shape[-1]):
        more = jnp.take(rows, jnp.maximum(links[..., link], 0), axis=0)
        total = total + jnp.where((links[..., link] >= 0)[..., None], more, jnp.zeros_like(more))
    return total


class SconeModel(nnx.Module):
    def __init__(
        self, cfg: ModelConfig, fgram_cfg: FgramConfig, vocab_size: int, *, rngs: nnx.Rngs
    ):
        self.backbone = Transformer(cfg, vocab_size, rngs=rngs)  # first: same init as the baseline
        self.fgram = FgramModel(
            fgram_cfg.model_config(cfg), cfg.d_model, gated=fgram_cfg.combine == "gated", rngs=rngs
        )
        self.combine = fgram_cfg.combine
        self.detach_table = fgram_cfg.detach_table
        self.embed_drop_rate = fgram_cfg.embed_drop_rate

    def input_embeddings(
        self, tokens, fgram_index, fgram_nodes, fgram_paths, fgram_outputs, dropout_key=None
    ) -> jax.Array:
        """T(s_i), with the f-gram embedding replacing or added to it where a match exists.
        Given a `dropout_key` (training), `fgrams.embed_drop_rate` of each position's f-gram
        embedding features are zeroed and the rest scaled up."""
        x = self.backbone.embed(tokens)
        rows_in = self.backbone.table_rows(fgram_nodes)
        if self.detach_table:
            rows_in = jax.lax.stop_gradient(rows_in)
        outputs = self.fgram.forest(rows_in, fgram_paths, fgram_outputs).astype(x.dtype)
        rows = outputs.reshape(-1, outputs.shape[-1])
        # [B, T] or, with fgrams.suffix_rows, [B, T, K - 1]: the f-gram, then its suffixes
        links = fgram_index if fgram_index.ndim == 3 else fgram_index[..., None]
        matched = (links[..., 0] >= 0)[..., None]
        gathered = constrain(sum_of_links(rows, links), ("batch", "seq", "embed"))
        if dropout_key is not None and self.embed_drop_rate:
            keep = jax.random.bernoulli(dropout_key, 1.0 - self.embed_drop_rate, gathered.shape)
            scaled = gathered / jnp.asarray(1.0 - self.embed_drop_rate, gathered.dtype)
            gathered = constrain(
                jnp.where(keep, scaled, jnp.zeros_like(gathered)), ("batch", "seq", "embed")
            )
        if self.combine == "replace":
            return jnp.where(matched, gathered, x)
        return x + jnp.where(matched, gathered, jnp.zeros_like(gathered))

    def __call__(
        self, tokens, fgram_index, fgram_nodes, fgram_paths, fgram_outputs, dropout_key=None
    ) -> jax.Array:
        x = self.input_embeddings(
            tokens, fgram_index, fgram_nodes, fgram_paths, fgram_outputs, dropout_key
        )
        return self.backbone.logits(self.backbone.hidden(x))
