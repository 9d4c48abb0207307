"""Tagging against the brute-force longest match, in every form."""

import errno
import os

import numpy as np
import pytest

from scone_jax.errors import UserError
from scone_jax.fgrams import tag as tag_mod
from scone_jax.fgrams.build import select_fgrams
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import (
    DecodeTagger,
    StreamingTagger,
    tag_corpus,
    tag_tokens,
    tags_for_dataset,
)

from ..conftest import make_dataset
from .helpers import corpus_of, get_one, random_docs
from .reference import brute_tag


def random_set(rng, docs, k):
    for m in (int(rng.integers(1, 4)), 1):
        try:
            return select_fgrams(corpus_of(docs), k, int(rng.integers(1, 60)), m, progress=False)
        except UserError:
            continue
    return None


def expected(fs, docs):
    table = {fs.fgram(i): i for i in range(fs.num_fgrams)}
    return brute_tag(docs, table, fs.max_n)


def contexts(docs, k):
    rows = []
    for doc in docs:
        for j in range(len(doc)):
            ctx = [int(x) for x in doc[max(0, j - k + 1) : j]]
            rows.append([-1] * (k - 1 - len(ctx)) + ctx)
    return np.array(rows, np.int64).reshape(-1, k - 1)


def test_tagging_equals_brute_force_at_document_boundaries(rng):
    for _ in range(80):
        docs = random_docs(rng, max_docs=8)
        if not sum(map(len, docs)):
            continue
        k = int(rng.integers(2, 9))
        fs = random_set(rng, docs, k)
        if fs is None:
            continue
        want_ids, want_lens = expected(fs, docs)
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
        tokens = np.concatenate([np.asarray(d, np.int64) for d in docs])
        ids, lens = tag_tokens(fs, tokens, offsets)
        assert ids.tolist() == want_ids and lens.tolist() == want_lens
        # chunked over a thread pool: windows cut mid-document and mid-f-gram
        ids, lens, hist = tag_corpus(
            fs, corpus_of(docs), progress=False, chunk=int(rng.integers(1, 9))
        )
        assert ids.tolist() == want_ids and lens.tolist() == want_lens
        assert hist.tolist() == np.bincount(want_lens, minlength=k + 1).tolist()


def test_streaming_forms_agree_with_brute_force(rng):
    for _ in range(40):
        docs = random_docs(rng, max_docs=4)
        if not sum(map(len, docs)):
            continue
        k = int(rng.integers(2, 7))
        fs = random_set(rng, docs, k)
        if fs is None:
            continue
        want = list(zip(*expected(fs, docs)))
        st = StreamingTagger(fs)
        got_match, got_push = [], []
        for doc in docs:
            st.reset()
            for j, t in enumerate(doc):
                got_match.append(st.match(doc[max(0, j - k + 1) : j], t))
                got_push.append(st.push(t))
        assert got_match == want and got_push == want
        tokens = np.concatenate([np.asarray(d, np.int64) for d in docs])
        ids, lens = st.match_batch(contexts(docs, k), tokens)
        assert list(zip(ids.tolist(), lens.tolist())) == want
        # every document a sequence of one decode batch, from a common cut on
        length = min(map(len, docs))
        if length:
            cut = int(rng.integers(0, length))
            batch = DecodeTagger(fs, [d[:cut] for d in docs])
            got = np.array(
                [batch.push([int(d[j]) for d in docs]) for j in range(cut, length)]
            ).T.tolist()
            starts = np.cumsum([0] + [len(d) for d in docs])
            assert got == [[want[s + j][0] for j in range(cut, length)] for s in starts[:-1]]


