"""Generation with a KV cache: one batched prefill (with a batched f-gram lookup over every
prompt), then one token per step, each new token's f-gram found from the last K-1 tokens.

Prompts of different lengths are left-padded; padding is never attended to and each row's
positions start at its first real token. Sampling (`sampling.py`: greedy, or temperature
with optional top-k and top-p) runs inside the jitted step; a fixed seed gives a fixed output.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from scone_jax.errors import UserError
from scone_jax.fgrams.tag import tag_tokens
from scone_jax.serve.engine import Engine
from scone_jax.serve.sampling import GREEDY, Sampling

SHAPE_BUCKET = 64


def prompt_fgram_ids(engine: Engine, prompts: list[np.ndarray], width: int) -> np.ndarray:
    """Longest-match f-gram ids for left-padded prompts [B, width] (-1 on padding)."""
    ids = np.full((len(prompts), width), -1, np.int32)
    if engine.lookup is None:
        return ids
    fgram_set = engine.lookup.table.fgram_set
    lengths = np.array([len(p) for p in prompts])
    flat = np.concatenate(prompts) if len(prompts) else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tags, _ = tag_tokens(fgram_set, flat, offsets)  # each prompt is its own document
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = tags[offsets[b] : offsets[b + 1]]
    return ids


def decode_steps(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> Iterator[np.ndarray]:
    """The new tokens [B] of each step, as soon as they are on the host; the next step (the
    first: the prefill) runs only when the caller asks for it, so a caller can stop early or
    time each step. Bad arguments are refused at the call.

    Per token: one jitted step (sampling included), one device-to-host copy of the sampled
    tokens; with a table, the host work between that copy and the next step is only the
    streaming match and the row fetch (`TableLookup.decoder`), added inside the step.
    """
    sampling.validate()
    if not prompts:
        raise UserError("no prompt given (expected at least one)")
    empty = [i + 1 for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise UserError(
            f"prompt {empty[0]} of {len(prompts)} has no tokens (expected at least one)"
        )
    prompts = [np.asarray(p, np.int64) for p in prompts]
    longest, limit = max(len(p) for p in prompts), engine.model.cfg.max_seq_len
    # the last new token is returned, never fed back: the model sees longest + max_new - 1
    if longest + max_new_tokens - 1 > limit:
        raise UserError(
            f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) - 1 exceeds the model's "
            f"max_seq_len={limit} (the last new token is not fed back)"
        )
    if max_new_tokens <= 0:
        return iter(())
    # shapes in buckets, so new prompt lengths and generation lengths rarely recompile
    fed = max_new_tokens - 1  # positions the new tokens take in the cache
    width = min(-(-longest // SHAPE_BUCKET) * SHAPE_BUCKET, limit - fed)
    total = min(-(-(width + fed) // SHAPE_BUCKET) * SHAPE_BUCKET, limit)
    return _steps(engine, prompts, width, total, max_new_tokens, sampling, seed)


def _steps(
    engine: Engine,
    prompts: list[np.ndarray],
    width: int,
    total: int,
    max_new_tokens: int,
    sampling: Sampling,
    seed: int,
) -> Iterator[np.ndarray]:
    """`decode_steps` for prompts left-padded to `width`, with a KV cache of `total` positions."""
    batch = len(prompts)
    tokens = np.zeros((batch, width), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, width - len(p) :] = p
    first_valid = jnp.asarray([width - len(p) for p in prompts], jnp.int32)
    cache = engine.init_cache(batch, total)
    prepared = engine.prepare(prompt_fgram_ids(engine, prompts, width))
    new, key, cache = engine.decode_step(
        tokens, prepared, cache, 0, first_valid, jax.random.key(seed), sampling
    )
    lookup = engine.lookup.decoder(prompts) if engine.lookup else None
    for step in range(max_new_tokens):
        new = np.asarray(new)
        yield new
        if step == max_new_tokens - 1:
            return
        prepared = lookup(new) if lookup else {}
        new, key, cache = engine.decode_step(
            new[:, None], prepared, cache, width + step, first_valid, key, sampling
        )


def generate(
    engine: Engine,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    seed: int = 0,
    eos_id: int | None = None,
) -> list[list[int]]:
    """New tokens for each prompt (`decode_steps`), stopping a row at `eos_id` (which is included)
    and the whole batch once every row has it."""
    steps, done = [], np.zeros(len(prompts), bool)
    for new in decode_steps(engine, prompts, max_new_tokens, sampling, seed):
        steps.append(new)
        if eos_id is not None:
            done |= new == eos_id
            if done.all():
                break
    if not steps:
        return [[] for _ in prompts]
    out = np.stack(steps, axis=1).tolist()
    if eos_id is not None:
        out = [row[: row.index(eos_id) + 1] if eos_id in row else row for row in out]
    return out
