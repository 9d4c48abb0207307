"""The prefix forest and its block layout against brute force: one node per distinct prefix,
paths inside their block, copies only where a tree is cut, blocks packed and dealt evenly."""

from dataclasses import replace

import numpy as np
import pytest

from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.layout import forest_layout
from scone_jax.forest.prefix import prefix_forest
from tests.forest.helpers import K, random_fgram_set


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
    set_tokens, set_lengths = random_fgram_set(
        rng, int(rng.integers(1, 200)), vocab=int(rng.integers(2, 12))
    )
    forest = prefix_forest(set_tokens, set_lengths, share_prefixes=True)
    spelled = [tuple(forest.tokens[p[p >= 0]]) for p in forest.paths]
    expected = {
        tuple(row[:m]) for row, n in zip(set_tokens.tolist(), set_lengths) for m in range(1, n + 1)
    }
    assert len(spelled) == len(set(spelled)) and set(spelled) == expected
    for row, n, node in zip(set_tokens, set_lengths, forest.node_of_row):
        assert spelled[node] == tuple(row[:n])
    depth = (forest.paths >= 0).sum(1) - 1
    for node, path in enumerate(
        forest.paths
    ):  # each ancestor spells the node's prefix of its depth
        assert path[depth[node]] == node
        assert all(spelled[path[m]] == spelled[node][: m + 1] for m in range(depth[node]))
    batcher = FgramBatcher(
        np.arange(len(set_tokens)), set_lengths, set_tokens, set_lengths, block=block, groups=groups
    )
    out = batcher({"positions": np.arange(len(set_tokens))[None]})
    paths, nodes = out["forest"].paths, out["forest"].nodes
    assert paths.shape[0] == groups and paths.shape[2] == block
    for g, n, c in np.ndindex(
        paths.shape[:3]
    ):  # every slot (copies too) spells a prefix from its block
        path = paths[g, n, c][paths[g, n, c] >= 0]
        assert path[-1] == c and np.all(path < block)
        assert len(path) == 1 or tuple(nodes[g, n, path]) in expected
    outputs = out["forest"].outputs
    assert outputs.shape[0] == groups
    for i, index in enumerate(
        out["forest"].index[0]
    ):  # each position's output node spells its f-gram
        g, r = divmod(int(index), outputs.shape[1])
        n, c = divmod(int(outputs[g, r]), block)
        path = paths[g, n, c][paths[g, n, c] >= 0]
        assert nodes[g, n, path].tolist() == set_tokens[i, : set_lengths[i]].tolist()
    assert len(np.unique(out["forest"].index)) == len(set_tokens)  # one output per row
    layout = forest_layout(forest, groups, block)
    group, rank = np.divmod(layout.output, layout.outputs.shape[1])
    shifted = forest_layout(
        replace(forest, tokens=forest.tokens + 1), groups, block
    )  # padding: token 0
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