def test_unknown_tokens_never_match(rng):
    docs = [np.array([1, 2, 1, 2, 1, 2, 1, 2])]
    fs = select_fgrams(corpus_of(docs), 3, 10, 2, progress=False)  # vocab unknown: radix 3
    ids, lens = tag_tokens(fs, np.array([1, 2, 99, 1, 2, 1]))
    assert lens.tolist() == [0, 2, 0, 0, 2, 3]
    assert StreamingTagger(fs).match([1, 2], 99) == (-1, 0)
    assert StreamingTagger(fs).match([99, 1], 2) == (get_one(fs.tagger().tables[2], 1 * 3 + 2), 2)
    assert DecodeTagger(fs, [[1, 2], [99, 1]]).push([99, 2]) == [
        -1,
        get_one(fs.tagger().tables[2], 1 * 3 + 2),
    ]


def test_the_batched_match_ends_at_an_id_the_set_does_not_know(rng):
    """Ids at or above the set's key vocabulary never match in `match_batch` either: without the
    check, slot * V + t aliases another n-gram's key once t >= V."""
    docs = [np.array([0, 0, 0, 0, 1, 1, 0, 0] * 3)]
    fs = select_fgrams(corpus_of(docs), 5, 100, 2, progress=False)  # ids {0, 1}: radix 2
    st = StreamingTagger(fs)
    ids, lens = st.match_batch(np.array([[0, 0, 0, 0]]), np.array([2]))
    assert (ids.tolist(), lens.tolist()) == ([-1], [0])
    for _ in range(20):  # against the whole-sequence tagger, which skips unknown ids
        tokens = rng.integers(0, 2, 60)
        unknown = rng.random(60) < 0.2
        tokens[unknown] = rng.integers(2, 9, int(unknown.sum()))
        want = tag_tokens(fs, tokens)
        ids, lens = st.match_batch(contexts([tokens], 5), tokens)
        assert ids.tolist() == want[0].tolist() and lens.tolist() == want[1].tolist()


def test_declared_vocab_is_enforced(rng):
    docs = [np.array([1, 2, 1, 2, 1, 2, 1, 2])]
    fs = select_fgrams(corpus_of(docs, vocab_size=4), 3, 10, 2, progress=False)
    with pytest.raises(UserError, match="out of vocabulary"):
        tag_corpus(fs, Corpus.from_arrays(np.array([1, 2, 7])), progress=False)
    with pytest.raises(UserError, match="negative"):
        tag_tokens(fs, np.array([1, -2]))


def test_a_set_that_is_not_closed_is_refused(rng):
    docs = [np.array([1, 2, 3, 1, 2, 3])]
    fs = select_fgrams(corpus_of(docs), 3, 10, 2, progress=False)
    keep = [i for i in range(fs.num_fgrams) if fs.fgram(i) != (1, 2)]
    broken = FgramSet.create(
        fs.tokens[keep],
        fs.lengths[keep],
        fs.counts[keep],
        max_n=3,
        min_count=2,
        key_vocab=fs.key_vocab,
    )
    with pytest.raises(UserError, match="not closed"):
        broken.tagger()


def test_tags_are_stored_beside_the_dataset_and_reused(tmp_path, rng, monkeypatch):
    docs = [rng.integers(0, 6, int(rng.integers(0, 400))) for _ in range(10)]
    ds = make_dataset(tmp_path / "ds", docs, 6)
    fs = select_fgrams(Corpus.from_dataset(ds), 4, 50, 2, progress=False)
    fs.save(tmp_path / "set")
    fs = FgramSet.load(tmp_path / "set")
    ids, lens = tags_for_dataset(ds, fs, progress=False)
    want_ids, want_lens = expected(fs, docs)
    assert ids.tolist() == want_ids and lens.tolist() == want_lens
    stored = tmp_path / "ds" / "tags" / fs.fingerprint[:16]
    assert sorted(p.name for p in stored.iterdir()) == [
        "checksums.json",
        "ids.npy",
        "lengths.npy",
        "meta.json",
    ]

    def boom(*a, **k):
        raise AssertionError("tags were recomputed")

    monkeypatch.setattr(tag_mod, "tag_corpus", boom)
    ids2, _ = tags_for_dataset(tmp_path / "ds", fs, progress=False)
    assert isinstance(ids2, np.memmap) and ids2.tolist() == want_ids


