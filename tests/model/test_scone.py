"""The SCONE combination: dedup == plain, the prefix forest == F on each f-gram alone, no matches ==
baseline, F ignores the context."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scone_jax.config import FgramConfig, ModelConfig
from scone_jax.data.fgram_batches import FgramBatcher, forest_layout, pad_buffers, prefix_forest
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel
from scone_jax.train.step import model_inputs

VOCAB, K, T = 40, 4, 16
BACKBONE = {
    "gpt2": ModelConfig(family="gpt2", d_model=32, n_layers=2, n_heads=2, max_seq_len=T),
    "llama": ModelConfig(family="llama", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=T),
}


def random_fgram_set(rng, size, vocab=VOCAB):
    """Random f-grams over a small vocabulary, so that many share prefixes."""
    lengths = rng.integers(2, K + 1, size)
    tokens = np.full((size, K), -1, np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, vocab, n)
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


@pytest.mark.parametrize("family, combine, capacity, groups, block", [  # capacity 1 block: overflow
    ("gpt2", "replace", 64, 1, 8), ("gpt2", "add", 1, 3, K), ("llama", "replace", 1, 1, 5), ("llama", "add", 64, 2, 16)])
def test_dedup_and_plain_give_the_same_loss_and_gradients(family, combine, capacity, groups, block, rng):
    fcfg = FgramConfig(enabled=True, max_n=K, combine=combine, d_model=24 if family == "gpt2" else 0)
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    set_tokens, set_lengths = random_fgram_set(rng, 30, vocab=6)
    batch, tag_ids, tag_lengths = random_batch(rng, 4, 500, 30)
    sizes = dict(block=block, capacity=capacity, output_capacity=capacity * block, groups=groups)
    dedup = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, **sizes)(batch)
    plain = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, dedup=False, **sizes)(batch)
    matched_ids = np.unique(dedup["fgram_ids"][dedup["fgram_ids"] >= 0])
    assert dedup["fgram_stats"]["fgram_nodes"] < set_lengths[matched_ids].sum()  # prefixes were shared
    assert plain["fgram_stats"]["fgram_nodes"] == set_lengths[plain["fgram_ids"][plain["fgram_ids"] >= 0]].sum()
    assert (dedup["fgram_stats"]["fgram_overflow"] > 0) == (capacity == 1)
    assert dedup["fgram_nodes"].shape[0] == groups
    (la, ga), (lb, gb) = loss_and_grads(model, dedup), loss_and_grads(model, plain)
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    fgram_grads = jax.tree.leaves(ga["fgram"])
    assert any(np.abs(np.asarray(g)).max() > 0 for g in fgram_grads)  # the f-gram path is trained
    # a host padding its buffers to another host's sizes (pad_buffers) computes the same loss
    padded = pad_buffers(dedup, dedup["fgram_nodes"].shape[1] + 2, dedup["fgram_outputs"].shape[1] + 3)
    np.testing.assert_allclose(loss_and_grads(model, padded)[0], la, rtol=1e-6)


def trie_of(forest):
    trie = {}
    for path in forest.paths:
        node = trie
        for a in path[path >= 0]:
            node = node.setdefault(int(a), {})
    return trie


def size_of(children):
    return sum(1 + size_of(c) for c in children.values())


def copies_needed(forest, block):
    """Brute force: walk each tree (a first token's nodes) depth-first from a nested dict; a tree
    that fits a block needs no copies; in a larger one, a block that fills up is followed by one
    that starts with the copied ancestors of its first node."""
    total = 0
    for root, children in trie_of(forest).items():
        if 1 + size_of(children) <= block:
            continue
        used = 0

        def visit(node, kids, depth):
            nonlocal total, used
            if used == block:
                total, used = total + depth, depth
            used += 1
            for child in sorted(kids):
                visit(child, kids[child], depth + 1)

        visit(root, children, 0)
    return total


def greedy_blocks_and_copies(forest, block):
    """Brute force: the blocks and copies of a depth-first walk over all trees at once."""
    blocks, used, copies = 0, block, 0

    def visit(children, depth):
        nonlocal blocks, used, copies
        for child in sorted(children):
            if used == block:
                blocks, used, copies = blocks + 1, depth, copies + depth
            used += 1
            visit(children[child], depth + 1)

    visit(trie_of(forest), 0)
    return blocks, copies


@pytest.mark.parametrize("groups, block", [(1, K), (2, 7), (5, 32)])
def test_prefix_forest_has_one_node_per_distinct_prefix(groups, block, rng):
    """Against a brute-force trie: node strings are exactly the distinct prefixes, each row's node
    spells the row, paths are the node's ancestors within the node's block, ancestors are
    copied only where a tree larger than a block is cut (or a walk over all trees at once cuts
    one), blocks are packed at least as tightly as that walk and dealt evenly to the groups."""
    set_tokens, set_lengths = random_fgram_set(rng, int(rng.integers(1, 200)), vocab=int(rng.integers(2, 12)))
    forest = prefix_forest(set_tokens, set_lengths, share_prefixes=True)
    spelled = [tuple(forest.tokens[p[p >= 0]]) for p in forest.paths]
    expected = {tuple(row[:m]) for row, n in zip(set_tokens.tolist(), set_lengths) for m in range(1, n + 1)}
    assert len(spelled) == len(set(spelled)) and set(spelled) == expected
    for row, n, node in zip(set_tokens, set_lengths, forest.node_of_row):
        assert spelled[node] == tuple(row[:n])
    depth = (forest.paths >= 0).sum(1) - 1
    for node, path in enumerate(forest.paths):  # each ancestor spells the node's prefix of its depth
        assert path[depth[node]] == node
        assert all(spelled[path[m]] == spelled[node][:m + 1] for m in range(depth[node]))
    batcher = FgramBatcher(np.arange(len(set_tokens)), set_lengths, set_tokens, set_lengths, block=block,
                           groups=groups)
    out = batcher({"positions": np.arange(len(set_tokens))[None]})
    paths, nodes = out["fgram_paths"], out["fgram_nodes"]
    assert paths.shape[0] == groups and paths.shape[2] == block
    for g, n, c in np.ndindex(paths.shape[:3]):  # every slot (copies too) spells a prefix from its block
        path = paths[g, n, c][paths[g, n, c] >= 0]
        assert path[-1] == c and np.all(path < block)
        assert len(path) == 1 or tuple(nodes[g, n, path]) in expected
    outputs = out["fgram_outputs"]
    assert outputs.shape[0] == groups
    for i, index in enumerate(out["fgram_index"][0]):  # each position's output node spells its f-gram
        g, r = divmod(int(index), outputs.shape[1])
        n, c = divmod(int(outputs[g, r]), block)
        path = paths[g, n, c][paths[g, n, c] >= 0]
        assert nodes[g, n, path].tolist() == set_tokens[i, :set_lengths[i]].tolist()
    assert len(np.unique(out["fgram_index"])) == len(set_tokens)  # one output per row
    layout = forest_layout(forest, groups, block)
    group, rank = np.divmod(layout.output, layout.outputs.shape[1])
    shifted = forest_layout(replace(forest, tokens=forest.tokens + 1), groups, block)  # padding: token 0
    real = np.argwhere(shifted.tokens > 0)  # the slots of nodes and of their copies
    greedy_blocks, greedy_copies = greedy_blocks_and_copies(forest, block)
    assert len(real) - len(forest.tokens) in (copies_needed(forest, block), greedy_copies)
    used = np.unique(real[:, 0] * layout.tokens.shape[1] + real[:, 1])
    assert -(-len(real) // block) <= len(used) <= greedy_blocks
    per_group = np.bincount(used // layout.tokens.shape[1], minlength=groups)
    assert per_group.max() - per_group.min() <= 1 and per_group.max() == layout.need


def test_mostly_large_trees_are_laid_out_as_one_stream_of_full_blocks(rng):
    """With trees larger than a block, packing the pieces of each tree can leave room unused; the
    layout then cuts the whole depth-first order into full blocks, exactly as the brute-force
    walk over all trees does, whenever that needs fewer blocks."""
    streams = 0
    for _ in range(60):  # each draw reaches the stream case with p ~ 0.2
        set_tokens, set_lengths = random_fgram_set(rng, 80, vocab=6)
        forest = prefix_forest(set_tokens, set_lengths, share_prefixes=True)
        layout = forest_layout(replace(forest, tokens=forest.tokens + 1), 1, 7)  # padding: token 0
        greedy_blocks, greedy_copies = greedy_blocks_and_copies(forest, 7)
        assert layout.need <= greedy_blocks
        copies = int((layout.tokens > 0).sum()) - len(forest.tokens)
        if copies == greedy_copies != copies_needed(forest, 7):
            assert layout.need == greedy_blocks
            streams += 1
    assert streams > 0  # the draws do reach that case


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forest_equals_the_fgram_model_on_each_fgram_alone(family, rng):
    """What training computes (the forest) equals what export computes (each f-gram padded to K)."""
    fcfg = FgramConfig(enabled=True, max_n=K, combine="replace", d_model=24 if family == "gpt2" else 0)
    model = SconeModel(BACKBONE[family], fcfg, VOCAB, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    set_tokens, set_lengths = random_fgram_set(rng, 60, vocab=5)
    out = FgramBatcher(np.arange(60), set_lengths, set_tokens, set_lengths, block=6, groups=2)(
        {"positions": np.arange(60)[None]})
    table = model.backbone.embed_table[...]
    forest = model.fgram.forest(jnp.take(table, jnp.asarray(out["fgram_nodes"]), axis=0),
                                jnp.asarray(out["fgram_paths"]), jnp.asarray(out["fgram_outputs"]))
    rows = np.asarray(forest).reshape(-1, forest.shape[-1])[out["fgram_index"][0]]
    alone = model.fgram_embeddings(jnp.asarray(set_tokens, jnp.int32), jnp.asarray(set_lengths, jnp.int32))
    np.testing.assert_allclose(rows, np.asarray(alone), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_no_matches_is_exactly_the_baseline(family, rng):
    seed = int(rng.integers(1 << 30))
    scone = SconeModel(BACKBONE[family], FgramConfig(enabled=True, max_n=K, combine="replace"), VOCAB, rngs=nnx.Rngs(seed))
    base = Transformer(BACKBONE[family], VOCAB, rngs=nnx.Rngs(seed))
    set_tokens, set_lengths = random_fgram_set(rng, 5)
    batch, tag_ids, tag_lengths = random_batch(rng, 2, 300, 5, match_prob=0.0)
    batch = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, block=K)(batch)
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
    layout = forest_layout(prefix_forest(fgram, np.array([3]), share_prefixes=True), 1, K)  # 5, 5 9, 5 9 2
    index_a[0, 3] = index_b[0, 11] = layout.output[0]
    buffers = [jnp.asarray(x) for x in (layout.tokens, layout.paths, layout.outputs)]
    ea = model.input_embeddings(jnp.asarray(tokens_a), jnp.asarray(index_a), *buffers)
    eb = model.input_embeddings(jnp.asarray(tokens_b), jnp.asarray(index_b), *buffers)
    np.testing.assert_array_equal(np.asarray(ea[0, 3]), np.asarray(eb[0, 11]))
    # right padding beyond the f-gram's length (the export's K-wide form) does not matter either
    lengths = jnp.asarray([3], jnp.int32)
    for pad in ([5, 9, 2, 0], [5, 9, 2, 17]):
        np.testing.assert_allclose(np.asarray(model.fgram_embeddings(jnp.asarray([pad], jnp.int32), lengths)),
                                   np.asarray(ea[0, 3:4]), rtol=1e-5, atol=1e-6)
