"""The packed rank sort against a plain lexsort of the columns."""

import numpy as np

from scone_jax.fgrams.select import rank_order


def test_rank_order_equals_a_lexsort_of_the_columns(rng):
    for _ in range(50):
        m, k = int(rng.integers(0, 400)), int(rng.integers(2, 9))
        hi = int(rng.choice([3, 70_000, 2**31 - 1]))  # few bits, a word split, huge ids
        lengths = rng.integers(2, k + 1, m)
        tokens = rng.integers(0, hi, (m, k))
        tokens[:, :2] = rng.integers(0, 3, (m, 2))  # shared first tokens: ties in a word
        tokens[np.arange(k) >= lengths[:, None]] = -1
        counts = rng.integers(1, int(rng.choice([3, 2**40])), m)
        rows = np.unique(np.column_stack([counts, lengths, tokens]), axis=0)  # distinct rows
        counts, lengths, tokens = rows[:, 0], rows[:, 1], rows[:, 2:]
        want = np.lexsort((*[tokens[:, j] for j in range(k - 1, -1, -1)], lengths, -counts))
        assert rank_order(tokens, lengths, counts).tolist() == want.tolist()
