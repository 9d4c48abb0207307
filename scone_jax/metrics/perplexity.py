"""Perplexity and bits per byte from summed losses: one definition for training's evaluation, the
serving path's and a run's, so their numbers compare."""

from __future__ import annotations

import numpy as np


def eval_result(nats: float, tokens: float, nbytes: float) -> dict[str, float]:
    """`nats` summed over `tokens` predicted targets spelling `nbytes` bytes."""
    loss = nats / tokens
    return {
        "loss": loss,
        "perplexity": float(np.exp(loss)),
        "bits_per_byte": float(nats / np.log(2) / max(nbytes, 1.0)),
        "tokens": tokens,
    }
