"""A batch's forests per microbatch: each microbatch's positions reach the f-gram model through
its own forest, and the logged statistics are the whole batch's (per matched position)."""

import numpy as np

from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.microbatch import MicrobatchForests
from tests.forest.helpers import K, random_batch, random_fgram_set


def test_microbatch_forests_cover_every_position_and_report_the_whole_batchs_statistics(rng):
    size, num_tokens, microbatches = 60, 500, 4
    tokens, lengths = random_fgram_set(rng, size)
    batch, tag_ids, _ = random_batch(rng, 8, num_tokens, size, match_prob=0.6)
    # uneven match lengths and rates across microbatches, so a mean of means would be wrong
    tag_lengths = np.where(tag_ids >= 0, rng.integers(1, K + 1, num_tokens), 0)
    tag_ids[batch["positions"][1::microbatches]] = -1
    batcher = FgramBatcher(tag_ids, tag_lengths, tokens, lengths, block=K)
    forests = MicrobatchForests(batcher, microbatches)
    forests.calibrate([batch])
    out = forests(batch)

    ids = tag_ids[batch["positions"]]
    assert out["fgram_ids"].tolist() == ids.tolist()
    matched = ids >= 0
    stats = out["fgram_stats"]
    assert np.isclose(stats["match_rate"], matched.mean())
    assert np.isclose(stats["mean_match_length"], tag_lengths[batch["positions"]][matched].mean())
    distinct = sum(
        len(np.unique(ids[m::microbatches][matched[m::microbatches]])) for m in range(microbatches)
    )
    assert np.isclose(stats["distinct_ratio"], distinct / matched.sum())
    forest = out["forest"]
    assert forest.nodes.shape[0] == microbatches
    assert ((forest.index >= 0) == matched).all()  # every matched position has an output slot
    assert stats["fgram_overflow"] == 0