def test_tags_that_do_not_fit_beside_the_dataset_are_one_error_and_no_directory(
    tmp_path, rng, monkeypatch
):
    """A disk without room for the tags refuses them before any write through the memory map
    (where a full disk kills the process with SIGBUS): one clear error, no tags directory."""
    docs = [rng.integers(0, 6, int(rng.integers(0, 400))) for _ in range(10)]
    ds = make_dataset(tmp_path / "ds", docs, 6)
    fs = select_fgrams(Corpus.from_dataset(ds), 4, 50, 2, progress=False)
    fs.save(tmp_path / "set")
    fs = FgramSet.load(tmp_path / "set")

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(
        UserError, match=r"cannot write .*/ds/tags/\w+: \[Errno 28\] No space left on device"
    ):
        tags_for_dataset(ds, fs, progress=False)
    assert not any((tmp_path / "ds" / "tags").iterdir())
    monkeypatch.undo()
    ids, lens = tags_for_dataset(ds, fs, progress=False)  # with room, the same call stores them
    assert (ids.tolist(), lens.tolist()) == expected(fs, docs)


def test_tokenizer_mismatch_is_refused(tmp_path, rng):
    docs = [rng.integers(0, 6, 300) for _ in range(3)]
    ds = make_dataset(tmp_path / "a", docs, 6, tokenizer_sha256="a" * 64)
    other = make_dataset(tmp_path / "b", docs, 6, tokenizer_sha256="b" * 64)
    fs = select_fgrams(Corpus.from_dataset(ds), 3, 20, 2, progress=False)
    fs.save(tmp_path / "set")
    with pytest.raises(UserError, match="tokenized with tokenizer"):
        tags_for_dataset(other, fs, progress=False)
    assert not (tmp_path / "b" / "tags").exists()


def test_tagging_split_across_processes_equals_one_process(tmp_path, rng):
    """Each of P processes (threads here, with a real barrier) tags its share of the dataset:
    the tags saved beside it equal the brute-force ones, shares cutting documents included."""
    import json
    import threading

    docs = [rng.integers(0, 7, int(rng.integers(1, 400))) for _ in range(int(rng.integers(3, 9)))]
    ds = make_dataset(tmp_path / "ds", docs, 7)
    fs = select_fgrams(Corpus.from_dataset(ds), 4, 60, 2, progress=False)
    fs.save(tmp_path / "set")
    fs = FgramSet.load(tmp_path / "set")
    processes = int(rng.integers(2, 5))
    wall = threading.Barrier(processes, timeout=60)
    results, spans = [None] * processes, []
    real_tag_corpus = tag_mod.tag_corpus

    def tag_and_record(*args, **kwargs):
        spans.append(kwargs["span"])
        return real_tag_corpus(*args, **kwargs)

    def process(i):
        results[i] = tags_for_dataset(
            ds,
            fs,
            progress=False,
            workers=1,
            process_index=i,
            process_count=processes,
            barrier=lambda name: wall.wait(),
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tag_mod, "tag_corpus", tag_and_record)
        threads = [threading.Thread(target=process, args=(i,)) for i in range(processes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    want_ids, want_lens = expected(fs, docs)
    for ids, lens in results:
        assert ids.tolist() == want_ids and lens.tolist() == want_lens
    bounds = np.linspace(0, ds.num_tokens, processes + 1).astype(int).tolist()
    assert sorted(spans) == list(
        zip(bounds[:-1], bounds[1:])
    )  # contiguous shares, cutting documents
    stored = tmp_path / "ds" / "tags" / fs.fingerprint[:16]
    assert sorted(p.name for p in stored.iterdir()) == [
        "checksums.json",
        "ids.npy",
        "lengths.npy",
        "meta.json",
    ]
    histogram = np.bincount(want_lens, minlength=fs.max_n + 1).tolist()
    assert json.loads((stored / "meta.json").read_text())["match_length_histogram"] == histogram
    assert not list((tmp_path / "ds" / "tags").glob(".*"))  # no staging directory left
