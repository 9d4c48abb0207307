"""Attach what the f-gram model needs to each batch, on the host (SCONE.md sections 3-4).

Each token of the dataset is tagged once with its longest f-gram match (fgrams/tag.py), so a
batch's f-grams are a lookup: `tag_ids[positions]`. Matches may reach back before the window
start (the tags were computed over whole documents) but never across a document boundary.

The f-gram buffer has a static number of rows so the jitted step keeps one shape: the
configured capacity, or, when a batch has more distinct f-grams (an overflow, counted in the
batch stats), the next power of two that fits. The buffer size is a function of the batch
alone, so a resumed run sees the same shapes, and the result is always exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FGRAM_KEYS = ("fgram_index", "fgram_tokens", "fgram_lengths")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class FgramBatcher:
    tag_ids: np.ndarray  # [num_tokens] longest-match f-gram id per dataset position, -1 = none
    tag_lengths: np.ndarray  # [num_tokens] match length, 0 = none
    fgram_tokens: np.ndarray  # [S, K] token ids, right-padded with -1
    fgram_lengths: np.ndarray  # [S]
    capacity: int  # buffer rows per host batch before it grows
    dedup: bool = True
    multiple: int = 1  # buffer rows are a multiple of this (the data-parallel mesh size)

    def rows_for(self, needed: int) -> int:
        rows = self.capacity if needed <= self.capacity else 1 << max(needed - 1, 0).bit_length()
        return round_up(max(rows, 1), self.multiple)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add `fgram_index` [B, T], `fgram_tokens` [C, K], `fgram_lengths` [C] and `fgram_stats`."""
        ids = np.asarray(self.tag_ids[batch["positions"]], dtype=np.int64)
        matched = ids >= 0
        index = np.full(ids.shape, -1, np.int32)
        if self.dedup:
            rows, inverse = np.unique(ids[matched], return_inverse=True)
            index[matched] = inverse
        else:
            rows = ids[matched]
            index[matched] = np.arange(len(rows))
        n = len(rows)
        size = self.rows_for(n)
        k = self.fgram_tokens.shape[1]
        tokens = np.zeros((size, k), np.int32)
        lengths = np.ones(size, np.int32)
        tokens[:n] = np.maximum(self.fgram_tokens[rows], 0)
        lengths[:n] = self.fgram_lengths[rows]
        n_matched = int(matched.sum())
        stats = {
            "match_rate": n_matched / ids.size,
            "distinct_ratio": (len(np.unique(ids[matched])) / n_matched) if n_matched else 0.0,
            "mean_match_length": float(np.asarray(self.tag_lengths[batch["positions"]])[matched].mean())
            if n_matched else 0.0,
            "fgram_rows": size,
            "fgram_overflow": int(n > self.capacity),
        }
        return {**batch, "fgram_index": index, "fgram_tokens": tokens, "fgram_lengths": lengths,
                "fgram_stats": stats}


def pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Grow a batch's f-gram buffer to `rows` (so every host of a job uses the same shape)."""
    have = batch["fgram_tokens"].shape[0]
    if have == rows:
        return batch
    extra = rows - have
    return {**batch,
            "fgram_tokens": np.concatenate([batch["fgram_tokens"],
                                            np.zeros((extra, batch["fgram_tokens"].shape[1]), np.int32)]),
            "fgram_lengths": np.concatenate([batch["fgram_lengths"], np.ones(extra, np.int32)])}
