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
    matched_all = float(np.sum(matched))
    weights = np.asarray(matched, np.float64) / matched_all if matched_all else np.zeros(len(stats))
    return {
        "match_rate": matched_all / float(np.sum(positions)) if np.sum(positions) else 0.0,
        **{k: float(np.dot(weights, [s[k] for s in stats])) for k in RATIOS_PER_MATCH},
        **{k: int(sum(s[k] for s in stats)) for k in SUMMED},
        "fgram_overflow": int(max(s["fgram_overflow"] for s in stats)),
    }


def stats_vector(stats: Mapping[str, float], positions: int, matched: int) -> np.ndarray:
    """One part as whole counts (what processes exchange, exactly, as int32): its positions,
    matched positions, each per-match ratio times the matches (distinct f-grams, summed match
    lengths), the summed counts and the overflow flag."""
    per_match = [round(stats[k] * matched) for k in RATIOS_PER_MATCH]
    summed = [stats[k] for k in SUMMED]
    return np.array([positions, matched, *per_match, *summed, stats["fgram_overflow"]], np.int64)


def combine_vectors(rows: np.ndarray) -> dict[str, float]:
    """`combine_stats` of parts given as `stats_vector` rows."""
    rows = np.asarray(rows, np.int64)
    positions, matched = rows[:, 0], rows[:, 1]
    ratios = len(RATIOS_PER_MATCH)
    stats = [
        {
            **{
                k: float(row[2 + i] / row[1]) if row[1] else 0.0
                for i, k in enumerate(RATIOS_PER_MATCH)
            },
            **{k: int(row[2 + ratios + i]) for i, k in enumerate(SUMMED)},
            "fgram_overflow": int(row[-1]),
        }
        for row in rows
    ]
    return combine_stats(stats, positions.tolist(), matched.tolist())
