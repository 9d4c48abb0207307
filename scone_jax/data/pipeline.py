"""The grain input pipeline: documents -> packed windows -> shuffled per-host batches.

A batch is a pure function of (seed, step): the windows of a split are shuffled by grain
(a fresh permutation per epoch), and global batch k is samples [k*B, (k+1)*B). Process p
of P reads only rows [p*B/P, (p+1)*B/P) of it. A resumed run therefore sees exactly the
batches an uninterrupted run would have seen, with no iterator state to save.

Windows pack the split's documents back to back (each document ends in EOS) and are cut
every `seq_len` tokens; a window holds `seq_len + 1` tokens so inputs and targets are its
two shifted views. `positions` are the windows' indices into the dataset's token array,
which is what later stages (f-gram tags) key on.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import grain
import numpy as np

from scone_jax.data.dataset import TokenizedDataset
from scone_jax.errors import UserError


def split_documents(
    num_docs: int, eval_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out a seeded random `eval_fraction` of documents (at least one when > 0)."""
    n_eval = int(round(num_docs * eval_fraction))
    if eval_fraction > 0 and num_docs >= 2:
        n_eval = min(max(n_eval, 1), num_docs - 1)
    perm = np.random.default_rng(seed).permutation(num_docs)
    return np.sort(perm[n_eval:]), np.sort(perm[:n_eval])


class WindowSource:
    """Random-access windows over a subset of a dataset's documents (a grain data source)."""

    def __init__(self, dataset: TokenizedDataset, doc_ids: np.ndarray, seq_len: int):
        self.dataset = dataset
        self.seq_len = seq_len
        starts = dataset.doc_offsets[:-1][doc_ids]
        lengths = dataset.doc_lengths[doc_ids]
        keep = lengths > 0
        self._starts = starts[keep].astype(np.int64)
        self._cum = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)
        total = int(self._cum[-1])
        self._len = max(0, (total - 1) // seq_len)
        self.num_tokens = total

    def __len__(self) -> int:
        return self._len

    def positions(self, index: int) -> np.ndarray:
        """Dataset token indices of window `index` ([seq_len + 1] int64)."""
        flat = index * self.seq_len + np.arange(self.seq_len + 1, dtype=np.int64)
        seg = np.searchsorted(self._cum, flat, side="right") - 1
        return self._starts[seg] + (flat - self._cum[seg])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < self._len:
            raise IndexError(index)
        pos = self.positions(index)
        return {"tokens": np.asarray(self.dataset.tokens[pos], dtype=np.int32), "positions": pos}


def to_example(window: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = window["tokens"]
    return {"inputs": tokens[:-1], "targets": tokens[1:], "positions": window["positions"][:-1]}


@dataclass
class BatchStream:
    """Per-host batches of one split: `batch(step)` is this process's rows of global batch
    `step`."""

    source: WindowSource
    global_batch: int
    seed: int
    process_index: int = 0
    process_count: int = 1
    shuffle: bool = True
    transform: Callable[[dict], dict] | None = None  # e.g. the f-gram batcher (SCONE)

    def __post_init__(self):
        if self.global_batch % self.process_count:
            raise UserError(
                f"train.batch_size={self.global_batch} is not divisible by the "
                f"{self.process_count} processes"
            )
        if len(self.source) == 0:
            raise UserError(
                f"the split has {self.source.num_tokens} tokens, fewer than one window of "
                f"{self.source.seq_len + 1}; use a bigger corpus or a smaller data.seq_len"
            )
        self.local_batch = self.global_batch // self.process_count
        ds = grain.MapDataset.source(self.source)
        if self.shuffle:
            ds = ds.shuffle(seed=self.seed)
        self._per_host = ds.repeat().map(to_example).batch(self.local_batch, drop_remainder=True)

    def raw_batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of global batch `step` (and the step), before `transform`."""
        return {**self._per_host[step * self.process_count + self.process_index], "step": step}

    def batch(self, step: int) -> dict[str, np.ndarray]:
        batch = self.raw_batch(step)
        return self.transform(batch) if self.transform else batch

    def iterate(self, start_step: int, depth: int = 2) -> Iterator[dict[str, np.ndarray]]:
        """Batches from `start_step` on, prepared `depth` steps ahead on a background thread."""
        return prefetch(itertools.count(start_step), self.batch, depth)


def prefetch(items: Iterable, prepare: Callable, depth: int = 2) -> Iterator:
    """`prepare(item)` for each item, computed `depth` items ahead on one background thread."""
    items = iter(items)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = [pool.submit(prepare, item) for item in itertools.islice(items, depth)]
        while pending:
            result = pending.pop(0).result()
            pending.extend(pool.submit(prepare, item) for item in itertools.islice(items, 1))
            yield result


HELDOUT_REMEDY = "raise data.eval_fraction, or lower train.batch_size or data.seq_len"


def eval_batch_count(
    source: WindowSource,
    batch_size: int,
    max_batches: int,
    name: str = "held-out split",
    remedy: str = HELDOUT_REMEDY,
) -> int:
    """How many eval batches a split gives (at most `max_batches`); none at all is an error
    that names the settings that would give one."""
    n = min(max_batches, len(source) // batch_size)
    if n == 0:
        raise UserError(
            f"{name} has {source.num_tokens} tokens in {len(source)} windows of "
            f"{source.seq_len + 1}, fewer than one eval batch of {batch_size} windows "
            f"(train.batch_size); {remedy}"
        )
    return n


def eval_batches(
    source: WindowSource,
    batch_size: int,
    max_batches: int,
    process_index: int = 0,
    process_count: int = 1,
    transform=None,
    name: str = "held-out split",
) -> list[dict[str, np.ndarray]]:
    """The first `max_batches` batches of a split in order (no shuffle): a fixed eval set."""
    n = eval_batch_count(source, batch_size, max_batches, name)
    stream = BatchStream(
        source,
        batch_size,
        seed=0,
        process_index=process_index,
        process_count=process_count,
        shuffle=False,
        transform=transform,
    )
    return [stream.batch(k) for k in range(n)]
