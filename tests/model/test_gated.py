"""The gated combination (the default): a SCONE model starts as its baseline, and the gate is
what mixes F in: T(s_i) + g * F(w) at matched positions, T(s_i) elsewhere."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scone_jax.config import FgramConfig
from scone_jax.forest.batcher import FgramBatcher
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel
from tests.forest.helpers import VOCAB, K, random_batch, random_fgram_set
from tests.model.reference import fgram_alone
from tests.model.test_scone import BACKBONE


def scone_batch(rng):
    set_tokens, set_lengths = random_fgram_set(rng, 30, vocab=6)
    batch, tag_ids, tag_lengths = random_batch(rng, 3, 400, 30)
    batcher = FgramBatcher(
        tag_ids, tag_lengths, set_tokens, set_lengths, block=8, capacity=64, output_capacity=64 * 8
    )
    return batcher(batch), set_tokens, set_lengths


def loss_fn(graphdef, batch):
    inputs = jax.tree.map(jnp.asarray, batch["forest"].arrays())

    def loss(params):
        logits = nnx.merge(graphdef, params)(jnp.asarray(batch["inputs"]), **inputs)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.asarray(batch["targets"])
        ).mean()

    return loss


@pytest.mark.parametrize("family, width", [("gpt2", 0), ("llama", 0), ("gpt2", 24)])
def test_a_gated_model_starts_as_its_baseline(family, width, rng):
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    scone = SconeModel(
        BACKBONE[family],
        FgramConfig(enabled=True, max_n=K, combine="gated", d_model=width),
        VOCAB,
        rngs=nnx.Rngs(seed),
    )
    baseline = Transformer(BACKBONE[family], VOCAB, rngs=nnx.Rngs(seed))
    batch, _, _ = scone_batch(rng)
    assert (batch["forest"].index >= 0).mean() > 0.3
    inputs = jax.tree.map(jnp.asarray, batch["forest"].arrays())
    np.testing.assert_array_equal(
        np.asarray(scone(jnp.asarray(batch["inputs"]), **inputs)),
        np.asarray(baseline(jnp.asarray(batch["inputs"]))),
    )
    # at zero gain only the gate learns on the first step; F's own weights start moving after it
    graphdef, params = nnx.split(scone)
    grads = jax.grad(loss_fn(graphdef, batch))(params)
    assert float(jnp.abs(grads["fgram"]["output_gate"][...]).max()) > 0
    others = [
        g
        for path, g in jax.tree_util.tree_leaves_with_path(grads["fgram"])
        if "output_gate" not in jax.tree_util.keystr(path)
    ]
    assert others and all(float(jnp.abs(g).max()) == 0 for g in others)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_input_is_the_token_plus_the_gated_fgram_embedding(family, rng):
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    model = SconeModel(
        BACKBONE[family],
        FgramConfig(enabled=True, max_n=K, combine="gated"),
        VOCAB,
        rngs=nnx.Rngs(seed),
    )
    gate = rng.normal(size=BACKBONE[family].d_model).astype(np.float32)
    model.fgram.output_gate[...] = jnp.asarray(gate)
    batch, set_tokens, set_lengths = scone_batch(rng)
    forest = {k: jnp.asarray(v) for k, v in batch["forest"].arrays().items()}
    got = np.asarray(model.input_embeddings(jnp.asarray(batch["inputs"]), **forest))
    tokens = np.asarray(model.backbone.embed(jnp.asarray(batch["inputs"])))
    ids = batch["fgram_ids"]
    matched = ids >= 0
    # each matched f-gram alone through F (its plain call), times the gate, plus T(s_i)
    alone = np.asarray(
        fgram_alone(
            model,
            jnp.asarray(np.maximum(set_tokens[ids[matched]], 0), jnp.int32),
            jnp.asarray(set_lengths[ids[matched]], jnp.int32),
        )
    )
    np.testing.assert_allclose(got[~matched], tokens[~matched], rtol=0, atol=0)
    np.testing.assert_allclose(got[matched], tokens[matched] + alone, rtol=1e-4, atol=1e-5)
    assert np.abs(alone).mean() > 0.1  # the gate is on: F contributes


def test_a_detached_table_takes_gradients_from_the_backbones_path_alone(rng):
    """`fgrams.detach_table`: the same loss, and T's gradient is what it would be if F read a
    frozen copy of T; without it the f-gram path's gradient reaches T too (the paper's rule)."""
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    batch, _, _ = scone_batch(rng)
    family = "llama"  # the rule lives in SconeModel, the same for every family
    gate = jnp.asarray(rng.normal(size=BACKBONE[family].d_model).astype(np.float32))
    grads, losses = {}, {}
    for detach in (False, True):
        model = SconeModel(
            BACKBONE[family],
            FgramConfig(enabled=True, max_n=K, combine="gated", detach_table=detach),
            VOCAB,
            rngs=nnx.Rngs(seed),
        )
        model.fgram.output_gate[...] = gate
        graphdef, params = nnx.split(model)
        losses[detach], grads[detach] = jax.value_and_grad(loss_fn(graphdef, batch))(params)

    forest = {k: jnp.asarray(v) for k, v in batch["forest"].arrays().items()}
    inputs, targets = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])

    def frozen_copy_loss(params, table):
        m = nnx.merge(graphdef, params)
        x = m.backbone.embed(inputs)
        nodes = jnp.take(table, forest["fgram_nodes"], axis=0)
        out = m.fgram.forest(nodes, forest["fgram_paths"], forest["fgram_outputs"])
        rows = out.reshape(-1, out.shape[-1]).astype(x.dtype)
        index = forest["fgram_index"]
        x = x + jnp.where((index >= 0)[..., None], jnp.take(rows, jnp.maximum(index, 0), 0), 0)
        logits = m.backbone.logits(m.backbone.hidden(x))
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    table = params["backbone"]["embed_table"][...]
    want = jax.grad(frozen_copy_loss)(params, table)
    assert float(losses[True]) == pytest.approx(float(losses[False]), rel=1e-6)
    for got, ref in zip(jax.tree.leaves(grads[True]), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-7)
    t_paper = np.asarray(grads[False]["backbone"]["embed_table"][...])
    t_detached = np.asarray(grads[True]["backbone"]["embed_table"][...])
    assert np.abs(t_paper - t_detached).max() > 1e-4 * np.abs(t_detached).max()


def test_embedding_dropout_zeros_features_of_the_fgram_part_in_training_only(rng):
    """`fgrams.embed_drop_rate`: with a key, a share `rate` of the f-gram part's features is
    zeroed and the rest scaled by 1 / (1 - rate); T(s_i) and unmatched positions are untouched,
    and without a key (evaluation, export) the input is the plain gated one."""
    seed = int(rng.integers(1 << 30))
    print(f"seed {seed}")
    rate = 0.3
    model = SconeModel(
        BACKBONE["llama"],
        FgramConfig(enabled=True, max_n=K, combine="gated", embed_drop_rate=rate),
        VOCAB,
        rngs=nnx.Rngs(seed),
    )
    model.fgram.output_gate[...] = jnp.asarray(
        rng.normal(size=BACKBONE["llama"].d_model).astype(np.float32)
    )
    batch, _, _ = scone_batch(rng)
    forest = {k: jnp.asarray(v) for k, v in batch["forest"].arrays().items()}
    tokens = jnp.asarray(batch["inputs"])
    token_rows = np.asarray(model.backbone.embed(tokens))
    plain = np.asarray(model.input_embeddings(tokens, **forest)) - token_rows
    key = jax.random.key(seed)
    noisy = np.asarray(model.input_embeddings(tokens, **forest, dropout_key=key)) - token_rows
    matched = batch["fgram_ids"] >= 0
    np.testing.assert_array_equal(noisy[~matched], 0)
    kept = noisy[matched] != 0
    # the dropped share, pooled over 16 keys (one batch holds only ~1K matched features), within
    # 5 binomial standard deviations of the rate
    dropped = [
        np.asarray(model.input_embeddings(tokens, **forest, dropout_key=jax.random.fold_in(key, i)))
        for i in range(2, 18)
    ]
    share = np.mean([(d - token_rows)[matched] == 0 for d in dropped])
    draws = 16 * kept.size
    assert abs(share - rate) < 5 * np.sqrt(rate * (1 - rate) / draws), (share, draws)
    np.testing.assert_allclose(
        noisy[matched][kept], plain[matched][kept] / (1 - rate), rtol=1e-5, atol=1e-6
    )
    again = np.asarray(model.input_embeddings(tokens, **forest, dropout_key=key)) - token_rows
    np.testing.assert_array_equal(again, noisy)  # a key draws one mask
    other = model.input_embeddings(tokens, **forest, dropout_key=jax.random.fold_in(key, 1))
    assert not np.array_equal(np.asarray(other) - token_rows, noisy)
