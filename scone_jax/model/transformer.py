"""The decoder-only backbone: token embedding T, blocks, final norm, tied output head.

Split into `embed` -> `hidden` -> `logits` so SCONE can change the input embeddings (replace
or add f-gram embeddings) without a second code path through the blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scone_jax.config.schema import ModelConfig
from scone_jax.model.layers import Norm, param
from scone_jax.model.stack import block_at, make_blocks, num_layers, run_blocks
from scone_jax.sharding.rules import constrain


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.dtype = jnp.dtype(cfg.dtype)
        self.embed_table = param(
            rngs, (vocab_size, cfg.d_model), ("vocab", "embed"), cfg.init_std, pdt
        )
        if cfg.family == "gpt2":
            self.pos_embed = param(
                rngs, (cfg.max_seq_len, cfg.d_model), ("positions", "embed"), cfg.init_std, pdt
            )
        self.blocks = make_blocks(cfg, rngs=rngs)
        self.final_norm = Norm(cfg, cfg.d_model, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = param(
                rngs, (cfg.d_model, vocab_size), ("embed", "vocab"), cfg.init_std, pdt
            )

    def table_rows(self, ids: jax.Array) -> jax.Array:
        """Rows of T at `ids` (any shape), in the parameter dtype. The table's embed dim is
        gathered first (as FSDP does for any weight), so the rows come out sharded like `ids`:
        looked up in an embed-sharded table, SPMD replicated the whole batch's rows instead."""
        return jnp.take(constrain(self.embed_table[...], ("vocab", None)), ids, axis=0)

    def embed(self, tokens: jax.Array) -> jax.Array:
        """T(s_i): [B, T] int -> [B, T, d] in the compute dtype."""
        return constrain(self.table_rows(tokens).astype(self.dtype), ("batch", "seq", "embed"))

    def hidden(self, x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Input embeddings [B, T, d] -> final normed hidden states [B, T, d]."""
        length = x.shape[1]
        if self.cfg.family == "gpt2":  # positions 0..T-1 (training) are a slice, not a gather
            table = self.pos_embed[...]
            rows = table[None, :length] if positions is None else jnp.take(table, positions, axis=0)
            x = x + rows.astype(self.dtype)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), x.shape[:2])
        x = run_blocks(self.blocks, x, lambda block, h: block(h, positions, None), self.cfg.remat)
        return self.final_norm(x)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> list[dict]:
        """An empty KV cache for `max_len` tokens: one {k, v} per layer."""
        shape = (batch, max_len, self.cfg.kv_heads, self.cfg.head_dim)
        dtype = dtype or self.dtype
        layers = num_layers(self.blocks)
        return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(layers)]

    def hidden_cached(
        self,
        x: jax.Array,
        cache: list[dict],
        start: jax.Array,
        first_valid: jax.Array | None = None,
    ):
        """Like `hidden` for cache slots start..start+T-1, reusing and extending `cache`.

        Row b may be left-padded: its real tokens start at slot `first_valid[b]`, which is
        position 0 for it (padding is never attended to).
        """
        if first_valid is None:
            first_valid = jnp.zeros(x.shape[0], jnp.int32)
        slots = start + jnp.arange(x.shape[1])
        positions = jnp.maximum(slots[None, :] - first_valid[:, None], 0)
        if self.cfg.family == "gpt2":
            x = x + jnp.take(self.pos_embed[...], positions, axis=0).astype(self.dtype)
        new_cache = []
        for layer, layer_cache in enumerate(cache):
            x, layer_cache = block_at(self.blocks, layer).cached(
                x, positions, layer_cache, start, first_valid
            )
            new_cache.append(layer_cache)
        return self.final_norm(x), new_cache

    def logits(self, h: jax.Array) -> jax.Array:
        """Hidden states -> float32 logits over the vocabulary (tied head by default)."""
        if self.cfg.tie_embeddings:
            out = jnp.einsum("btd,vd->btv", h, self.embed_table[...].astype(h.dtype))
        else:
            out = h @ self.lm_head[...].astype(h.dtype)
        return constrain(out.astype(jnp.float32), ("batch", "seq", "vocab"))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(self.hidden(self.embed(tokens)))
