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
    """Permutation putting rows in rank order; `tokens` is [M, K], right-padded with -1.

    The rank key (count descending, length, token ids + 1) is packed into as few uint64
    words as its bit widths allow, most significant first (2 for K = 5 and a 32k vocabulary,
    where a lexsort of the columns would take K + 2 passes).
    """
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    counts = np.asarray(counts, dtype=np.int64)
    if not len(counts):
        return np.zeros(0, np.int64)
    top = int(counts.max())
    fields = [(top - counts, top.bit_length()), (lengths, int(lengths.max()).bit_length())]
    width = (int(tokens.max()) + 1).bit_length()
    fields += [(tokens[:, j] + 1, width) for j in range(tokens.shape[1])]
    words = _packed(fields)
    # Rows are distinct, so sorting the first word settles every row but ties in it; those
    # few are sorted again by all the words (a lexsort costs a pass per word).
    order = np.argsort(words[0])
    first = words[0][order]
    tied = np.zeros(len(order), bool)
    same = first[1:] == first[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if len(words) > 1 and same.any():
        at = np.flatnonzero(tied)
        sub = order[at]
        order[at] = sub[np.lexsort([w[sub] for w in words[::-1]])]
    return order


def _packed(fields) -> list[np.ndarray]:
    """Non-negative integer columns of the given bit widths, concatenated most significant
    first into uint64 words (the last one padded with zero bits)."""
    words, cur, used = [], None, 0
    for values, bits in fields:
        values = np.asarray(values).astype(np.uint64)
        while bits:
            take = min(bits, 64 - used)
            part = (values >> np.uint64(bits - take)) & np.uint64((1 << take) - 1)
            cur = part if cur is None else (cur << np.uint64(take)) | part
            used, bits = used + take, bits - take
            if used == 64:
                words.append(cur)
                cur, used = None, 0
    if cur is not None:
        words.append(cur << np.uint64(64 - used))
    return words


def select_top(
    tokens: np.ndarray, lengths: np.ndarray, counts: np.ndarray, num: int
) -> tuple[np.ndarray, int | None]:
    """Rows of the top `num` in rank order, and the cutoff (the last kept row's count)."""
    rows = cutoff_rows(counts, num)
    order = rows[rank_order(tokens[rows], lengths[rows], counts[rows])][:num]
    cutoff = int(counts[order[-1]]) if len(order) else None
    return order, cutoff
