"""Attach what the f-gram model needs to each batch, on the host (SCONE.md sections 3-4).

Each token of the dataset is tagged once with its longest f-gram match (fgrams/tag.py), so a
batch's f-grams are a lookup: `tag_ids[positions]`. Matches may reach back before the window
start (the tags were computed over whole documents) but never across a document boundary.

The f-grams of a batch go to the device in one buffer per length n = 2..K
(`fgram_tokens_<n>` [C_n, n]), so the f-gram model computes no padding; with deduplication
each distinct f-gram is one row. `fgram_index` [B, T] points into the rows of all buffers
concatenated (-1 = no match). Buffer sizes are static so the jitted step keeps its shapes:
C_n is the calibrated capacity for length n, or, when a batch has more rows of that length
(an overflow, counted in the stats), the next multiple of `granule` that fits, which costs
one recompile per new size and is always exact. Sizes depend on the batch alone, so a
resumed run sees the same shapes as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from scone_jax.config.schema import FgramConfig
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.errors import UserError
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tags_for_dataset


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def group_key(n: int) -> str:
    return f"fgram_tokens_{n}"


@dataclass
class FgramBatcher:
    tag_ids: np.ndarray  # [num_tokens] longest-match f-gram id per dataset position, -1 = none
    tag_lengths: np.ndarray  # [num_tokens] match length, 0 = none
    fgram_tokens: np.ndarray  # [S, K] token ids, right-padded with -1
    fgram_lengths: np.ndarray  # [S]
    granule: int  # buffer rows are a multiple of this (itself a multiple of the data-parallel size)
    capacity: dict[int, int] = field(default_factory=dict)  # calibrated rows per length
    dedup: bool = True

    @property
    def max_n(self) -> int:
        return self.fgram_tokens.shape[1]

    def entries(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The buffer entries (f-gram ids) for a batch's ids, and each matched position's entry:
        each distinct f-gram once with deduplication, else one entry per matched position."""
        matched = ids[ids >= 0]
        if self.dedup:
            return np.unique(matched, return_inverse=True)
        return matched, np.arange(len(matched))

    def calibrate(self, batches: Iterable[dict[str, np.ndarray]], headroom: float = 1.1) -> None:
        """Set each length's capacity from sample batches (the largest seen, plus headroom)."""
        peak = np.zeros(self.max_n + 1, np.int64)
        for batch in batches:
            rows, _ = self.entries(np.asarray(self.tag_ids[batch["positions"]]))
            peak = np.maximum(peak, np.bincount(self.fgram_lengths[rows], minlength=self.max_n + 1))
        self.capacity = {n: round_up(max(int(peak[n] * headroom), 1), self.granule)
                         for n in range(2, self.max_n + 1)}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add `fgram_index` [B, T], the per-length buffers `fgram_tokens_<n>`, and `fgram_stats`."""
        ids = np.asarray(self.tag_ids[batch["positions"]], dtype=np.int64)
        matched = ids >= 0
        rows, entry_of_position = self.entries(ids)
        lengths = self.fgram_lengths[rows]
        slot = np.empty(len(rows), np.int32)  # each entry's row in the buffers concatenated
        out = dict(batch)
        offset, overflow = 0, 0
        for n in range(2, self.max_n + 1):
            where = np.flatnonzero(lengths == n)
            capacity = self.capacity.get(n, self.granule)
            size = max(capacity, round_up(max(len(where), 1), self.granule))
            overflow += int(len(where) > capacity)
            tokens = np.zeros((size, n), np.int32)
            tokens[:len(where)] = self.fgram_tokens[rows[where], :n]
            out[group_key(n)] = tokens
            slot[where] = offset + np.arange(len(where))
            offset += size
        index = np.full(ids.shape, -1, np.int32)
        index[matched] = slot[entry_of_position]
        n_matched = int(matched.sum())
        out["fgram_index"] = index
        out["fgram_ids"] = ids.astype(np.int32)  # host-side only: what serving looks up
        out["fgram_stats"] = {
            "match_rate": n_matched / ids.size,
            "distinct_ratio": (len(rows) if self.dedup else len(np.unique(rows))) / n_matched if n_matched else 0.0,
            "mean_match_length": float(np.asarray(self.tag_lengths[batch["positions"]])[matched].mean())
            if n_matched else 0.0,
            "fgram_rows": offset,
            "fgram_positions": int(sum(out[group_key(n)].size for n in range(2, self.max_n + 1))),
            "fgram_overflow": overflow,
        }
        return out


def pad_rows(batch: dict[str, np.ndarray], rows: dict[int, int]) -> dict[str, np.ndarray]:
    """Grow each length's buffer to `rows[n]` (so every host of a job uses the same shapes),
    re-pointing `fgram_index` into the new concatenated layout."""
    have = {n: batch[group_key(n)].shape[0] for n in rows}
    if have == rows:
        return batch
    out = dict(batch)
    old_start = new_start = 0
    remap = np.full(sum(have.values()), -1, np.int32)
    for n in sorted(rows):
        remap[old_start:old_start + have[n]] = np.arange(new_start, new_start + have[n])
        tokens = np.zeros((rows[n], n), np.int32)
        tokens[:have[n]] = batch[group_key(n)]
        out[group_key(n)] = tokens
        old_start, new_start = old_start + have[n], new_start + rows[n]
    index = batch["fgram_index"]
    out["fgram_index"] = np.where(index >= 0, remap[np.maximum(index, 0)], -1).astype(np.int32)
    return out


@dataclass
class FgramInputs:
    """A run's f-gram set and the batcher that feeds its tags to the model."""

    fgram_set: FgramSet
    batcher: FgramBatcher

    def batcher_for(self, dataset: TokenizedDataset, progress: bool = True) -> FgramBatcher:
        """The same buffers for another dataset (an extra eval set), tagged with this set."""
        ids, lengths = tags_for_dataset(dataset, self.fgram_set, progress=progress)
        return replace(self.batcher, tag_ids=ids, tag_lengths=lengths)


