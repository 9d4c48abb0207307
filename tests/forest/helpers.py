"""Random f-gram sets and batches of tags, shared by the forest and the model tests."""

import numpy as np

VOCAB, K, T = 40, 4, 16


def random_fgram_set(rng, size, vocab=VOCAB):
    """Random f-grams over a small vocabulary, so that many share prefixes."""
    lengths = rng.integers(2, K + 1, size)
    tokens = np.full((size, K), -1, np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, vocab, n)
    return tokens, lengths


def random_batch(rng, batch, num_tokens, set_size, match_prob=0.6):
    positions = rng.choice(num_tokens - T - 1, batch)[:, None] + np.arange(T)
    tag_ids = np.where(
        rng.random(num_tokens) < match_prob, rng.integers(0, set_size, num_tokens), -1
    )
    tag_lengths = np.where(tag_ids >= 0, 2, 0)
    inputs = rng.integers(0, VOCAB, (batch, T)).astype(np.int32)
    return (
        {"inputs": inputs, "targets": np.roll(inputs, -1, 1), "positions": positions},
        tag_ids,
        tag_lengths,
    )
