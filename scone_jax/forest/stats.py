"""The per-step f-gram metrics of a batch made of parts (microbatches, or the rows of each
process): the whole batch's ratios, per position and per matched position, not a mean of the
parts' means."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RATIOS_PER_MATCH = ("distinct_ratio", "mean_match_length")
SUMMED = ("fgram_nodes", "fgram_positions", "fgram_outputs")
# one part as a vector (what processes exchange): its positions, matched positions, then these
VECTOR_KEYS = (*RATIOS_PER_MATCH, *SUMMED, "fgram_overflow")


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
    return np.array([positions, matched, *(stats[k] for k in VECTOR_KEYS)], np.float64)


def combine_vectors(rows: np.ndarray) -> dict[str, float]:
    """`combine_stats` of parts given as `stats_vector` rows [parts, 2 + len(VECTOR_KEYS)]."""
    stats = [dict(zip(VECTOR_KEYS, row[2:].tolist(), strict=True)) for row in rows]
    return combine_stats(stats, rows[:, 0].tolist(), rows[:, 1].tolist())
