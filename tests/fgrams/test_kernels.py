"""The compiled kernels (`kernels.py`) against plain references: run-length counts against
`np.unique`, and whole counts against the brute force on the token dtypes datasets hold."""

import numpy as np
import pytest

from scone_jax.fgrams import count as count_mod
from scone_jax.fgrams import outofcore
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.count import count_ngrams

from .reference import brute_counts


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_run_length_counts_and_merges_equal_unique(rng, dtype):
    """`_counted` (sort + `kernels.runs`) and `merge_counts` (weighted runs) against
    `np.unique`, on keys with long runs, singletons and the dtype's extremes."""
    top = np.iinfo(dtype).max
    for _ in range(20):
        pool = rng.integers(0, top, 300, dtype=dtype, endpoint=True)
        pool[:3] = [0, 1, top]
        keys = pool[rng.integers(0, len(pool), int(rng.integers(0, 3000)))]
        m = int(rng.integers(1, 30))
        want_k, want_c = np.unique(keys, return_counts=True)
        got_k, got_c = count_mod._counted(keys.copy(), m)
        assert got_k.dtype == dtype and got_c.dtype == np.int64
        assert got_k.tolist() == want_k[want_c >= m].tolist()
        assert got_c.tolist() == want_c[want_c >= m].tolist()
        split = [count_mod._counted(p.copy(), 1) for p in np.array_split(keys, 5)]
        got_k, got_c = count_mod.merge_counts([p[0] for p in split], [p[1] for p in split], m)
        assert got_k.tolist() == want_k[want_c >= m].tolist()
        assert got_c.tolist() == want_c[want_c >= m].tolist()


def _survivors(counted):
    tokens, lengths, counts = counted.pooled()
    return {tuple(int(x) for x in row[:n]): int(c) for row, n, c in zip(tokens, lengths, counts)}


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_counts_equal_brute_force_on_dataset_dtypes_many_documents_and_tiny_budgets(
    rng, dtype, monkeypatch
):
    """Tokens as datasets store them (uint16 / uint32), hundreds of short documents, K up to
    8, in memory and out of core with partitions counted in pieces of 53 keys."""
    monkeypatch.setattr(outofcore.Plan, "partition_limit", property(lambda self: 53))
    hi = np.iinfo(dtype).max
    for _ in range(6):
        lengths = rng.integers(0, 12, int(rng.integers(1, 400)))
        alphabet = rng.choice(hi + 1, int(rng.integers(2, 6)), replace=False).astype(dtype)
        tokens = alphabet[rng.integers(0, len(alphabet), int(lengths.sum()))]
        if not len(tokens):
            continue
        docs = np.split(tokens, np.cumsum(lengths)[:-1])
        k, m = int(rng.integers(2, 9)), int(rng.integers(1, 4))
        want = {g: c for g, c in brute_counts(docs, k).items() if c >= m}
        corpus = Corpus.from_arrays(tokens, lengths)
        assert corpus.read(0, 1).dtype == dtype
        ram = count_ngrams(corpus, k, m, progress=False, workers=2)
        disk = count_ngrams(
            corpus, k, m, progress=False, workers=2, force_disk=True, memory_budget=1 << 16
        )
        assert ram.plan.mode == "memory" and disk.plan.mode == "disk"
        assert _survivors(ram) == want
        assert _survivors(disk) == want
