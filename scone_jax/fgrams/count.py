"""Exact n-gram counts for n = 2..K with Apriori pruning, vectorised, on all cores, in bounded memory.

Codes, not hashes: counting is exact. A bigram is coded `t0 * V + t1` (V = the vocabulary
radix). After pass n-1, the n-grams that reached the minimum count get dense ids (their
rank in sorted code order, which is also their lexicographic token order), and each
position gets the id of the (n-1)-gram starting there (-1 if it did not survive). An n-gram
at position i is then a candidate only if both its (n-1)-prefix (`ids[i]`) and its
(n-1)-suffix (`ids[i+1]`) survived (Apriori on both sides), and its code is
`ids[i] * V + t[i+n-1]`: unique per distinct n-gram, 64 bits at any length. n-grams never
cross a document boundary: bigrams are masked at document starts and longer n-grams inherit
that from their prefix and suffix.

Each pass reads the corpus in chunks on a thread pool (numpy releases the GIL), turns
positions into candidate codes, and hash-partitions the codes; each partition is then sorted
and run-length counted on its own. Where the per-position ids and the partitions live (RAM
or temporary files) is chosen from the memory budget (`outofcore.plan`); the arithmetic is
the same, so the output is identical.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from scone_jax.errors import UserError
from scone_jax.fgrams import outofcore
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.hashindex import HashIndex

_FIB = np.uint64(0x9E3779B97F4A7C15)
_U64 = np.uint64


@dataclass
class Level:
    """The n-grams of one length that reached the minimum count, sorted by code."""

    n: int
    codes: np.ndarray  # uint64: prefix * V + last token (prefix: a token for n = 2, else an id)
    counts: np.ndarray  # int64
    candidates: int  # positions whose n-gram was counted at this length (after pruning)


@dataclass
class Counts:
    max_n: int
    min_count: int
    key_vocab: int
    levels: list[Level]
    plan: outofcore.Plan | None = None
    info: dict = field(default_factory=dict)

    @property
    def num_survivors(self) -> int:
        return sum(len(lv.codes) for lv in self.levels)

    def tokens(self, n: int, rows: np.ndarray) -> np.ndarray:
        """Token ids [len(rows), n] of the given survivors of length n."""
        codes = self.levels[n - 2].codes[rows]
        v = _U64(self.key_vocab)
        last = (codes % v).astype(np.int64)
        prefix = (codes // v).astype(np.int64)
        head = prefix[:, None] if n == 2 else self.tokens(n - 1, prefix)
        return np.concatenate([head, last[:, None]], axis=1)

    def pooled(self, rows_by_level: list[np.ndarray] | None = None):
        """(tokens [M, K] padded with -1, lengths [M], counts [M]) of the chosen survivors."""
        toks, lens, cnts = [], [], []
        for i, lv in enumerate(self.levels):
            rows = np.arange(len(lv.codes)) if rows_by_level is None else rows_by_level[i]
            t = np.full((len(rows), self.max_n), -1, np.int64)
            t[:, :lv.n] = self.tokens(lv.n, rows)
            toks.append(t)
            lens.append(np.full(len(rows), lv.n, np.int64))
            cnts.append(lv.counts[rows])
        if not toks:
            return np.zeros((0, self.max_n), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(toks), np.concatenate(lens), np.concatenate(cnts)


def count_ngrams(corpus: Corpus, max_n: int = 5, min_count: int = 5, *,
                 memory_budget: int | None = None, workers: int | None = None,
                 force_disk: bool = False, tmp_dir=None, progress: bool = True) -> Counts:
    """Count every n-gram (2 <= n <= max_n) that occurs at least `min_count` times."""
    if max_n < 2:
        raise UserError(f"max n-gram length {max_n} must be >= 2")
    if min_count < 1:
        raise UserError(f"minimum count {min_count} must be >= 1")
    corpus.check_nonempty()
    import os

    budget = memory_budget or outofcore.default_budget()
    p = outofcore.plan(corpus.num_tokens, budget, workers or os.cpu_count() or 1, force_disk)
    radix = corpus.key_vocab()
    scratch = outofcore.scratch_dir(tmp_dir) if p.mode == "disk" else None
    try:
        levels = _count(corpus, max_n, min_count, radix, p, scratch.name if scratch else None, progress)
    finally:
        if scratch is not None:
            scratch.cleanup()
    return Counts(max_n, min_count, radix, levels, p)


def _count(corpus, max_n, min_count, radix, p, scratch, progress) -> list[Level]:
    n_tok = corpus.num_tokens
    levels: list[Level] = []
    ids_in = ids_out = None
    with ThreadPoolExecutor(p.workers) as pool:
        try:
            for n in range(2, max_n + 1):
                prev_size = radix if n == 2 else len(levels[-1].codes)
                if prev_size == 0:
                    break
                if prev_size * radix >= 2**64 or prev_size >= 2**31 - 1:
                    raise UserError(f"{prev_size} surviving {n - 1}-grams with vocabulary {radix} overflow 64-bit codes; raise --min-count")
                key_dtype = np.uint32 if prev_size * radix <= 2**32 else np.uint64
                index = HashIndex(levels[-1].codes) if n >= 3 else None
                _check_memory(levels, index, p)
                if n < max_n and n >= 3:
                    ids_out = (outofcore.MemoryIds(n_tok) if p.mode == "memory"
                               else outofcore.DiskIds(n_tok, scratch))
                else:
                    ids_out = None
                parts = (outofcore.MemoryPartitions(p.partitions, key_dtype) if p.mode == "memory"
                         else outofcore.DiskPartitions(p.partitions, key_dtype, scratch))
                job = _PassJob(corpus, n, radix, max_n, index, ids_in, ids_out, parts, p.partitions)
                bar = tqdm(total=n_tok, unit="tok", unit_scale=True, desc=f"count n={n}",
                           disable=not progress, file=sys.stderr, leave=False)
                try:
                    futures = [pool.submit(job, a, min(a + p.chunk, n_tok)) for a in range(0, n_tok, p.chunk)]
                    candidates = 0
                    for fut in as_completed(futures):
                        done, cands = fut.result()
                        candidates += cands
                        bar.update(done)
                    bar.set_postfix_str("sorting")
                    results = list(pool.map(lambda q: _count_partition(parts.take(q, p.partition_limit), min_count),
                                            range(p.partitions)))
                finally:
                    bar.close()
                    parts.close()
                codes = np.concatenate([r[0] for r in results])
                counts = np.concatenate([r[1] for r in results])
                order = np.argsort(codes)
                levels.append(Level(n, codes[order], counts[order], candidates))
                if ids_in is not None:
                    ids_in.close()
                ids_in, ids_out = ids_out, None
        finally:
            for store in (ids_in, ids_out):
                if store is not None:
                    store.close()
    return levels


def _check_memory(levels: list[Level], index: HashIndex | None, p: outofcore.Plan) -> None:
    held = sum(lv.codes.nbytes + lv.counts.nbytes for lv in levels) + (index.nbytes if index else 0)
    if held > p.budget * 0.5:
        raise UserError(f"the surviving n-grams need {held / 2**20:.0f} MiB, more than half the memory budget "
                        f"({p.budget / 2**20:.0f} MiB); raise --memory-budget or --min-count")


@dataclass
class _PassJob:
    """Turn the positions [a, b) into candidate codes for pass n and hand them to partitions."""

    corpus: Corpus
    n: int
    radix: int
    max_n: int
    index: HashIndex | None
    ids_in: object
    ids_out: object
    parts: object
    num_parts: int

    def __call__(self, a: int, b: int) -> tuple[int, int]:
        n, L, v = self.n, b - a, _U64(self.radix)
        width = L + self.max_n + 2
        t = np.zeros(width, np.uint64)
        got = self.corpus.read(a, a + width)
        t[:len(got)] = got
        if n == 2:
            starts = self.corpus.starts(a, a + L + 1)
            sel = np.flatnonzero(~starts[1:L + 1])
            codes = t[sel] * v + t[sel + 1]
        else:
            if n == 3:  # ids of the bigrams at a .. b (one past the chunk, for suffixes)
                starts = self.corpus.starts(a, a + L + 2)
                sel = np.flatnonzero(~starts[1:L + 2])
                prev_codes = t[sel] * v + t[sel + 1]
            else:
                prev = self.ids_in.read(a, a + L + 2)
                sel = np.flatnonzero((prev[:L + 1] >= 0) & (prev[1:L + 2] >= 0))
                prev_codes = prev[sel].astype(np.uint64) * v + t[sel + (n - 2)]
            ids = np.full(L + 1, -1, np.int32)
            ids[sel] = self.index.get(prev_codes)
            if self.ids_out is not None:
                self.ids_out.write(a, ids[:L])
            sel = np.flatnonzero((ids[:L] >= 0) & (ids[1:] >= 0))
            codes = ids[sel].astype(np.uint64) * v + t[sel + (n - 1)]
        self._scatter(codes)
        return L, len(codes)

    def _scatter(self, codes: np.ndarray) -> None:
        dtype = self.parts.dtype
        if self.num_parts == 1:
            self.parts.add(0, codes.astype(dtype))
            return
        bits = self.num_parts.bit_length() - 1
        part = ((codes * _FIB) >> _U64(64 - bits)).astype(np.uint8 if bits <= 8 else np.uint16)
        order = np.argsort(part, kind="stable")
        bounds = np.cumsum(np.bincount(part, minlength=self.num_parts))[:-1]
        for q, piece in enumerate(np.split(codes[order].astype(dtype), bounds)):
            self.parts.add(q, piece)


def _runs(k: np.ndarray, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, counts) of a sorted array, keeping runs of length >= min_count."""
    n = len(k)
    if n < min_count or n == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(k[1:], k[:-1], out=first[1:])
    if min_count > 1:  # a run starting at j is long enough iff k[j] == k[j + min_count - 1]
        first[n - min_count + 1:] = False
        first[:n - min_count + 1] &= k[min_count - 1:] == k[:n - min_count + 1]
    starts = np.flatnonzero(first)
    ends = np.searchsorted(k, k[starts], side="right")
    return k[starts].astype(np.uint64), (ends - starts).astype(np.int64)


def _count_partition(pieces, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Count one partition; pieces arrive one at a time when it does not fit in RAM at once."""
    it = iter(pieces)
    k = next(it, None)
    if k is None:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    nxt = next(it, None)
    k.sort()
    if nxt is None:
        return _runs(k, min_count)
    keys, counts = _runs(k, 1)
    del k
    while nxt is not None:
        nxt.sort()
        pk, pc = _runs(nxt, 1)
        allk = np.concatenate([keys, pk])
        allc = np.concatenate([counts, pc])
        order = np.argsort(allk, kind="stable")
        allk, allc = allk[order], allc[order]
        first = np.flatnonzero(np.concatenate([[True], allk[1:] != allk[:-1]]))
        keys, counts = allk[first], np.add.reduceat(allc, first)
        nxt = next(it, None)
    keep = counts >= min_count
    return keys[keep], counts[keep]
