"""Pool the surviving n-grams of every length and keep the top S (SCONE.md section 2).

Rank: count descending, then shorter first, then token ids lexicographically ascending;
ids 0..S-1 follow that rank. Both backends (local and Beam) end here, so they agree.
"""

from __future__ import annotations

import numpy as np


def cutoff_rows(counts: np.ndarray, num: int) -> np.ndarray:
    """Indices of the rows that can make the top `num`: every row whose count is at least
    the num-th largest count (all rows when there are at most `num`)."""
    counts = np.asarray(counts)
    if len(counts) <= num:
        return np.arange(len(counts))
    kth = np.partition(counts, len(counts) - num)[len(counts) - num]
    return np.flatnonzero(counts >= kth)


def rank_order(tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Permutation putting rows in rank order; `tokens` is [M, K], right-padded with -1."""
    tokens = np.asarray(tokens)
    cols = [tokens[:, j] for j in range(tokens.shape[1] - 1, -1, -1)]
    return np.lexsort((*cols, np.asarray(lengths), -np.asarray(counts, dtype=np.int64)))


def select_top(
    tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray, num: int
) -> tuple[np.ndarray, int | None]:
    """Rows of the top `num` in rank order, and the cutoff (the last kept row's count)."""
    rows = cutoff_rows(counts, num)
    order = rows[rank_order(tokens[rows], lengths[rows], counts[rows])][:num]
    cutoff = int(counts[order[-1]]) if len(order) else None
    return order, cutoff
