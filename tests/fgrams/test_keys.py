import numpy as np

from scone_jax.fgrams.hashindex import EMPTY, HashIndex
from scone_jax.fgrams.keys import fgram_key, fgram_keys, suffix_keys
from tests.fgrams.helpers import get_one


def test_key_is_fixed_forever():
    # Serving tables store these keys: a change here breaks every exported table.
    assert fgram_key([1, 2, 3]) == 11978740532689718669
    assert fgram_key([0, 0]) == 14321160549137647392
    assert fgram_key([5, 7], seed=1) == 9211418236554179834
    assert fgram_key([2**32 - 2] * 8) == 6842227675386055873


def test_vectorised_keys_match_the_scalar_reference(rng):
    k = 6
    lengths = rng.integers(2, k + 1, 500)
    tokens = np.full((500, k), -1, np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(0, 2**32 - 1, n)
    for seed in (0, 3):
        got = fgram_keys(tokens, lengths, seed)
        want = [fgram_key(tokens[i, :n], seed) for i, n in enumerate(lengths)]
        assert got.tolist() == want


def test_suffix_keys_match(rng):
    t = rng.integers(0, 50, 200)
    for n in (2, 3, 5):
        got = suffix_keys(t, n, seed=2)
        assert got.tolist() == [fgram_key(t[j : j + n], 2) for j in range(len(t) - n + 1)]


def test_length_and_order_are_part_of_the_key():
    keys = {fgram_key(g) for g in ([0, 0], [0, 0, 0], [1, 2], [2, 1], [1, 2, 0], [0, 1, 2])}
    assert len(keys) == 6


def test_hashindex_matches_a_dict(rng):
    for n in (0, 1, 7, 1000, 50_000):
        keys = np.unique(rng.integers(0, 2**40, n, dtype=np.uint64))
        values = rng.permutation(len(keys)) * 3
        index = HashIndex(keys, values)
        q = np.concatenate([keys, rng.integers(0, 2**40, 2 * n + 5, dtype=np.uint64)])
        ref = dict(zip(keys.tolist(), values.tolist()))
        want = [ref.get(x, -1) for x in q.tolist()]
        assert index.get(q).tolist() == want
        slots = index.slots(q)
        assert np.all((slots >= 0) == (np.array(want) >= 0))
        assert np.all(index.keys[slots[slots >= 0]] == q[slots >= 0])
        for x in q[:50].tolist():
            assert get_one(index, x) == ref.get(x, -1)


def test_hashindex_refuses_the_sentinel():
    import pytest

    with pytest.raises(ValueError):
        HashIndex(np.array([1, int(EMPTY)], np.uint64))
