"""A batch's f-gram metrics from its parts (microbatches, processes) equal the metrics computed
over the whole batch at once, by brute force."""

import numpy as np

from scone_jax.forest.stats import combine_stats, combine_vectors, stats_vector


def brute_force(parts):
    """Each part: (ids [rows, T] with -1 unmatched, lengths, distinct count, nodes...)."""
    ids = np.concatenate([p["ids"].ravel() for p in parts])
    lengths = np.concatenate([p["lengths"].ravel() for p in parts])
    matched = ids >= 0
    return {
        "match_rate": matched.mean(),
        "distinct_ratio": sum(p["distinct"] for p in parts) / matched.sum(),
        "mean_match_length": lengths[matched].mean(),
    }


def random_parts(rng, count):
    parts = []
    for _ in range(count):
        shape = (int(rng.integers(1, 5)), int(rng.integers(4, 30)))
        ids = np.where(rng.random(shape) < rng.random(), rng.integers(0, 50, shape), -1)
        lengths = np.where(ids >= 0, rng.integers(2, 6, shape), 0)
        n = int((ids >= 0).sum())
        part = {"ids": ids, "lengths": lengths, "distinct": len(np.unique(ids[ids >= 0]))}
        part["stats"] = {
            "match_rate": n / ids.size,
            "distinct_ratio": part["distinct"] / n if n else 0.0,
            "mean_match_length": float(lengths[ids >= 0].mean()) if n else 0.0,
            "fgram_nodes": int(rng.integers(0, 100)),
            "fgram_positions": int(rng.integers(0, 100)),
            "fgram_outputs": int(rng.integers(0, 100)),
            "fgram_overflow": int(rng.integers(0, 2)),
        }
        parts.append(part)
    return parts


def test_parts_combine_to_the_whole_batchs_metrics(rng):
    for _ in range(20):
        parts = random_parts(rng, int(rng.integers(1, 6)))
        if not any((p["ids"] >= 0).any() for p in parts):
            continue
        stats = [p["stats"] for p in parts]
        sizes = [p["ids"].size for p in parts]
        matched = [int((p["ids"] >= 0).sum()) for p in parts]
        combined = combine_stats(stats, sizes, matched)
        for key, want in brute_force(parts).items():
            assert np.isclose(combined[key], want), key
        for key in ("fgram_nodes", "fgram_positions", "fgram_outputs"):
            assert combined[key] == sum(s[key] for s in stats)
        assert combined["fgram_overflow"] == max(s["fgram_overflow"] for s in stats)
        rows = np.stack([stats_vector(s, n, m) for s, n, m in zip(stats, sizes, matched)])
        assert combine_vectors(rows) == combined  # what processes exchange says the same
        assert combine_vectors(rows.sum(axis=0)[None]) == combined  # summed in the train step


def test_a_batch_with_no_match_has_zero_ratios():
    stats = {
        "match_rate": 0.0,
        "distinct_ratio": 0.0,
        "mean_match_length": 0.0,
        "fgram_nodes": 0,
        "fgram_positions": 8,
        "fgram_outputs": 8,
        "fgram_overflow": 0,
    }
    combined = combine_stats([stats, stats], [10, 12], [0, 0])
    assert combined["match_rate"] == combined["distinct_ratio"] == 0.0
    assert combined["fgram_positions"] == 16
