"""Exact n-gram counts for n = 2..K with Apriori pruning, vectorised, on all cores, in bounded
memory.

Codes, not hashes: counting is exact. A bigram is coded `t0 * V + t1` (V = the vocabulary
radix). After pass n-1, the n-grams that reached the minimum count go into an
open-addressing table (`HashIndex`) whose slot numbers serve as their ids, and each
position gets the id of the (n-1)-gram starting there (-1 if it did not survive). An n-gram
at position i is then a candidate only if both its (n-1)-prefix (`ids[i]`) and its
(n-1)-suffix (`ids[i+1]`) survived (Apriori on both sides), and its code is
`ids[i] * V + t[i+n-1]`: unique per distinct n-gram, 64 bits at any length. n-grams never
cross a document boundary: bigrams are masked at document starts and longer n-grams inherit
that from their prefix and suffix.

Each pass reads the corpus in chunks on a thread pool; compiled loops (`kernels.py`, no GIL)
turn a chunk's positions into candidate codes and write them by partition (the top bits of a
bijective mix of the code, so partitions are balanced and store uint32 keys when that
suffices); each partition is then sorted (`np.sort`) and run-length counted on its own.
Where the per-position ids and the partitions live (RAM or temporary files) is chosen from
the memory budget (`outofcore.plan`); the arithmetic is the same, so the output is identical.
The Beam backend runs the same arithmetic per shard (`shard_candidates`, `partial_counts`)
and merges the shards' partitions (`merge_partials`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass

import numpy as np

from scone_jax.errors import UserError
from scone_jax.fgrams import kernels, outofcore
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.hashindex import HashIndex
from scone_jax.progress import progress_bar

_U64 = np.uint64
# kernels.MIX is odd, so h = code * MIX mod 2**b is a bijection of [0, 2**b); _UNMIX undoes it
_UNMIX = pow(int(kernels.MIX), -1, 2**64)


@dataclass
class Level:
    """The n-grams of one length that reached the minimum count, in ascending order of their
    mixed code (`Layout`): the same order whatever the partitioning, so RAM and disk agree."""

    n: int
    codes: np.ndarray  # uint64: prefix * V + last token (prefix: a token for n = 2, else an id)
    counts: np.ndarray  # int64
    candidates: int  # positions whose n-gram was counted at this length (after pruning)
    # code -> slot; the slot is the id the next length's codes use as prefix, and
    # index.vals[slot] is the row in `codes` (built when a longer length is counted)
    index: HashIndex | None = None


@dataclass
class Counts:
    max_n: int
    min_count: int
    key_vocab: int
    levels: list[Level]
    plan: outofcore.Plan | None = None

    def tokens(self, n: int, rows: np.ndarray) -> np.ndarray:
        """Token ids [len(rows), n] of the given survivors of length n."""
        return self.decode(n, self.levels[n - 2].codes[rows])

    def decode(self, n: int, codes: np.ndarray) -> np.ndarray:
        """Token ids [len(codes), n] of codes of length n (needs the levels below n, indexed)."""
        out = np.empty((len(codes), n), self.token_dtype)
        self._decode_into(n, codes, out)
        return out

    def _decode_into(self, n: int, codes: np.ndarray, out: np.ndarray) -> None:
        """out[:, :n] = the token ids of codes of length n, last token first: a code is
        (id of its (n-1)-prefix) * V + last token, and the prefix's code is a row of the level
        below (`Level.index`)."""
        v = _U64(self.key_vocab)
        for m in range(n, 1, -1):
            out[:, m - 1] = codes % v
            prefix = codes // v
            if m == 2:
                out[:, 0] = prefix
            else:
                below = self.levels[m - 3]
                codes = below.codes[below.index.vals[prefix]]

    @property
    def token_dtype(self):
        return np.int32 if self.key_vocab <= 2**31 else np.int64

    def pooled(self, rows_by_level: list[np.ndarray] | None = None):
        """(tokens [M, K] padded with -1, lengths [M], counts [M]) of the chosen survivors."""
        if rows_by_level is None:
            rows_by_level = [np.arange(len(lv.codes)) for lv in self.levels]
        sizes = [len(rows) for rows in rows_by_level]
        toks = np.full((sum(sizes), self.max_n), -1, self.token_dtype)
        at = 0
        for lv, rows in zip(self.levels, rows_by_level):
            self._decode_into(lv.n, lv.codes[rows], toks[at : at + len(rows)])
            at += len(rows)
        lens = np.repeat(
            np.array([lv.n for lv in self.levels], np.int64), sizes[: len(self.levels)]
        )
        cnts = [lv.counts[rows] for lv, rows in zip(self.levels, rows_by_level)]
        return toks, lens, np.concatenate(cnts) if cnts else np.zeros(0, np.int64)


def count_ngrams(
    corpus: Corpus,
    max_n: int = 5,
    min_count: int = 5,
    *,
    memory_budget: int | None = None,
    workers: int | None = None,
    force_disk: bool = False,
    tmp_dir=None,
    progress: bool = True,
) -> Counts:
    """Count every n-gram (2 <= n <= max_n) that occurs at least `min_count` times."""
    if max_n < 2:
        raise UserError(f"max n-gram length {max_n} must be >= 2")
    if min_count < 1:
        raise UserError(f"minimum count {min_count} must be >= 1")
    corpus.check_nonempty()
    budget = memory_budget or outofcore.default_budget()
    p = outofcore.plan(corpus.num_tokens, budget, workers or os.cpu_count() or 1, force_disk)
    radix = corpus.key_vocab()
    scratch = outofcore.scratch_dir(tmp_dir) if p.mode == "disk" else None
    try:
        levels = _count(
            corpus, max_n, min_count, radix, p, scratch.name if scratch else None, progress
        )
    finally:
        if scratch is not None:
            scratch.cleanup()
    return Counts(max_n, min_count, radix, levels, p)


def _count(corpus, max_n, min_count, radix, p, scratch, progress) -> list[Level]:
    n_tok = corpus.num_tokens
    levels: list[Level] = []
    ids_in = ids_out = None
    # a chunk reads max_n + 2 tokens past its end (`_PassJob`)
    if p.mode == "memory":
        tokens = outofcore.MemoryTokens(corpus, max_n + 2)
    else:
        tokens = outofcore.FileTokens(corpus)
    with ThreadPoolExecutor(p.workers) as pool:
        run = _CountRun(pool, tokens, radix, max_n, min_count, p, scratch, progress)
        try:
            for n in range(2, max_n + 1):
                if n >= 3 and not len(levels[-1].codes):
                    break
                index = None
                if n >= 3:
                    index = levels[-1].index = index_of(levels[-1])
                if n >= 3:
                    check_codes_fit(index, radix, n)
                _check_memory(levels, p)
                ids_out = None
                if 3 <= n < max_n:  # ids of the (n-1)-grams, read again by pass n+1
                    ids_out = (
                        outofcore.MemoryIds(n_tok)
                        if p.mode == "memory"
                        else outofcore.DiskIds(n_tok, scratch)
                    )
                levels.append(_one_pass(run, n, index, ids_in, ids_out))
                if ids_in is not None:
                    ids_in.close()
                ids_in, ids_out = ids_out, None
        finally:
            for store in (ids_in, ids_out):
                if store is not None:
                    store.close()
    return levels


@dataclass(frozen=True)
class _CountRun:
    """What every pass of one count shares: its workers, tokens, key radix, limits and plan."""

    pool: ThreadPoolExecutor
    tokens: object  # outofcore.MemoryTokens or FileTokens (and their `corpus`)
    radix: int
    max_n: int
    min_count: int
    plan: outofcore.Plan
    scratch: str | None  # the disk plan's scratch folder
    progress: bool


def _one_pass(run: _CountRun, n: int, index, ids_in, ids_out) -> Level:
    """Scan the corpus in chunks into partitions of candidate codes, then count each partition."""
    p, radix, pool = run.plan, run.radix, run.pool
    n_tok = run.tokens.corpus.num_tokens
    layout = Layout.for_pass((radix if n == 2 else index.capacity) * radix, p.partitions)
    parts = (
        outofcore.MemoryPartitions(layout.parts, layout.dtype)
        if p.mode == "memory"
        else outofcore.DiskPartitions(layout.parts, layout.dtype, run.scratch)
    )
    job = _PassJob(run.tokens, n, radix, run.max_n, index, ids_in, ids_out, parts, layout)
    bar = progress_bar(
        f"count n={n}",
        total=n_tok,
        unit="tok",
        unit_scale=True,
        disable=not run.progress,
        leave=False,
    )

    def count_part(q: int):
        return _count_partition(parts.take(q, p.partition_limit), run.min_count, layout.base(q))

    futures = []
    try:
        with bar:  # off a terminal, a "done" line only when the pass is done
            futures = [
                pool.submit(job, a, min(a + p.chunk, n_tok)) for a in range(0, n_tok, p.chunk)
            ]
            candidates = 0
            for fut in as_completed(futures):
                done, cands = fut.result()
                candidates += cands
                bar.update(done)
            bar.set_postfix_str("sorting")
            results = list(pool.map(count_part, range(layout.parts)))
    except BaseException:  # an error, Ctrl-C or SIGTERM: no queued chunk starts after it
        for fut in futures:
            fut.cancel()
        wait(futures)  # the running ones, before what they read and write is closed
        raise
    finally:
        parts.close()
    codes = layout.unmix(np.concatenate([r[0] for r in results]))
    return Level(n, codes, np.concatenate([r[1] for r in results]), candidates)


def index_of(level: Level) -> HashIndex:
    """The table of a level's codes (values: rows), most frequent first so that the positions
    probed most often find their n-gram in its home slot."""
    rank = np.minimum(level.counts, 2**16 - 1).astype(np.uint16)
    rows = np.argsort(~rank, kind="stable")  # descending count; a radix sort on 16-bit keys
    return HashIndex(level.codes[rows], rows)


def check_codes_fit(index: HashIndex, radix: int, n: int) -> None:
    """Codes of length n are (slot of the (n-1)-gram) * radix + token: they must fit 64 bits,
    and the slots int32."""
    if index.capacity * radix >= 2**64 - 1 or index.capacity >= 2**31 - 1:
        raise UserError(
            f"{index.size} surviving {n - 1}-grams with vocabulary {radix} "
            f"overflow 64-bit codes; raise --min-count"
        )


def _check_memory(levels: list[Level], p: outofcore.Plan) -> None:
    held = sum(
        lv.codes.nbytes + lv.counts.nbytes + (lv.index.nbytes if lv.index else 0) for lv in levels
    )
    if held > max(p.budget * 0.5, outofcore.MIN_SURVIVOR_BYTES):
        raise UserError(
            f"the surviving n-grams need {held / 2**20:.0f} MiB, more than half the memory budget "
            f"({p.budget / 2**20:.0f} MiB); raise --memory-budget or --min-count"
        )


@dataclass
class _PassJob:
    """Turn the positions [a, b) into candidate codes for pass n and hand them to partitions."""

    tokens: object  # outofcore.MemoryTokens or FileTokens (and their `corpus`)
    n: int
    radix: int
    max_n: int
    index: HashIndex | None
    ids_in: object
    ids_out: object
    parts: object
    layout: Layout

    def __call__(self, a: int, b: int) -> tuple[int, int]:
        """(positions scanned, candidates handed to the partitions)."""
        n, L, v = self.n, b - a, _U64(self.radix)
        t = self.tokens.window(a, L + self.max_n + 2)  # uint16/32 ids, widened in the kernels
        starts_at = self.tokens.corpus.starts
        if n == 2:
            return L, self._hand_over(*self.layout.scatter(t, t[1:], starts_at(a + 1, b + 1), v, L))
        # ids of the (n-1)-grams at a .. b - 1: in RAM straight into the id array
        window = self.ids_out.window(a, L) if self.ids_out is not None else None
        ids = window if window is not None else np.empty(L, np.int32)
        if n == 3:
            prefix, starts = t, starts_at(a + 1, b + 2)
        else:
            prefix, starts = self.ids_in.read(a, b + 2), _NOT_CHECKED
        last, follow = t[n - 2 :], t[n - 1 :]
        found = self._hand_over(
            *_ids_then_scatter(self.index, prefix, last, starts, v, ids, follow, self.layout)
        )
        if window is None and self.ids_out is not None:
            self.ids_out.write(a, ids)
        # The candidate at b - 1 needs the id at b too, which is the next chunk's to write:
        # it is probed here into a private pair (ids[L - 1], id at b) and scattered alone.
        edge = np.array([ids[L - 1], -1], np.int32)
        edge_starts = None if starts is None else starts[L:]
        _ids(self.index, prefix[L:], last[L:], edge_starts, v, edge[1:])
        return L, found + self._hand_over(
            *self.layout.scatter(edge, follow[L - 1 :], _NOT_CHECKED, v, 1)
        )

    def _hand_over(self, keys: np.ndarray, sizes: np.ndarray) -> int:
        """Give keys grouped by partition (`Layout.scatter`) to the partitions; how many."""
        for q, piece in partition_pieces(keys, sizes):
            self.parts.add(q, piece)
        return len(keys)


# no document starts to check: longer n-grams inherit them from their prefix and suffix ids
_NOT_CHECKED = None
_NO_WEIGHTS = np.zeros(0, np.int64)  # each key counts 1
_NO_SIZES = np.zeros(0, np.int64)  # `kernels.ids` without the next scatter's first loop
_COUNT_ONLY = np.zeros(0, np.int64)  # `kernels.runs` with no outputs: how many it would keep


def shard_candidates(
    t: np.ndarray, starts: np.ndarray, n: int, radix: int, indexes: list[HashIndex], layout
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate codes of length n in a token array of whole documents (`starts[i]`: a
    document begins at i), pruned by the tables of the survivors of lengths 2..n-1 (`indexes`):
    their stored keys grouped by partition of `layout`, and each partition's size.

    A pass's arithmetic on one piece of corpus with nothing kept from earlier passes (a Beam
    worker's shard): the per-position ids of each shorter length are recomputed from the
    bigrams up, where the local passes read the previous length's ids back.
    """
    v, size = _U64(radix), len(t)
    t = np.concatenate([t, np.zeros(n + 1, t.dtype)])  # padding; those positions are masked
    blocked = np.ones(size, bool)  # a document starts at i + 1, or i + 1 is past the end
    blocked[: size - 1] = starts[1:]
    if n == 2:
        return layout.scatter(t, t[1:], blocked, v, size)
    ids, nxt = np.empty(size + 1, np.int32), np.empty(size + 1, np.int32)
    ids[size] = nxt[size] = -1  # no suffix past the end
    _ids(indexes[0], t, t[1:], blocked, v, ids[:size])
    for m in range(3, n):
        _ids(indexes[m - 2], ids, t[m - 1 :], _NOT_CHECKED, v, nxt[:size])
        ids, nxt = nxt, ids
    return layout.scatter(ids, t[n - 1 :], _NOT_CHECKED, v, size)


