"""FLOPs per token from the architecture, peak FLOP/s per device kind, and MFU.

Counting convention (as in PaLM/MaxText): a matmul of [m, k] x [k, n] is 2mkn FLOPs; the
backward pass costs twice the forward, so training is 3x forward. Attention scores and the
weighted sum add 2 * 2 * T * d per token per layer for full causal-masked attention computed
densely (what our kernel does).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from scone_jax.config.schema import ModelConfig

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


def count_params(cfg: ModelConfig, vocab_size: int) -> tuple[int, int]:
    """(total, embedding) parameter counts, matching the parameters `Transformer` creates."""
    d, h, kv, hd, f, n = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.n_layers
    gpt2 = cfg.family == "gpt2"
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d + ((h + 2 * kv) * hd + d if gpt2 else 0)
    mlp = 3 * d * f if not gpt2 else 2 * d * f + f + d
    norms = (2 * d if gpt2 else d) * 2
    per_layer = attn + mlp + norms
    embedding = vocab_size * d + (cfg.max_seq_len * d if gpt2 else 0)
    head = 0 if cfg.tie_embeddings else d * vocab_size
    final_norm = 2 * d if gpt2 else d
    return n * per_layer + embedding + head + final_norm, embedding


def model_flops(cfg: ModelConfig, vocab_size: int, seq_len: int) -> ModelFlops:
    total, embedding = count_params(cfg, vocab_size)
    d, h, kv, hd, f, n = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.n_layers
    proj = d * h * hd + 2 * d * kv * hd + h * hd * d
    mlp = (3 if cfg.family == "llama" else 2) * d * f
    attention = 2 * seq_len * h * hd  # QK^T and PV per query token
    per_layer = 2 * (proj + mlp) + 2 * attention
    head = 2 * d * vocab_size
    return ModelFlops(params_total=total, params_embedding=embedding, forward_per_token=n * per_layer + head)


def peak_flops(device: jax.Device | None = None) -> float | None:
    """Peak bf16 FLOP/s of one device, or None when unknown (CPU)."""
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "")
    for prefix in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if kind.startswith(prefix):
            return PEAK_BF16_FLOPS[prefix]
    return None
