"""The slow reference of KV-cache generation: the whole sequence recomputed for every new token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from scone_jax.serve.engine import Engine
from scone_jax.serve.generate import prompt_fgram_ids
from scone_jax.serve.sampling import GREEDY, Sampling, sample

_sample_jit = jax.jit(sample, static_argnums=2)  # samples as the fused step does: compiled


def generate_reference(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> list[list[int]]:
    """The slow reference: recompute the whole sequence (no cache) for every new token."""
    key = jax.random.key(seed)
    seqs = [list(map(int, p)) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        key, sub = jax.random.split(key)
        last = []
        for s in seqs:  # one row at a time: no padding at all
            ids = prompt_fgram_ids(engine, [np.asarray(s)], len(s))
            last.append(np.asarray(engine.logits(np.asarray([s], np.int32), ids))[0, -1])
        new = np.asarray(_sample_jit(jnp.asarray(np.stack(last)), sub, sampling))
        for b, s in enumerate(seqs):
            s.append(int(new[b]))
            out[b].append(int(new[b]))
    return out
