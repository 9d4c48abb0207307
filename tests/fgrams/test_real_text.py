"""Real text (WikiText-2 validation, word-level ids): selection and tagging vs brute force."""

import numpy as np
import pytest

from scone_jax.fgrams.build import select_fgrams
from scone_jax.fgrams.tag import tag_corpus

from ..conftest import SHARED_DATA
from .helpers import as_list, corpus_of, whitespace_corpus
from .reference import brute_counts, brute_tag

WIKI = SHARED_DATA / "wikitext-2" / "valid.txt"


@pytest.fixture(scope="module")
def wiki():
    if not WIKI.is_file():
        pytest.skip(f"{WIKI} is absent")
    docs, vocab = whitespace_corpus(WIKI)
    return docs, vocab, brute_counts(docs, 8)


def ranked(counts, k, s, m):
    kept = [(g, c) for g, c in counts.items() if c >= m and len(g) <= k]
    kept.sort(key=lambda gc: (-gc[1], len(gc[0]), gc[0]))
    return kept[:s]


@pytest.mark.parametrize("k,s,m", [(5, 3000, 5), (2, 1000, 5), (8, 10**6, 3), (3, 500, 40)])
def test_wikitext_selection_equals_brute_force(wiki, k, s, m):
    docs, vocab, counts = wiki
    fs = select_fgrams(corpus_of(docs, vocab), k, s, m, progress=False)
    want = ranked(counts, k, s, m)
    assert as_list(fs) == want
    if s == 10**6:
        assert fs.num_fgrams == len(want) < s  # fewer survive than asked: all kept


def test_wikitext_tagging_equals_brute_force(wiki):
    docs, vocab, _ = wiki
    fs = select_fgrams(corpus_of(docs, vocab), 5, 5000, 5, progress=False)
    table = {fs.fgram(i): i for i in range(fs.num_fgrams)}
    want_ids, want_lens = brute_tag(docs, table, 5)
    ids, lens, _ = tag_corpus(fs, corpus_of(docs, vocab), progress=False, chunk=10_007)
    assert np.array_equal(ids, want_ids) and np.array_equal(lens, want_lens)
    assert 0.3 < np.mean(lens > 0) < 1.0
