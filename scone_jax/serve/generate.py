"""Generation with a KV cache: one batched prefill (with a batched f-gram lookup over every
prompt), then one token per step, each new token's f-gram found from the last K-1 tokens.

Prompts of different lengths are left-padded; padding is never attended to and each row's
positions start at its first real token. Sampling: greedy (temperature 0), or temperature
with optional top-k and top-p; a fixed seed gives a fixed output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from scone_jax.errors import UserError
from scone_jax.fgrams.tag import StreamingTagger, tag_tokens
from scone_jax.serve.engine import Engine

SHAPE_BUCKET = 64


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


@partial(jax.jit, static_argnums=(2,))
def sample(logits: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """Next tokens [B] from last-position logits [B, V]."""
    logits = logits.astype(jnp.float32)
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / sampling.temperature
    if sampling.top_k:
        kth = jax.lax.top_k(logits, min(sampling.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if sampling.top_p < 1:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above
        sorted_logits = jnp.where(before >= sampling.top_p, -jnp.inf, sorted_logits)
        logits = jnp.full_like(logits, -jnp.inf).at[jnp.arange(logits.shape[0])[:, None], order].set(sorted_logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


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
        ids[b, width - len(p):] = tags[offsets[b]:offsets[b + 1]]
    return ids


@partial(jax.jit, static_argnums=(2,))
def next_tokens(logits: jax.Array, key: jax.Array, sampling: Sampling) -> tuple[jax.Array, jax.Array]:
    """The next tokens [B] from a step's logits [B, T, V], and the next key: one dispatch per token."""
    key, sub = jax.random.split(key)
    return sample(logits[:, -1], sub, sampling), key


def step_matcher(engine: Engine, prompts: list[np.ndarray]):
    """new tokens [B] -> their f-gram ids [B], keeping each row's match state from its prompt on.

    One `StreamingTagger.push` per row (O(K) scalar probes), not the stateless numpy
    `match_batch`: this is on the critical path of every decode step, where (measured between
    steps, caches cold) pushes cost 25 us at batch 1 and 85 us at batch 16, `match_batch`
    134 and 203 us.
    """
    fgram_set = engine.lookup.table.fgram_set
    taggers = [StreamingTagger(fgram_set) for _ in prompts]
    for tagger, p in zip(taggers, prompts):
        for token in p[-(fgram_set.max_n - 1):]:
            tagger.push(token)

    def match(new: np.ndarray) -> np.ndarray:
        return np.array([t.push(x)[0] for t, x in zip(taggers, new.tolist())], np.int32)

    return match


def generate(engine: Engine, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling = Sampling(),
             seed: int = 0, eos_id: int | None = None) -> list[list[int]]:
    """New tokens for each prompt (stopping a row at `eos_id`, which is included).

    Per token: one jitted step, one jitted sampling, one device-to-host copy of the sampled
    tokens; with a table, the host work between that copy and the next step is only the
    streaming match and the row fetch (`TableLookup.prepare_step`), added inside the step.
    """
    sampling.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token")
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    prompts = [np.asarray(p, np.int64) for p in prompts]
    batch, longest = len(prompts), max(len(p) for p in prompts)
    limit = engine.model.cfg.max_seq_len
    if longest + max_new_tokens > limit:
        raise UserError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                        f"max_seq_len={limit}")
    # shapes in buckets, so new prompt lengths and generation lengths rarely recompile
    width = min(-(-longest // SHAPE_BUCKET) * SHAPE_BUCKET, limit - max_new_tokens)
    total = min(-(-(width + max_new_tokens) // SHAPE_BUCKET) * SHAPE_BUCKET, limit)
    tokens = np.zeros((batch, width), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, width - len(p):] = p
    first_valid = jnp.asarray([width - len(p) for p in prompts], jnp.int32)
    cache = engine.init_cache(batch, total)
    logits, cache = engine.decode_step(tokens, engine.prepare(prompt_fgram_ids(engine, prompts, width)),
                                       cache, 0, first_valid)
    match = step_matcher(engine, prompts) if engine.lookup else None
    key = jax.random.key(seed)
    steps, done = [], np.zeros(batch, bool)
    for step in range(max_new_tokens):
        new, key = next_tokens(logits, key, sampling)
        new = np.asarray(new)
        steps.append(new)
        if eos_id is not None:
            done |= new == eos_id
        if done.all() or step == max_new_tokens - 1:
            break
        prepared = engine.lookup.prepare_step(match(new)) if match else {}
        logits, cache = engine.decode_step(new[:, None], prepared, cache, width + step, first_valid)
    out = np.stack(steps, axis=1).tolist()
    if eos_id is not None:
        out = [row[:row.index(eos_id) + 1] if eos_id in row else row for row in out]
    return out


def generate_reference(engine: Engine, prompts: list[list[int]], max_new_tokens: int,
                       sampling: Sampling = Sampling(), seed: int = 0) -> list[list[int]]:
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
        new = np.asarray(sample(jnp.asarray(np.stack(last)), sub, sampling))
        for b, s in enumerate(seqs):
            s.append(int(new[b]))
            out[b].append(int(new[b]))
    return out
