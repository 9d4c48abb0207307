"""The per-step f-gram metrics of a batch made of parts (microbatches, or the rows of each
process): the whole batch's ratios, per position and per matched position, not a mean of the
parts' means."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RATIOS_PER_MATCH = ("distinct_ratio", "mean_match_length")
SUMMED = ("fgram_nodes", "fgram_positions", "fgram_outputs")


def combine_stats(
    stats: Sequence[Mapping[str, float]], positions: Sequence[int], matched: Sequence[int]
) -> dict[str, float]:
    """The metrics of the parts together; part i has `positions[i]` positions (matched or not),
    `matched[i]` of them matched."""
    parts = zip(stats, positions, matched, strict=True)
    return combine_vectors(np.stack([stats_vector(s, n, m) for s, n, m in parts]))


def stats_vector(stats: Mapping[str, float], positions: int, matched: int) -> np.ndarray:
    """One part as whole counts (what processes exchange, exactly, as int32): its positions,
    matched positions, each per-match ratio times the matches (distinct f-grams, summed match
    lengths), the summed counts and the overflow flag."""
    per_match = [round(stats[k] * matched) for k in RATIOS_PER_MATCH]
    summed = [stats[k] for k in SUMMED]
    return np.array([positions, matched, *per_match, *summed, stats["fgram_overflow"]], np.int64)


def combine_vectors(rows: np.ndarray) -> dict[str, float]:
    """The metrics of parts given as `stats_vector` rows: sums, and ratios of the sums. Only
    the rows' sum is read, so a sum made elsewhere (inside the train step) is one row."""
    total = np.asarray(rows, np.int64).sum(axis=0).tolist()
    positions, matched = total[0], total[1]
    per_match = total[2 : 2 + len(RATIOS_PER_MATCH)]
    summed = total[2 + len(RATIOS_PER_MATCH) : -1]
    return {
        "match_rate": matched / positions if positions else 0.0,
        **{k: v / matched if matched else 0.0 for k, v in zip(RATIOS_PER_MATCH, per_match)},
        **dict(zip(SUMMED, summed, strict=True)),
        "fgram_overflow": int(total[-1] > 0),  # whether any part overflowed
    }