def partition_pieces(keys: np.ndarray, sizes: np.ndarray):
    """(partition, its keys) for each non-empty partition of keys grouped by partition
    (`Layout.scatter`)."""
    ends = np.cumsum(sizes)
    for q in np.flatnonzero(sizes):
        yield int(q), keys[ends[q] - sizes[q] : ends[q]]


def _ids(index: HashIndex, prefix, last, starts, v: np.uint64, out: np.ndarray) -> None:
    """out[i] = the id (table slot) of the n-gram coded prefix[i] * v + last[i], -1 where a
    document starts at i + 1, prefix[i] or prefix[i + 1] is -1, or it did not survive."""
    kernels.ids(
        index.keys,
        index.spill,
        index.bits,
        prefix,
        last,
        starts,
        v,
        out,
        last,
        _U64(0),
        _U64(0),
        _NO_SIZES,
    )


def _ids_then_scatter(index: HashIndex, prefix, last, starts, v, ids, follow, layout: Layout):
    """`_ids` into `ids`, then the next length's candidates ids[i] * v + follow[i] of positions
    i < len(ids) - 1 scattered (`Layout.scatter(ids, follow, _NOT_CHECKED, v, len(ids) - 1)`),
    its first loop done by the probe kernel while each block of ids is in cache."""
    sizes = np.zeros(layout.parts, np.int64)
    kernels.ids(
        index.keys,
        index.spill,
        index.bits,
        prefix,
        last,
        starts,
        v,
        ids,
        follow,
        layout.hmask,
        _U64(layout.shift),
        sizes,
    )
    keys = np.empty(len(ids), layout.dtype)  # + 1 (len(ids) - 1 positions): non-candidates
    total = kernels.place(
        ids, follow, _NOT_CHECKED, v, layout.hmask, _U64(layout.shift), keys, sizes
    )
    return keys[:total], sizes


