"""Building blocks with logical axis names on every parameter (see sharding/rules.py).

Each parameter is an `nnx.Param` with `logical_axes` metadata; weights are stored in
`param_dtype` and cast to the compute `dtype` at use (mixed precision).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from scone_jax.config.schema import ModelConfig
from scone_jax.errors import UserError
from scone_jax.sharding.rules import axis_names, constrain


def param(rngs: nnx.Rngs, shape, axes, std: float | None, dtype) -> nnx.Param:
    """A normal(std) weight, or zeros when std is None; named in the current axis namespace."""
    if std is None:
        value = jnp.zeros(shape, dtype)
    else:
        value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=axis_names(axes))


def ones(shape, axes, dtype) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, dtype), logical_axes=axis_names(axes))


class Norm(nnx.Module):
    """LayerNorm (gpt2) or RMSNorm (llama); statistics in float32."""

    def __init__(self, cfg: ModelConfig, dim: int, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        self.rms = cfg.family == "llama"
        self.eps = cfg.norm_eps
        self.scale = ones((dim,), ("norm",), pdt)
        self.bias = None if self.rms else param(rngs, (dim,), ("norm",), None, pdt)

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        if self.rms:
            y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
            y = y * self.scale[...].astype(jnp.float32)
        else:
            mean = jnp.mean(xf, axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
            y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
            y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


def attention_implementation(name: str, dtype) -> str:
    """`model.attention` resolved for this backend: `auto` is cuDNN's fused kernel on an NVIDIA
    GPU in half precision (all it supports), XLA's attention elsewhere."""
    on_gpu = jax.default_backend() == "gpu"
    if name == "cudnn" and not on_gpu:
        raise UserError(
            f"model.attention='cudnn' needs an NVIDIA GPU (this backend is "
            f"{jax.default_backend()}; use 'auto' or 'xla')"
        )
    if name != "auto":
        return name
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if half and on_gpu else "xla"


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding on [B, T, H, D] at integer positions [B, T] (half-split layout)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None].astype(jnp.float32) * freqs  # [B, T, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Causal multi-head attention with optional grouped-query heads; softmax in float32."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.cfg = cfg
        self.wq = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg.init_std, pdt)
        self.wk = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std, pdt)
        self.wv = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), cfg.init_std, pdt)
        self.wo = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), out_std, pdt)
        self.use_bias = cfg.family == "gpt2"
        if self.use_bias:
            self.bq = param(rngs, (h, hd), ("heads", "head_dim"), None, pdt)
            self.bk = param(rngs, (kv, hd), ("kv_heads", "head_dim"), None, pdt)
            self.bv = param(rngs, (kv, hd), ("kv_heads", "head_dim"), None, pdt)
            self.bo = param(rngs, (d,), ("embed",), None, pdt)

    def _qkv(self, x: jax.Array, positions: jax.Array):
        cfg, dt = self.cfg, x.dtype
        q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(dt))
        if self.use_bias:
            q, k, v = (
                q + self.bq[...].astype(dt),
                k + self.bk[...].astype(dt),
                v + self.bv[...].astype(dt),
            )
        if cfg.family == "llama":
            q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
        q = constrain(q, ("batch", "seq", "heads", "head_dim"))
        k = constrain(k, ("batch", "seq", "kv_heads", "head_dim"))
        return q, k, v

    def _attend(
        self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, implementation: str
    ) -> jax.Array:
        """softmax(q k^T / sqrt(d)) v per head (logits and softmax in float32), over the keys
        `mask` [B or 1, Tq, Tk] allows, or causally when `mask` is None (which lets a fused
        kernel skip the masked half). Grouped kv heads are shared, not repeated."""
        return jax.nn.dot_product_attention(
            q,
            k,
            v,
            mask=None if mask is None else mask[:, None],
            is_causal=mask is None,
            implementation=implementation,
        )

    def project(self, heads: jax.Array) -> jax.Array:
        """The output projection of the attended values [B, T, heads, head_dim] -> [B, T, d]."""
        heads = constrain(heads, ("batch", "seq", "heads", "head_dim"))
        y = jnp.einsum("bthk,hkd->btd", heads, self.wo[...].astype(heads.dtype))
        if self.use_bias:
            y = y + self.bo[...].astype(heads.dtype)
        return y

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        return self.project(self.heads(x, positions, mask))

    def heads(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        """The attended values [B, T, heads, head_dim], before the output projection; `mask`
        None is causal."""
        q, k, v = self._qkv(x, positions)
        return self._attend(q, k, v, mask, attention_implementation(self.cfg.attention, q.dtype))

    def cached(
        self,
        x: jax.Array,
        positions: jax.Array,
        cache: dict,
        start: jax.Array,
        first_valid: jax.Array,
    ):
        """Attention for cache slots `start..start+T-1` given a KV cache of earlier slots.

        `cache` holds `k`, `v` [B, L, kv_heads, head_dim]; slots before `first_valid` [B] are
        left padding and never attended to. Returns the output and the cache with this
        chunk's keys and values written at `start`.
        """
        q, k, v = self._qkv(x, positions)
        k_all = jax.lax.dynamic_update_slice_in_dim(
            cache["k"], k.astype(cache["k"].dtype), start, axis=1
        )
        v_all = jax.lax.dynamic_update_slice_in_dim(
            cache["v"], v.astype(cache["v"].dtype), start, axis=1
        )
        key_pos = jnp.arange(k_all.shape[1])
        mask = (key_pos[None, None, :] <= (start + jnp.arange(x.shape[1]))[None, :, None]) & (
            key_pos[None, None, :] >= first_valid[:, None, None]
        )
        # decoding attends a few queries to a padded cache: XLA's attention, whatever the config
        y = self.project(self._attend(q, k_all.astype(q.dtype), v_all.astype(q.dtype), mask, "xla"))
        return y, {"k": k_all, "v": v_all}


class Mlp(nnx.Module):
    """GeLU MLP (gpt2) or SwiGLU (llama)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        d, f = cfg.d_model, cfg.ffn_dim
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.gated = cfg.family == "llama"
        self.w_in = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std, pdt)
        self.w_out = param(rngs, (f, d), ("mlp", "embed"), out_std, pdt)
        if self.gated:
            self.w_gate = param(rngs, (d, f), ("embed", "mlp"), cfg.init_std, pdt)
        else:
            self.b_in = param(rngs, (f,), ("mlp",), None, pdt)
            self.b_out = param(rngs, (d,), ("embed",), None, pdt)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        h = x @ self.w_in[...].astype(dt)
        if self.gated:
            h = jax.nn.silu(x @ self.w_gate[...].astype(dt)) * h
        else:
            h = jax.nn.gelu(h + self.b_in[...].astype(dt), approximate=True)
        h = constrain(h, ("batch", "seq", "mlp"))
        y = h @ self.w_out[...].astype(dt)
        if not self.gated:
            y = y + self.b_out[...].astype(dt)
        return y


class Block(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = Norm(cfg, cfg.d_model, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = Norm(cfg, cfg.d_model, rngs=rngs)
        self.mlp = Mlp(cfg, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        """`mask` [B or 1, T, T] says which keys each query sees; None is causal."""
        return self._mlp_residual(x + self.attn(self.attn_norm(x), positions, mask))

    def at_rows(
        self, x: jax.Array, positions: jax.Array, mask: jax.Array, rows: jax.Array
    ) -> jax.Array:
        """The block's output at some slots only: x [G * M, T, d] is G groups of M sequences,
        `rows` [G, R] picks slots of each group's M * T. Every slot's keys and values are still
        computed (the picked slots attend to them); the output projection and the MLP run on
        the R picked slots alone. -> [G, R, d]."""
        heads = self.attn.heads(self.attn_norm(x), positions, mask)
        groups = rows.shape[0]
        pick = jax.vmap(
            lambda values, index: jnp.take(values, index, axis=0)
        )  # within a group: shard-local
        picked_x = pick(x.reshape(groups, -1, x.shape[-1]), rows)
        picked_heads = pick(heads.reshape(groups, -1, *heads.shape[2:]), rows)
        return self._mlp_residual(picked_x + self.attn.project(picked_heads))

    def _mlp_residual(self, x: jax.Array) -> jax.Array:
        x = constrain(x, ("batch", "seq", "embed"))
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "seq", "embed"))

    def cached(
        self,
        x: jax.Array,
        positions: jax.Array,
        cache: dict,
        start: jax.Array,
        first_valid: jax.Array,
    ):
        y, cache = self.attn.cached(self.attn_norm(x), positions, cache, start, first_valid)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache
