"""The SCONE combination: dedup == plain, the prefix forest == F on each f-gram alone, no matches ==
baseline, F ignores the context."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scone_jax.config import FgramConfig, ModelConfig
from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.layout import forest_layout
from scone_jax.forest.prefix import prefix_forest
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel
from tests.forest.helpers import VOCAB, K, T, random_batch, random_fgram_set
from tests.model.reference import fgram_alone

BACKBONE = {
    "gpt2": ModelConfig(family="gpt2", d_model=32, n_layers=2, n_heads=2, max_seq_len=T),
    "llama": ModelConfig(
        family="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=T
    ),
}


def loss_and_grads(model, batch):
    graphdef, params = nnx.split(model)

    inputs = jax.tree.map(jnp.asarray, batch["forest"].arrays())

    def loss(p):
        m = nnx.merge(graphdef, p)
        logits = m(jnp.asarray(batch["inputs"]), **inputs)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.asarray(batch["targets"])
        ).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize(
    "family, combine, capacity, groups, block",
    [  # capacity 1 block: overflow
        ("gpt2", "replace", 64, 1, 8),
        ("gpt2", "add", 1, 3, K),
        ("llama", "replace", 1, 1, 5),
        ("llama", "add", 64, 2, 16),
    ],
)
def test_dedup_and_plain_give_the_same_loss_and_gradients(
    family, combine, capacity, groups, block, rng
):
    fcfg = FgramConfig(
        enabled=True, max_n=K, combine=combine, d_model=24 if family == "gpt2" else 0
    )
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    set_tokens, set_lengths = random_fgram_set(rng, 30, vocab=6)
    batch, tag_ids, tag_lengths = random_batch(rng, 4, 500, 30)
    sizes = dict(block=block, capacity=capacity, output_capacity=capacity * block, groups=groups)
    dedup = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, **sizes)(batch)
    plain = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, dedup=False, **sizes)(batch)
    matched_ids = np.unique(dedup["fgram_ids"][dedup["fgram_ids"] >= 0])
    assert (
        dedup["fgram_stats"]["fgram_nodes"] < set_lengths[matched_ids].sum()
    )  # prefixes were shared
    assert (
        plain["fgram_stats"]["fgram_nodes"]
        == set_lengths[plain["fgram_ids"][plain["fgram_ids"] >= 0]].sum()
    )
    assert (dedup["fgram_stats"]["fgram_overflow"] > 0) == (capacity == 1)
    assert dedup["forest"].nodes.shape[0] == groups
    (la, ga), (lb, gb) = loss_and_grads(model, dedup), loss_and_grads(model, plain)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    fgram_grads = jax.tree.leaves(ga["fgram"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in fgram_grads)  # the f-gram path is trained
    # a host padding its buffers to another host's sizes (ForestBatch.padded) computes the same loss
    forest = dedup["forest"]
    padded = {
        **dedup,
        "forest": forest.padded(forest.nodes.shape[1] + 2, forest.outputs.shape[1] + 3),
    }
    np.testing.assert_allclose(loss_and_grads(model, padded)[0], la, rtol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forest_equals_the_fgram_model_on_each_fgram_alone(family, rng):
    """What training computes (the forest) equals what export computes (each f-gram padded to K)."""
    fcfg = FgramConfig(
        enabled=True, max_n=K, combine="replace", d_model=24 if family == "gpt2" else 0
    )
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    set_tokens, set_lengths = random_fgram_set(rng, 60, vocab=5)
    out = FgramBatcher(np.arange(60), set_lengths, set_tokens, set_lengths, block=6, groups=2)(
        {"positions": np.arange(60)[None]}
    )
    table = model.backbone.embed_table[...]
    forest = model.fgram.forest(
        jnp.take(table, jnp.asarray(out["forest"].nodes), axis=0),
        jnp.asarray(out["forest"].paths),
        jnp.asarray(out["forest"].outputs),
    )
    rows = np.asarray(forest).reshape(-1, forest.shape[-1])[out["forest"].index[0]]
    alone = fgram_alone(
        model, jnp.asarray(set_tokens, jnp.int32), jnp.asarray(set_lengths, jnp.int32)
    )
    np.testing.assert_allclose(rows, np.asarray(alone), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_no_matches_is_exactly_the_baseline(family, rng):
    seed = int(rng.integers(1 << 30))
    scone = SconeModel(
        BACKBONE[family],
        FgramConfig(enabled=True, max_n=K, combine="replace"),
        VOCAB,
        rngs=nnx.Rngs(seed),
    )
    base = Transformer(BACKBONE[family], VOCAB, rngs=nnx.Rngs(seed))
    set_tokens, set_lengths = random_fgram_set(rng, 5)
    batch, tag_ids, tag_lengths = random_batch(rng, 2, 300, 5, match_prob=0.0)
    batch = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, block=K)(batch)
    ls, _ = loss_and_grads(scone, batch)
    graphdef, params = nnx.split(base)

    @jax.jit
    def base_loss(p):
        logits = nnx.merge(graphdef, p)(jnp.asarray(batch["inputs"]))
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.asarray(batch["targets"])
        ).mean()

    assert float(ls) == float(base_loss(params))


def test_fgram_embedding_does_not_depend_on_the_window(rng):
    """The same f-gram in two different windows gets an identical embedding: the table is
    possible."""
    model = SconeModel(
        BACKBONE["gpt2"],
        FgramConfig(enabled=True, max_n=K, combine="replace"),
        VOCAB,
        rngs=nnx.Rngs(0),
    )
    fgram = np.array([[5, 9, 2, -1]])
    tokens_a = rng.integers(0, VOCAB, (1, T)).astype(np.int32)
    tokens_b = rng.integers(0, VOCAB, (1, T)).astype(np.int32)
    index_a = np.full((1, T), -1, np.int32)
    index_b = index_a.copy()
    layout = forest_layout(
        prefix_forest(fgram, np.array([3]), share_prefixes=True), 1, K
    )  # 5, 5 9, 5 9 2
    index_a[0, 3] = index_b[0, 11] = layout.output[0]
    buffers = [jnp.asarray(x) for x in (layout.tokens, layout.paths, layout.outputs)]
    ea = model.input_embeddings(jnp.asarray(tokens_a), jnp.asarray(index_a), *buffers)
    eb = model.input_embeddings(jnp.asarray(tokens_b), jnp.asarray(index_b), *buffers)
    np.testing.assert_array_equal(np.asarray(ea[0, 3]), np.asarray(eb[0, 11]))
    # right padding beyond the f-gram's length (the export's K-wide form) does not matter either
    lengths = jnp.asarray([3], jnp.int32)
    for pad in ([5, 9, 2, 0], [5, 9, 2, 17]):
        np.testing.assert_allclose(
            np.asarray(fgram_alone(model, jnp.asarray([pad], jnp.int32), lengths)),
            np.asarray(ea[0, 3:4]),
            rtol=1e-5,
            atol=1e-6,
        )


def brute_suffix_parent(set_tokens, set_lengths) -> np.ndarray:
    """Each f-gram's longest proper suffix of 2 tokens or more among the set's f-grams (-1 none),
    by comparing token tuples."""
    spelled = [tuple(t[:n]) for t, n in zip(set_tokens.tolist(), set_lengths.tolist())]
    where = {fgram: i for i, fgram in enumerate(spelled)}
    return np.array(
        [next((where[f[j:]] for j in range(1, len(f) - 1) if f[j:] in where), -1) for f in spelled]
    )


@pytest.mark.parametrize("family, combine", [("gpt2", "add"), ("llama", "replace")])
def test_suffix_rows_sum_the_fgram_model_over_each_suffix_in_the_set(family, combine, rng):
    """fgrams.suffix_rows: a matched position's f-gram embedding is F(w) plus F of each of w's
    suffixes in the set, checked against F run on each f-gram alone; with and without dedup,
    which also agree on every gradient."""
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    fcfg = FgramConfig(enabled=True, max_n=K, combine=combine, suffix_rows=True)
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(seed))
    set_tokens, set_lengths = random_fgram_set(rng, 40, vocab=3)  # many suffixes in the set
    parent = brute_suffix_parent(set_tokens, set_lengths)
    batch, tag_ids, tag_lengths = random_batch(rng, 3, 400, 40)
    sizes = dict(block=8, groups=2, suffix_parent=parent)
    alone = np.asarray(
        fgram_alone(model, jnp.asarray(set_tokens, jnp.int32), jnp.asarray(set_lengths, jnp.int32))
    )
    tokens = np.asarray(model.backbone.embed(jnp.asarray(batch["inputs"])))
    want = tokens.copy()
    longer_chains = 0
    for row, t in zip(*np.nonzero(tag_ids[batch["positions"]] >= 0)):
        link, total, chain = int(tag_ids[batch["positions"][row, t]]), 0.0, 0
        while link >= 0:
            total, link, chain = total + alone[link], int(parent[link]), chain + 1
        want[row, t] = total if combine == "replace" else tokens[row, t] + total
        longer_chains += chain > 1
    assert longer_chains > 10
    results = []
    for dedup in (True, False):
        out = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, dedup=dedup, **sizes)(
            batch
        )
        arrays = jax.tree.map(jnp.asarray, out["forest"].arrays())
        got = model.input_embeddings(jnp.asarray(batch["inputs"]), **arrays)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        results.append(loss_and_grads(model, out))
    (la, ga), (lb, gb) = results
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
