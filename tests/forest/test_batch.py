"""A host's forest buffers padded to another host's sizes, and its outputs moved to its slice of
the global outputs, still point every position at the same node."""

import numpy as np

from scone_jax.forest.batcher import FgramBatcher
from tests.forest.helpers import random_batch, random_fgram_set


def output_tokens(forest, index):
    """The token string each position's output node spells (None: no match)."""
    groups, width = forest.outputs.shape
    block = forest.nodes.shape[2]
    out = []
    for i in index.reshape(-1).tolist():
        if i < 0:
            out.append(None)
            continue
        g, r = divmod(i % (groups * width), width)
        n, c = divmod(int(forest.outputs[g, r]), block)
        path = forest.paths[g, n, c][forest.paths[g, n, c] >= 0]
        out.append(tuple(forest.nodes[g, n, path].tolist()))
    return out


def test_padding_and_global_outputs_keep_each_positions_fgram(rng):
    set_tokens, set_lengths = random_fgram_set(rng, 40, vocab=6)
    batch, tag_ids, tag_lengths = random_batch(rng, 3, 400, 40)
    forest = FgramBatcher(tag_ids, tag_lengths, set_tokens, set_lengths, block=6, groups=2)(batch)[
        "forest"
    ]
    want = output_tokens(forest, forest.index)
    assert any(w is not None for w in want) and any(w is None for w in want)
    blocks, width = (
        forest.nodes.shape[1] + int(rng.integers(1, 4)),
        forest.outputs.shape[1] + int(rng.integers(1, 9)),
    )
    padded = forest.padded(blocks, width)
    assert padded.nodes.shape[1] == blocks and padded.outputs.shape[1] == width
    assert output_tokens(padded, padded.index) == want
    moved = padded.on_global_outputs(process_index=2)
    matched = padded.index >= 0
    np.testing.assert_array_equal(
        moved.index[matched], padded.index[matched] + 2 * padded.outputs.size
    )
    np.testing.assert_array_equal(moved.index[~matched], -1)
