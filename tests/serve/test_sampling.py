"""Sampling against a numpy reference: greedy is the argmax, and temperature, top-k and top-p
draw each token with the probability the reference gives it (none outside the kept set)."""

import jax
import numpy as np
import pytest

from scone_jax.serve.sampling import Sampling, sample


def reference_probs(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """Per row: softmax(logits / T) over the top-k tokens, then the smallest prefix of them by
    rank whose mass before each kept token is below p, renormalised."""
    z = logits.astype(np.float64) / s.temperature
    if s.top_k:
        kth = np.sort(z, axis=-1)[:, -min(s.top_k, z.shape[-1])][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if s.top_p < 1:
        for row in range(len(p)):
            order = np.argsort(-p[row])
            before = np.cumsum(p[row, order]) - p[row, order]
            p[row, order[before >= s.top_p]] = 0
        p /= p.sum(-1, keepdims=True)
    return p


def test_greedy_is_the_argmax(rng):
    logits = rng.normal(size=(16, 50)).astype(np.float32)
    got = jax.jit(sample, static_argnums=2)(logits, jax.random.key(0), Sampling())
    np.testing.assert_array_equal(np.asarray(got), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 1e-45])
def test_a_vanishing_temperature_tends_to_greedy(temperature, rng):
    """Below float32's range logits / T overflows to +inf for every positive logit, and the
    first of them would win; sampling from the largest logit down keeps the argmax."""
    logits = rng.normal(size=(16, 50)).astype(np.float32)
    logits[:, 0] = 1e-3  # a small positive logit ahead of the argmax in every row
    logits[:, 1] = 0.0  # and an exact zero, which 0 / T must not turn into nan
    logits[:, 7] = 9.0
    keys = jax.random.split(jax.random.key(int(rng.integers(2**31))), 4)
    for key in keys:
        got = jax.jit(sample, static_argnums=2)(logits, key, Sampling(temperature, 5, 0.9))
        np.testing.assert_array_equal(np.asarray(got), logits.argmax(-1))


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.7, 3, 1.0), (1.0, 0, 0.6), (0.8, 4, 0.7), (1.0, 1, 1.0)],
)
def test_sampling_draws_the_reference_distribution(temperature, top_k, top_p, rng):
    s = Sampling(temperature, top_k, top_p)
    rows, vocab, draws = 3, 7, 20000
    logits = (rng.normal(size=(rows, vocab)) * 1.5).astype(np.float32)
    want = reference_probs(logits, s)
    repeated = np.repeat(logits, draws, axis=0)  # one call: `draws` independent draws per row
    got = np.asarray(
        jax.jit(sample, static_argnums=2)(repeated, jax.random.key(int(rng.integers(1 << 30))), s)
    )
    freq = (
        np.stack(
            [np.bincount(got[r * draws : (r + 1) * draws], minlength=vocab) for r in range(rows)]
        )
        / draws
    )
    assert np.all(freq[want == 0] == 0)  # nothing outside the kept set
    sigma = np.sqrt(want * (1 - want) / draws)
    np.testing.assert_array_less(np.abs(freq - want), 5 * sigma + 1e-9)
    if top_k:
        assert np.all((want > 0).sum(-1) <= top_k)
    if top_p < 1:
        assert np.any((want > 0).sum(-1) < vocab)  # the draw does reach the cut
