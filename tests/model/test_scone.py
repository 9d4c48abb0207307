"""The SCONE combination: dedup == plain, no matches == baseline, F ignores the context."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scone_jax.config import FgramConfig, ModelConfig
from scone_jax.data.fgram_batches import FgramBatcher
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel
from scone_jax.train.step import model_inputs

VOCAB, K, T = 40, 4, 16
BACKBONE = {
    "gpt2": ModelConfig(family="gpt2", d_model=32, n_layers=2, n_heads=2, max_seq_len=T),
    "llama": ModelConfig(family="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=T),
}


def random_fgram_set(rng, size):
    lengths = rng.integers(2, K + 1, size)
    tokens = np.full((size, K), -1, np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, VOCAB, n)
    return tokens, lengths


def random_batch(rng, batch, num_tokens, set_size, match_prob=0.6):
    positions = rng.choice(num_tokens - T - 1, batch)[:, None] + np.arange(T)
    tag_ids = np.where(rng.random(num_tokens) < match_prob, rng.integers(0, set_size, num_tokens), -1)
    tag_lengths = np.where(tag_ids >= 0, 2, 0)
    inputs = rng.integers(0, VOCAB, (batch, T)).astype(np.int32)
    return {"inputs": inputs, "targets": np.roll(inputs, -1, 1), "positions": positions}, tag_ids, tag_lengths


def loss_and_grads(model, batch):
    graphdef, params = nnx.split(model)

    inputs = jax.tree.map(jnp.asarray, model_inputs(batch))

    def loss(p):
        m = nnx.merge(graphdef, p)
        logits = m(jnp.asarray(batch["inputs"]), **inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(batch["targets"])).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("family, combine, capacity", [  # capacity 4 < f-grams per length: overflow
    ("gpt2", "replace", 512), ("gpt2", "add", 4), ("llama", "replace", 4), ("llama", "add", 512)])
def test_dedup_and_plain_give_the_same_loss_and_gradients(family, combine, capacity, rng):
    fcfg = FgramConfig(enabled=True, max_n=K, combine=combine, d_model=24 if family == "gpt2" else 0)
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    set_tokens, set_lengths = random_fgram_set(rng, 30)
    batch, tag_ids, tag_lengths = random_batch(rng, 4, 500, 30)
    caps = {n: capacity for n in range(2, K + 1)}
    dedup = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, granule=4, capacity=caps)(batch)
    plain = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, granule=4, capacity=caps,
                         dedup=False)(batch)
    assert len(np.unique(dedup["fgram_index"])) < len(np.unique(plain["fgram_index"]))  # fewer rows
    assert (dedup["fgram_stats"]["fgram_overflow"] > 0) == (capacity == 4)
    for n in range(2, K + 1):  # no padding to K: each length has its own buffer
        assert dedup[f"fgram_tokens_{n}"].shape[1] == n
    (la, ga), (lb, gb) = loss_and_grads(model, dedup), loss_and_grads(model, plain)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    fgram_grads = jax.tree.leaves(ga["fgram"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in fgram_grads)  # the f-gram path is trained


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_no_matches_is_exactly_the_baseline(family, rng):
    seed = int(rng.integers(1 << 30))
    scone = SconeModel(BACKBONE[family], FgramConfig(enabled=True, max_n=K), VOCAB, rngs=nnx.Rngs(seed))
    base = Transformer(BACKBONE[family], VOCAB, rngs=nnx.Rngs(seed))
    set_tokens, set_lengths = random_fgram_set(rng, 5)
    batch, tag_ids, tag_lengths = random_batch(rng, 2, 300, 5, match_prob=0.0)
    batch = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, granule=4)(batch)
    ls, _ = loss_and_grads(scone, batch)
    graphdef, params = nnx.split(base)

    @jax.jit
    def base_loss(p):
        logits = nnx.merge(graphdef, p)(jnp.asarray(batch["inputs"]))
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(batch["targets"])).mean()

    assert float(ls) == float(base_loss(params))


def test_fgram_embedding_does_not_depend_on_the_window(rng):
    """The same f-gram in two different windows gets an identical embedding: the table is possible."""
    model = SconeModel(BACKBONE["gpt2"], FgramConfig(enabled=True, max_n=K, combine="replace"), VOCAB,
                       rngs=nnx.Rngs(0))
    fgram = np.array([[5, 9, 2, -1]])
    tokens_a = rng.integers(0, VOCAB, (1, T)).astype(np.int32)
    tokens_b = rng.integers(0, VOCAB, (1, T)).astype(np.int32)
    index_a = np.full((1, T), -1, np.int32)
    index_b = index_a.copy()
    index_a[0, 3], index_b[0, 11] = 0, 0
    groups = (jnp.asarray(fgram[:, :3], jnp.int32),)  # one buffer: length 3
    ea = model.input_embeddings(jnp.asarray(tokens_a), jnp.asarray(index_a), groups)
    eb = model.input_embeddings(jnp.asarray(tokens_b), jnp.asarray(index_b), groups)
    np.testing.assert_array_equal(np.asarray(ea[0, 3]), np.asarray(eb[0, 11]))
    # right padding beyond the f-gram's length (the export's K-wide form) does not matter either
    lengths = jnp.asarray([3], jnp.int32)
    for pad in ([5, 9, 2, 0], [5, 9, 2, 17]):
        np.testing.assert_allclose(np.asarray(model.fgram_embeddings(jnp.asarray([pad], jnp.int32), lengths)),
                                   np.asarray(ea[0, 3:4]), rtol=1e-6)