@dataclass(frozen=True)
class Layout:
    """How one pass's codes (below 2**bits) are split into partitions.

    Codes are mixed by a bijection, h = code * kernels.MIX mod 2**bits, and partition q holds the
    h whose top `part_bits` bits are q: balanced like a hash partition, yet the partitions'
    sorted outputs, taken in order, are all h sorted, whatever the number of partitions.
    When the bits below the partition's fit in 32, only the low 32 bits of h are stored: half
    the bytes to move, and a radix sort that skips the byte columns constant in a partition.
    """

    bits: int
    part_bits: int
    dtype: type

    @classmethod
    def for_pass(
        cls, code_bound: int, partitions: int, max_partitions: int = outofcore.MAX_PARTITIONS
    ) -> Layout:
        """About `partitions` (a power of two), more (up to `max_partitions`) where that makes
        the stored keys uint32."""
        bits = max(1, (code_bound - 1).bit_length())
        want = partitions.bit_length() - 1
        part_bits = min(bits, max(want, bits - 32))
        if part_bits > max_partitions.bit_length() - 1:
            return cls(bits, min(bits, want), np.uint64)
        return cls(bits, part_bits, np.uint32)

    def scatter(self, prefix, last, starts, v: np.uint64, size: int):
        """(stored keys grouped by partition, int64 size of each partition) of the candidate
        codes prefix[i] * v + last[i] of positions 0..size-1 (`kernels.scatter`)."""
        keys = np.empty(size + 1, self.dtype)  # + 1: where the kernel writes non-candidates
        sizes = np.zeros(self.parts, np.int64)
        total = kernels.scatter(prefix, last, starts, v, self.hmask, _U64(self.shift), keys, sizes)
        return keys[:total], sizes

    @property
    def hmask(self) -> np.uint64:
        return _U64((1 << self.bits) - 1)

    @property
    def parts(self) -> int:
        return 1 << self.part_bits

    @property
    def shift(self) -> int:
        return self.bits - self.part_bits

    def base(self, q: int) -> int:
        """What partition q adds to its stored keys to make their h."""
        return (q << self.shift) >> 32 << 32 if self.dtype is np.uint32 else 0

    def unmix(self, h: np.ndarray) -> np.ndarray:
        codes = h * _U64(_UNMIX)
        if self.bits < 64:
            codes &= _U64((1 << self.bits) - 1)
        return codes


