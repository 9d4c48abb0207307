"""The f-gram model F (SCONE.md section 4): a short causal transformer over an f-gram's tokens.

It has no token embedding of its own: it reads the backbone's table T (passed in), so T gets
gradients from both paths. Its own learned positions 0..K-1 are start-aligned, f-grams are
right-padded, and the output is the final normed hidden state at the last real position.
When its width differs from the backbone's, linear projections map T's rows in and the
output back out. Every parameter and activation lives in the "fgram/" axis namespace.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scone_jax.config.schema import ModelConfig
from scone_jax.model.layers import Norm, param
from scone_jax.model.stack import block_at, make_blocks, num_layers, remat, run_blocks
from scone_jax.sharding.rules import axis_namespace, constrain


class FgramModel(nnx.Module):
    def __init__(
        self, cfg: ModelConfig, backbone_width: int, *, gated: bool = False, rngs: nnx.Rngs
    ):
        pdt = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.dtype = jnp.dtype(cfg.dtype)
        self.projected = cfg.d_model != backbone_width
        with axis_namespace("fgram/"):
            self.pos_embed = param(
                rngs, (cfg.max_seq_len, cfg.d_model), ("positions", "embed"), cfg.init_std, pdt
            )
            if self.projected:
                self.proj_in = param(
                    rngs,
                    (backbone_width, cfg.d_model),
                    ("backbone_embed", "embed"),
                    cfg.init_std,
                    pdt,
                )
                self.proj_out = param(
                    rngs,
                    (cfg.d_model, backbone_width),
                    ("embed", "backbone_embed"),
                    cfg.init_std,
                    pdt,
                )
            self.blocks = make_blocks(cfg, rngs=rngs)
            self.final_norm = Norm(cfg, cfg.d_model, rngs=rngs)
            # zero-initialized per-dimension gain on the output: a gated model starts as the
            # baseline
            self.output_gate = (
                param(rngs, (backbone_width,), ("backbone_embed",), None, pdt) if gated else None
            )

    def __call__(self, token_embeddings: jax.Array, lengths: jax.Array) -> jax.Array:
        """[N, K, d_backbone] embeddings T(tokens) of right-padded f-grams, [N] lengths
        -> [N, d_backbone]."""
        with axis_namespace("fgram/"):
            k = token_embeddings.shape[1]
            positions = jnp.broadcast_to(jnp.arange(k), token_embeddings.shape[:2])
            x = self._embed(token_embeddings, positions)
            x = run_blocks(
                self.blocks, x, lambda block, h: block(h, positions, None), self.cfg.remat
            )
            last = jnp.clip(lengths - 1, 0, k - 1)
            out = self._output(
                jnp.take_along_axis(x, last[:, None, None].astype(jnp.int32), axis=1)[:, 0]
            )
            return constrain(out, ("batch", "embed"))

    def forest(
        self, token_embeddings: jax.Array, paths: jax.Array, outputs: jax.Array
    ) -> jax.Array:
        """F at the output nodes of a prefix forest laid out in blocks (scone_jax/forest/):
        [G, N, B, d_backbone] embeddings of the nodes' tokens, [G, N, B, K] paths (slots within
        the block), [G, R] output slots (within the group's N * B) -> [G, R, d_backbone]. A
        node's output is F of the f-gram its path spells.

        Each block runs as a sequence of B slots in which a node attends to its path only: a node
        at depth m sees exactly what position m of its f-gram sees under a causal mask, so this
        equals running every f-gram alone, with shared prefixes computed once (the ancestors
        repeated at a block's start are computed again). The other nodes' last-layer outputs are
        never read, so that layer's output projection and MLP run on the output nodes alone.
        """
        with axis_namespace("fgram/"):
            block, k = paths.shape[-2:]
            paths = paths.reshape(-1, block, k)
            depths = jnp.sum(paths >= 0, axis=-1) - 1
            on_path = jnp.any(
                paths[:, :, :, None] == jnp.arange(block), axis=2
            )  # [blocks, query, key]
            x = self._embed(token_embeddings.reshape(-1, block, token_embeddings.shape[-1]), depths)
            last = num_layers(self.blocks) - 1
            x = run_blocks(
                self.blocks, x, lambda layer, h: layer(h, depths, on_path), self.cfg.remat, last
            )
            final = block_at(self.blocks, last)
            graphdef, state = nnx.split(final)
            x = remat(
                lambda layer, h: layer.at_rows(h, depths, on_path, outputs),
                graphdef,
                self.cfg.remat,
            )(state, x)
            return constrain(self._output(x), ("batch", "seq", "embed"))

    def _embed(self, token_embeddings: jax.Array, positions: jax.Array) -> jax.Array:
        x = token_embeddings.astype(self.dtype)
        if self.projected:
            x = x @ self.proj_in[...].astype(self.dtype)
        table = constrain(
            self.pos_embed[...], (None, None)
        )  # K rows: gathered rows are batch-sharded
        x = x + jnp.take(table, positions, axis=0).astype(self.dtype)
        return constrain(x, ("batch", "seq", "embed"))

    def _output(self, h: jax.Array) -> jax.Array:
        """The final norm, and the projection back to the backbone's width."""
        out = self.final_norm(h)
        if self.projected:
            out = out @ self.proj_out[...].astype(self.dtype)
        if self.output_gate is not None:
            out = out * self.output_gate[...].astype(out.dtype)
        return out
