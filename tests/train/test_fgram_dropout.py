"""F-gram dropout (`fgrams.drop_rate`): which matched positions a training step feeds as
unmatched is a fresh, reproducible draw per step, the same whole or in microbatches, and the
forest then holds only the f-grams some kept position reads."""

import numpy as np

from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.microbatch import MicrobatchForests
from scone_jax.train.fgram_dropout import FgramDropout, keep_mask
from tests.forest.helpers import K, random_batch, random_fgram_set


def test_the_keep_mask_drops_the_rate_reproducibly_and_afresh_each_step(rng):
    positions = rng.choice(10**9, 200_000, replace=False)
    step, seed = int(rng.integers(10**6)), int(rng.integers(2**31))
    for rate in (0.1, 0.5):
        keep = keep_mask(positions, step, rate, seed)
        assert abs((~keep).mean() - rate) < 0.01
        assert (keep == keep_mask(positions, step, rate, seed)).all()  # a resume draws the same
        # another step or seed: independent draws (agreement of two rate-r masks: 1 - 2r(1 - r))
        for other in (
            keep_mask(positions, step + 1, rate, seed),
            keep_mask(positions, step, rate, seed + 1),
        ):
            assert abs((keep == other).mean() - (1 - 2 * rate * (1 - rate))) < 0.01
    assert keep_mask(positions, step, 0.0, seed).all()


def test_dropped_positions_are_unmatched_and_their_fgrams_leave_the_forest(rng):
    size, num_tokens = 50, 400
    tokens, lengths = random_fgram_set(rng, size)
    batch, tag_ids, tag_lengths = random_batch(rng, 8, num_tokens, size)
    batch["step"] = int(rng.integers(1000))
    batcher = FgramBatcher(tag_ids, tag_lengths, tokens, lengths, block=K)
    dropping = FgramDropout(batcher, rate=0.4, seed=int(rng.integers(2**31)))
    dropping.calibrate([batch])
    out = dropping(batch)

    keep = keep_mask(batch["positions"], batch["step"], 0.4, dropping.seed)
    ids = np.where(keep, tag_ids[batch["positions"]], -1)
    assert (~keep & (tag_ids[batch["positions"]] >= 0)).any()
    assert out["fgram_ids"].tolist() == ids.tolist()
    assert ((out["forest"].index >= 0) == (ids >= 0)).all()
    # the same batch with the kept tags only, through a batcher with no dropout: the same forest
    plain = FgramBatcher(tag_ids.copy(), tag_lengths, tokens, lengths, block=K)
    plain.capacity, plain.output_capacity = batcher.capacity, batcher.output_capacity
    plain.tag_ids[batch["positions"][~keep]] = -1
    expect = plain(batch)["forest"]
    for got, want in zip(out["forest"].arrays().values(), expect.arrays().values(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_backoff_feeds_a_dropped_position_its_fgrams_backoff_and_keeps_the_rest(rng):
    size, num_tokens = 50, 400
    tokens, lengths = random_fgram_set(rng, size)
    batch, tag_ids, tag_lengths = random_batch(rng, 8, num_tokens, size)
    batch["step"] = int(rng.integers(1000))
    backoff = np.where(rng.random(size) < 0.5, -1, rng.integers(0, size, size))  # or none
    batcher = FgramBatcher(tag_ids, tag_lengths, tokens, lengths, block=K, backoff_ids=backoff)
    dropping = FgramDropout(batcher, rate=0.4, seed=int(rng.integers(2**31)))
    dropping.calibrate([batch])
    out = dropping(batch)

    tags = tag_ids[batch["positions"]]
    keep = keep_mask(batch["positions"], batch["step"], 0.4, dropping.seed)
    want = np.where(keep | (tags < 0), tags, backoff[np.maximum(tags, 0)])
    assert (~keep & (tags >= 0) & (want >= 0)).any() and (~keep & (tags >= 0) & (want < 0)).any()
    assert out["fgram_ids"].tolist() == want.tolist()
    assert ((out["forest"].index >= 0) == (want >= 0)).all()
    fed = np.where(keep | (tags < 0), tag_lengths[batch["positions"]], lengths[np.maximum(want, 0)])
    assert np.isclose(out["fgram_stats"]["mean_match_length"], fed[want >= 0].mean())
    # the same batch tagged with `want` through a batcher with no dropout: the same forest
    plain = FgramBatcher(tag_ids.copy(), tag_lengths, tokens, lengths, block=K)
    plain.capacity, plain.output_capacity = batcher.capacity, batcher.output_capacity
    plain.tag_ids[batch["positions"]] = want
    expect = plain(batch)["forest"]
    for got, made in zip(out["forest"].arrays().values(), expect.arrays().values(), strict=True):
        np.testing.assert_array_equal(got, made)


def test_dropout_in_microbatches_drops_the_same_positions_as_the_whole_batch(rng):
    size, num_tokens, microbatches = 60, 500, 4
    tokens, lengths = random_fgram_set(rng, size)
    batch, tag_ids, tag_lengths = random_batch(rng, 8, num_tokens, size)
    batch["step"] = int(rng.integers(1000))
    seed = int(rng.integers(2**31))
    whole = FgramDropout(FgramBatcher(tag_ids, tag_lengths, tokens, lengths, block=K), 0.3, seed)
    split = FgramDropout(
        MicrobatchForests(FgramBatcher(tag_ids, tag_lengths, tokens, lengths, block=K), 4),
        0.3,
        seed,
    )
    for t in (whole, split):
        t.calibrate([batch])
    a, b = whole(batch), split(batch)
    assert a["fgram_ids"].tolist() == b["fgram_ids"].tolist()
    assert ((b["forest"].index >= 0) == (a["fgram_ids"] >= 0)).all()
    assert b["forest"].nodes.shape[0] == microbatches
