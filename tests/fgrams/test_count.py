"""Counting and selection against the brute-force reference, on many random corpora."""

import tracemalloc

import numpy as np
import pytest

from scone_jax.errors import UserError
from scone_jax.fgrams import count as count_mod
from scone_jax.fgrams import outofcore
from scone_jax.fgrams.build import select_fgrams
from scone_jax.fgrams.count import count_ngrams

from .helpers import as_list, corpus_of, random_docs
from .reference import brute_counts, brute_select


def survivors(counted):
    tokens, lengths, counts = counted.pooled()
    return {tuple(int(x) for x in row[:n]): int(c) for row, n, c in zip(tokens, lengths, counts)}


def test_counts_equal_brute_force_on_random_corpora(rng):
    for _ in range(120):
        docs = random_docs(rng)
        if not sum(map(len, docs)):
            continue
        k, m = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        want = {g: c for g, c in brute_counts(docs, k).items() if c >= m}
        got = survivors(count_ngrams(corpus_of(docs), k, m, progress=False))
        assert got == want, (docs, k, m)


@pytest.mark.parametrize("workers", [1, 3])
def test_many_small_chunks_equal_brute_force(rng, monkeypatch, workers):
    """Chunks of a few tokens, in RAM and on disk: chunk edges fall inside documents and
    n-grams, every chunk's last candidate needs the next chunk's first id (`_PassJob` probes
    it apart) and every partition is joined from many pieces."""
    for _ in range(15):
        docs = random_docs(rng)
        if not sum(map(len, docs)):
            continue
        chunk = int(rng.integers(1, 12))
        monkeypatch.setattr(outofcore, "MIN_CHUNK", chunk)
        monkeypatch.setattr(outofcore, "MAX_CHUNK", chunk)
        k, m = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        want = {g: c for g, c in brute_counts(docs, k).items() if c >= m}
        for disk in (False, True):
            counted = count_ngrams(
                corpus_of(docs), k, m, progress=False, workers=workers, force_disk=disk
            )
            assert counted.plan.chunk == chunk
            assert survivors(counted) == want, (docs, k, m, chunk, disk)


def test_selection_equals_brute_force_including_ties_and_small_sets(rng):
    for _ in range(120):
        docs = random_docs(rng)
        if not sum(map(len, docs)):
            continue
        k, m = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        s = int(rng.integers(1, 60))  # often more than the candidates, often cutting a tie
        want = brute_select(docs, k, s, m)
        if not want:
            with pytest.raises(UserError, match="no n-gram"):
                select_fgrams(corpus_of(docs), k, s, m, progress=False)
            continue
        fs = select_fgrams(corpus_of(docs), k, s, m, progress=False)
        assert as_list(fs) == want
        assert fs.cutoff_count == want[-1][1]
        assert fs.meta["requested_num_fgrams"] == s and fs.num_fgrams == len(want)


def test_ties_at_the_cutoff_are_broken_shorter_first_then_lexicographically():
    # every bigram and trigram below occurs exactly 3 times
    docs = [
        np.array([5, 1, 2]),
        np.array([5, 1, 2]),
        np.array([5, 1, 2]),
        np.array([0, 9]),
        np.array([0, 9]),
        np.array([0, 9]),
    ]
    fs = select_fgrams(corpus_of(docs), 3, 3, 3, progress=False)
    assert as_list(fs) == [((0, 9), 3), ((1, 2), 3), ((5, 1), 3)]
    fs = select_fgrams(corpus_of(docs), 3, 10, 3, progress=False)
    assert as_list(fs)[-1] == ((5, 1, 2), 3) and fs.num_fgrams == 4


def test_min_count_edges():
    docs = [np.array([1, 2, 1, 2, 1, 2])]  # (1,2) x3, (2,1) x2, (1,2,1) x2, (2,1,2) x2, ...
    assert as_list(select_fgrams(corpus_of(docs), 3, 10, 3, progress=False)) == [((1, 2), 3)]
    got = as_list(select_fgrams(corpus_of(docs), 3, 10, 2, progress=False))
    assert got == [((1, 2), 3), ((2, 1), 2), ((1, 2, 1), 2), ((2, 1, 2), 2)]
    with pytest.raises(UserError, match="no n-gram"):
        select_fgrams(corpus_of(docs), 3, 10, 4, progress=False)


def test_ngrams_never_cross_documents():
    docs = [np.array([1]), np.array([2]), np.array([]), np.array([1]), np.array([2, 1, 2])]
    counted = survivors(count_ngrams(corpus_of(docs), 3, 1, progress=False))
    assert counted == {(2, 1): 1, (1, 2): 1, (2, 1, 2): 1}


@pytest.mark.parametrize("vocab_size", [7, 2**17, 2**24, 2**31])
def test_code_layouts_agree(rng, vocab_size):
    """Small codes (uint32 keys), codes above 2**32 (uint32 keys plus a per-partition base),
    and plain uint64 keys."""
    docs = [rng.integers(0, 30, int(rng.integers(200, 2000))) for _ in range(6)]
    if vocab_size < 30:
        docs = [d % vocab_size for d in docs]
    want = {g: c for g, c in brute_counts(docs, 4).items() if c >= 2}
    for disk in (False, True):
        got = survivors(
            count_ngrams(
                corpus_of(docs, vocab_size),
                4,
                2,
                progress=False,
                force_disk=disk,
                memory_budget=1 << 20,
            )
        )
        assert got == want