def train_split_corpus(dataset: TokenizedDataset, train_ids: np.ndarray) -> Corpus:
    """The training documents only: held-out text must not choose the f-grams."""
    lengths = dataset.doc_lengths[train_ids]
    tokens = np.concatenate([dataset.doc(i) for i in train_ids]) if len(train_ids) else np.zeros(0, np.int64)
    return Corpus.from_arrays(tokens, lengths, vocab_size=dataset.vocab_size,
                              source=f"{dataset.path} (training split)",
                              tokenizer_sha256=dataset.tokenizer_sha256)


def load_or_build_fgram_set(cfg: FgramConfig, dataset: TokenizedDataset, train_ids: np.ndarray,
                            run_dir: str | Path, progress: bool = True) -> FgramSet:
    """`fgrams.fgram_set` if given (checked against the tokenizer and K), else RUN_DIR/fgrams,
    counted on the training split on first use."""
    if cfg.fgram_set:
        fgram_set = FgramSet.load(cfg.fgram_set)
    else:
        out = Path(run_dir) / "fgrams"
        if not (out / "meta.json").is_file():
            build_fgram_set(train_split_corpus(dataset, train_ids), out, max_n=cfg.max_n,
                            num_fgrams=cfg.num_fgrams, min_count=cfg.min_count, progress=progress)
        fgram_set = FgramSet.load(out)
    if fgram_set.max_n != cfg.max_n:
        raise UserError(f"f-gram set {fgram_set.path} has K={fgram_set.max_n}, but fgrams.max_n={cfg.max_n}")
    if fgram_set.tokenizer_sha256 and fgram_set.tokenizer_sha256 != dataset.tokenizer_sha256:
        raise UserError(f"f-gram set {fgram_set.path} was built with tokenizer {fgram_set.tokenizer_sha256[:12]}, "
                        f"but the dataset uses {dataset.tokenizer_sha256[:12]}")
    return fgram_set


def prepare_fgram_inputs(cfg: FgramConfig, dataset: TokenizedDataset, train_ids: np.ndarray,
                         run_dir: str | Path, positions_per_host: int, row_multiple: int,
                         progress: bool = True, process_index: int = 0, process_count: int = 1,
                         barrier=None) -> FgramInputs:
    """The run's f-gram set, the dataset's tags (each of `process_count` processes tagging its
    share, see `tags_for_dataset`), and a batcher whose buffers grow in steps of 1/32 of a
    batch's positions (rounded to the data-parallel size)."""
    fgram_set = load_or_build_fgram_set(cfg, dataset, train_ids, run_dir, progress)
    ids, lengths = tags_for_dataset(dataset, fgram_set, progress=progress, process_index=process_index,
                                    process_count=process_count, barrier=barrier)
    granule = round_up(max(positions_per_host // 32, 1), row_multiple)
    batcher = FgramBatcher(ids, lengths, fgram_set.tokens, fgram_set.lengths, granule=granule, dedup=cfg.dedup)
    if cfg.capacity:
        batcher.capacity = {n: round_up(cfg.capacity, granule) for n in range(2, fgram_set.max_n + 1)}
    return FgramInputs(fgram_set=fgram_set, batcher=batcher)


def global_fgram_index(index: np.ndarray, rows: np.ndarray, process_index: int, process_count: int) -> np.ndarray:
    """Host-local buffer rows -> rows of the global buffers, where each length's global
    buffer is the processes' buffers of that length stacked in process order."""
    starts_local = np.concatenate([[0], np.cumsum(rows)[:-1]])
    starts_global = starts_local * process_count + process_index * rows
    group = np.searchsorted(np.cumsum(rows), np.maximum(index, 0), side="right")
    moved = index - starts_local[group] + starts_global[group]
    return np.where(index >= 0, moved, -1).astype(np.int32)
