"""FLOPs per token from the architecture, peak FLOP/s per device kind, and MFU.

Counting convention (as in PaLM/MaxText): a matmul of [m, k] x [k, n] is 2mkn FLOPs; the
backward pass costs twice the forward, so training is 3x forward. Attention scores and the
weighted sum add 2 * 2 * T * d per token per layer for full causal-masked attention computed
densely (what our kernel does).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from scone_jax.config.schema import FgramConfig, ModelConfig

# Dense bf16 peak FLOP/s per chip (vendor figures, no sparsity). Keys match device_kind prefixes.
PEAK_BF16_FLOPS: dict[str, float] = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "TPU7x": 2307e12,
    "NVIDIA H200": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10G": 125e12,
    "NVIDIA B200": 2250e12,
}


@dataclass(frozen=True)
class ModelFlops:
    params_total: int
    params_embedding: int
    forward_per_token: float  # matmul FLOPs of one forward pass, per token

    @property
    def train_per_token(self) -> float:
        return 3.0 * self.forward_per_token

    @property
    def params_non_embedding(self) -> int:
        return self.params_total - self.params_embedding


def _block_params(cfg: ModelConfig) -> int:
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim
    gpt2 = cfg.family == "gpt2"
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d + ((h + 2 * kv) * hd + d if gpt2 else 0)
    mlp = 3 * d * f if not gpt2 else 2 * d * f + f + d
    norms = (2 * d if gpt2 else d) * 2
    return attn + mlp + norms


def _norm_params(cfg: ModelConfig) -> int:
    return 2 * cfg.d_model if cfg.family == "gpt2" else cfg.d_model


def count_params(cfg: ModelConfig, vocab_size: int) -> tuple[int, int]:
    """(total, embedding) parameter counts, matching the parameters `Transformer` creates."""
    d = cfg.d_model
    embedding = vocab_size * d + (cfg.max_seq_len * d if cfg.family == "gpt2" else 0)
    head = 0 if cfg.tie_embeddings else d * vocab_size
    return cfg.n_layers * _block_params(cfg) + embedding + head + _norm_params(cfg), embedding


def count_fgram_params(fgram: FgramConfig, backbone: ModelConfig) -> int:
    """Parameters of the f-gram model `FgramModel` creates (it has no token embedding)."""
    cfg = fgram.model_config(backbone)
    proj = 2 * backbone.d_model * cfg.d_model if cfg.d_model != backbone.d_model else 0
    return (
        cfg.n_layers * _block_params(cfg) + cfg.max_seq_len * cfg.d_model + _norm_params(cfg) + proj
    )


def _forward_per_token(cfg: ModelConfig, seq_len: int) -> float:
    d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
    proj = d * h * hd + 2 * d * kv * hd + h * hd * d
    attention = 2 * seq_len * h * hd  # QK^T and PV per query token
    return cfg.n_layers * (2 * (proj + _mlp_params(cfg)) + 2 * attention)


def _mlp_params(cfg: ModelConfig) -> int:
    return (3 if cfg.family == "llama" else 2) * cfg.d_model * cfg.ffn_dim


def model_flops(cfg: ModelConfig, vocab_size: int, seq_len: int) -> ModelFlops:
    total, embedding = count_params(cfg, vocab_size)
    head = 2 * cfg.d_model * vocab_size
    return ModelFlops(
        params_total=total,
        params_embedding=embedding,
        forward_per_token=_forward_per_token(cfg, seq_len) + head,
    )


def fgram_forest_forward(
    fgram: FgramConfig, backbone: ModelConfig, slots: int, outputs: int
) -> float:
    """Forward FLOPs of the f-gram model on a prefix forest of `slots` node slots, `outputs` of
    them read: each slot is one position attending densely over its block's slots (what runs,
    though only its path counts); the last layer's output projection and MLP, and the projection
    out to the backbone's width, run on the outputs."""
    cfg = fgram.model_config(backbone)
    proj = 2 * backbone.d_model * cfg.d_model if cfg.d_model != backbone.d_model else 0
    tail = 2 * (cfg.n_heads * cfg.head_dim * cfg.d_model + _mlp_params(cfg))
    return (
        slots * (_forward_per_token(cfg, fgram.block_size) + proj)
        - (slots - outputs) * tail
        + outputs * proj
    )


def fgram_forward_per_row(fgram: FgramConfig, backbone: ModelConfig, length: int) -> float:
    """Forward FLOPs of the f-gram model on one f-gram of `length` tokens (all are computed)."""
    cfg = fgram.model_config(backbone)
    proj = (
        2 * backbone.d_model * cfg.d_model * (length + 1) if cfg.d_model != backbone.d_model else 0
    )
    return length * _forward_per_token(cfg, length) + proj


def peak_flops(device: jax.Device | None = None) -> float | None:
    """Peak bf16 FLOP/s of one device, or None when unknown (CPU)."""
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "")
    for prefix in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if kind.startswith(prefix):
            return PEAK_BF16_FLOPS[prefix]
    return None