def test_out_of_core_equals_in_memory(rng, tmp_path, monkeypatch):
    docs = [rng.integers(0, 40, int(rng.integers(0, 3000))) for _ in range(30)]
    corpus = corpus_of(docs)
    ram = select_fgrams(corpus, 6, 500, 3, progress=False)
    assert ram.meta["plan"] == "memory"
    disk = select_fgrams(
        corpus, 6, 500, 3, progress=False, memory_budget=1 << 20, force_disk=True, tmp_dir=tmp_path
    )
    assert disk.meta["plan"] == "disk"
    # partitions bigger than the per-worker limit are counted in pieces and merged
    monkeypatch.setattr(outofcore.Plan, "partition_limit", property(lambda self: 97))
    pieces = select_fgrams(
        corpus, 6, 500, 3, progress=False, memory_budget=1 << 20, force_disk=True, tmp_dir=tmp_path
    )
    for other in (disk, pieces):
        assert other.fingerprint == ram.fingerprint
        assert as_list(other) == as_list(ram)
    assert list(tmp_path.iterdir()) == []  # scratch files are gone


def test_tiny_budget_goes_out_of_core_and_is_respected(rng):
    tokens = rng.integers(0, 60, 1_000_000)
    lengths = np.diff(
        np.concatenate([[0], np.sort(rng.choice(len(tokens), 200, replace=False)), [len(tokens)]])
    )
    corpus = corpus_of(
        [tokens[a:b] for a, b in zip(np.cumsum(lengths) - lengths, np.cumsum(lengths))]
    )
    budget = 24 << 20
    plan = outofcore.plan(corpus.num_tokens, budget, 2)
    assert plan.mode == "disk"
    tracemalloc.start()
    try:
        counted = count_ngrams(corpus, 5, 5, memory_budget=budget, workers=2, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counted.plan.mode == "disk"
    assert peak <= budget, (
        f"peak traced memory {peak / 2**20:.1f} MiB > budget {budget / 2**20:.0f} MiB"
    )
    ram = count_ngrams(corpus, 5, 5, progress=False)
    assert survivors(counted) == survivors(ram)


def test_partition_pieces_merge_exactly(rng):
    keys = rng.integers(0, 50, 5000).astype(np.uint32)
    pieces = np.array_split(keys, 7)
    k1, c1 = count_mod._count_partition(iter([keys.copy()]), 3, 2**32)
    k2, c2 = count_mod._count_partition(iter([p.copy() for p in pieces]), 3, 2**32)
    assert k1.tolist() == k2.tolist() and c1.tolist() == c2.tolist()
    assert k1.dtype == np.uint64 and int(k1.min()) >= 2**32


def test_bad_settings():
    corpus = corpus_of([np.array([1, 2, 1, 2])])
    with pytest.raises(UserError, match="K must be >= 2"):
        select_fgrams(corpus, 1, 10, 1, progress=False)
    with pytest.raises(UserError, match="at least 1 f-gram"):
        select_fgrams(corpus, 3, 0, 1, progress=False)
    with pytest.raises(UserError, match="min-count"):
        select_fgrams(corpus, 3, 10, 0, progress=False)
    with pytest.raises(UserError, match="empty"):
        select_fgrams(corpus_of([np.array([], np.int64)]), 3, 10, 1, progress=False)


def test_memory_size_parsing():
    assert outofcore.parse_size("512M") == 512 << 20
    assert outofcore.parse_size("1.5g") == 3 << 29
    assert outofcore.parse_size("1000") == 1000
    for bad in ("lots", "-1G", "0"):
        with pytest.raises(UserError):
            outofcore.parse_size(bad)


@pytest.mark.parametrize("vocab_size", [None, 70_000, 2**31])
def test_shards_partial_counts_merged_equal_the_local_levels(rng, vocab_size):
    """What Beam workers do: each shard (whole documents) counted against the survivors'
    tables into partial counts per partition, the partitions summed over shards; taken in
    partition order that is exactly each local level, whatever the number of partitions."""
    docs = [rng.integers(0, 9, int(rng.integers(0, 400))) for _ in range(int(rng.integers(1, 40)))]
    corpus = corpus_of(docs, vocab_size)
    radix = corpus.key_vocab()
    k, m = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    local = count_ngrams(corpus, k, m, progress=False)
    cuts = np.unique(np.concatenate([[0], rng.integers(0, len(docs) + 1, 5), [len(docs)]]))
    shards = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        tokens = np.concatenate([np.zeros(0, np.int64)] + [docs[i] for i in range(a, b)])
        starts = np.zeros(len(tokens), bool)
        firsts = np.cumsum([0] + [len(docs[i]) for i in range(a, b - 1)])
        starts[firsts[firsts < len(tokens)]] = True
        shards.append((tokens.astype(np.uint32), starts))
    for n, level in enumerate(local.levels, start=2):
        indexes = [lv.index for lv in local.levels[: n - 2]]
        bound = (radix if n == 2 else indexes[-1].capacity) * radix
        layout = count_mod.Layout.for_pass(bound, 1 << int(rng.integers(0, 7)), 1 << 12)
        pieces, candidates = {}, 0
        for tokens, starts in shards:
            cands, sizes = count_mod.shard_candidates(tokens, starts, n, radix, indexes, layout)
            candidates += len(cands)
            for q, keys, counts in count_mod.partial_counts(cands, sizes):
                pieces.setdefault(q, []).append((keys, counts))
        merged = [
            count_mod.merge_partials([p[0] for p in ps], [p[1] for p in ps], m, layout, q)
            for q, ps in sorted(pieces.items())
        ]
        print(f"n={n} layout {layout}: {len(level.codes)} survivors")
        assert candidates == level.candidates
        assert np.concatenate([np.zeros(0, np.uint64)] + [c for c, _ in merged]).tolist() == (
            level.codes.tolist()
        )
        assert np.concatenate([np.zeros(0, np.int64)] + [c for _, c in merged]).tolist() == (
            level.counts.tolist()
        )