def _count_partition(pieces, min_count: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Count one partition (mixed codes h = base + stored keys); pieces arrive one at a time
    when the partition does not fit in RAM at once."""
    keys, counts = _count_pieces(pieces, min_count)
    return keys.astype(np.uint64) + _U64(base), counts


def _count_pieces(pieces, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    it = iter(pieces)
    k = next(it, None)
    if k is None:
        return np.zeros(0, np.uint32), np.zeros(0, np.int64)
    nxt = next(it, None)
    if nxt is None:
        return _counted(k, min_count)
    keys, counts = _counted(k, 1)
    del k
    while nxt is not None:
        pk, pc = _counted(nxt, 1)
        keys, counts = merge_counts([keys, pk], [counts, pc])
        nxt = next(it, None)
    keep = counts >= min_count
    return keys[keep], counts[keep]


def _counted(k: np.ndarray, min_count: int, weights: np.ndarray = _NO_WEIGHTS):
    """(distinct keys ascending, int64 counts >= min_count) of the keys k, which are sorted in
    place; with `weights`, k comes sorted and each key counts its weight. numpy's
    sort is a vectorised quicksort (AVX-512 / AVX2 where the CPU has them): ~2 ns/key on the
    benchmark's partitions, where the radix sort it replaces took ~8."""
    if not len(weights):
        k.sort()
    m = kernels.runs(k, weights, min_count, k[:0], _COUNT_ONLY)  # to size the outputs
    keys, counts = np.empty(m + 1, k.dtype), np.empty(m + 1, np.int64)
    kernels.runs(k, weights, min_count, keys, counts)
    return keys[:m], counts[:m]


def merge_counts(
    keys: list[np.ndarray], counts: list[np.ndarray], min_count: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Several (distinct keys, counts) pairs summed into one: (distinct keys ascending, int64
    counts), those below `min_count` left out."""
    allk, allc = np.concatenate(keys), np.concatenate(counts).astype(np.int64, copy=False)
    order = np.argsort(allk)
    return _counted(allk.take(order), min_count, allc.take(order))


# -- the same kernels for a distributed shuffle (Beam): a shard's partial counts, merged --------


def partial_counts(keys: np.ndarray, sizes: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(partition, distinct stored keys, their counts) for each non-empty partition of a shard's
    candidates (`shard_candidates`); the counts in the narrowest unsigned dtype that holds
    them, as they cross the shuffle."""
    out = []
    for q, piece in partition_pieces(keys, sizes):
        k, c = _counted(piece, 1)
        out.append((q, k, c.astype(np.min_scalar_type(int(c.max())))))
    return out


def merge_partials(
    keys: list[np.ndarray], counts: list[np.ndarray], min_count: int, layout: Layout, q: int
) -> tuple[np.ndarray, np.ndarray]:
    """Partition q's partial counts from every shard summed and cut at `min_count`: the codes
    of its survivors, in the order of `Level.codes`, and their counts."""
    k, c = merge_counts(keys, counts, min_count)
    return layout.unmix(k.astype(np.uint64) + _U64(layout.base(q))), c
