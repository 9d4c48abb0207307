"""Choosing the next token from logits: greedy (temperature 0), or temperature with optional
top-k and top-p. Runs inside the engine's jitted decode step, so a token costs one dispatch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from scone_jax.errors import UserError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def validate(self) -> None:
        if not 0 <= self.temperature < math.inf:  # also refuses nan
            raise UserError(f"--temperature={self.temperature} (expected a finite value >= 0)")
        if self.top_k < 0:
            raise UserError(f"--top-k={self.top_k} (expected >= 0)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p={self.top_p} (expected 0 < p <= 1)")
        if self.temperature == 0 and (self.top_k or self.top_p < 1):
            given = " and ".join(
                f
                for f, on in (
                    (f"--top-k={self.top_k}", self.top_k),
                    (f"--top-p={self.top_p}", self.top_p < 1),
                )
                if on
            )
            raise UserError(
                f"{given} without --temperature (greedy decoding takes the top token; give "
                "--temperature > 0 to sample from the top tokens)"
            )


GREEDY = Sampling()


def sample(logits: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """Next tokens [B] from last-position logits [B, V] (traced: call it inside jit)."""
    logits = logits.astype(jnp.float32)
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    # from the largest logit down: a tiny temperature then tends to greedy instead of
    # overflowing every positive logit to +inf (where the first of them would win)
    logits = (logits - logits.max(axis=-1, keepdims=True)) / sampling.temperature
    if sampling.top_k:
        kth = jax.lax.top_k(logits, min(sampling.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if sampling.top_p < 1:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above
        sorted_logits = jnp.where(before >= sampling.top_p, -jnp.inf, sorted_logits)
        logits = (
            jnp.full_like(logits, -jnp.inf)
            .at[jnp.arange(logits.shape[0])[:, None], order]
            .set(sorted_logits)
        )
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
