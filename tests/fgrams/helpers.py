"""Small random corpora for the f-gram tests."""

from __future__ import annotations

import numpy as np

from scone_jax.fgrams.corpus import Corpus


def random_docs(
    rng: np.random.Generator, max_docs: int = 6, max_len: int = 40, alphabet: int | None = None
):
    """A few documents (some empty or single-token) over a small alphabet, so n-grams repeat."""
    alphabet = alphabet or int(rng.integers(2, 7))
    docs = []
    for _ in range(int(rng.integers(1, max_docs + 1))):
        kind = rng.random()
        n = 0 if kind < 0.1 else 1 if kind < 0.2 else int(rng.integers(2, max_len + 1))
        docs.append(rng.integers(0, alphabet, n))
    return docs


def corpus_of(docs, vocab_size: int | None = None) -> Corpus:
    tokens = (
        np.concatenate([np.asarray(d, np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    )
    return Corpus.from_arrays(tokens, [len(d) for d in docs], vocab_size=vocab_size)


def as_list(fs) -> list[tuple[tuple[int, ...], int]]:
    return [(fs.fgram(i), int(fs.counts[i])) for i in range(fs.num_fgrams)]


def whitespace_corpus(path, max_docs: int | None = None):
    """Crude word-level tokenization of a WikiText file: one id per distinct whitespace word,
    documents split at top-level ` = Title = ` lines."""
    vocab: dict[str, int] = {}
    docs, cur = [], []
    for line in open(path, encoding="utf-8"):
        s = line.strip()
        if s.startswith("= ") and s.endswith(" =") and not s.startswith("= ="):
            if cur:
                docs.append(np.array(cur, np.int64))
                cur = []
            if max_docs and len(docs) >= max_docs:
                break
        cur.extend(vocab.setdefault(w, len(vocab)) for w in s.split())
    if cur and not (max_docs and len(docs) >= max_docs):
        docs.append(np.array(cur, np.int64))
    return docs, len(vocab)


def get_one(index, key: int) -> int:
    """A HashIndex's value for one key (-1 = absent), by its scalar probe `slot_one`."""
    slot = index.slot_one(key)
    return int(index.vals[slot]) if slot >= 0 else -1
