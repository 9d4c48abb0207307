import itertools
import json

import numpy as np
import pytest

from scone_jax.errors import UserError
from scone_jax.fgrams import keys as keymod
from scone_jax.fgrams.build import build_fgram_set, select_fgrams
from scone_jax.fgrams.store import FgramSet, KeyCollisionError

from .helpers import as_list, corpus_of


@pytest.fixture
def small_set(rng):
    docs = [rng.integers(0, 5, int(rng.integers(50, 300))) for _ in range(5)]
    return docs, select_fgrams(corpus_of(docs, vocab_size=5), 4, 40, 2, progress=False)


def test_round_trip(tmp_path, small_set):
    _, fs = small_set
    fs.save(tmp_path / "set")
    back = FgramSet.load(tmp_path / "set")
    assert as_list(back) == as_list(fs)
    assert back.fingerprint == fs.fingerprint and back.meta == fs.meta
    assert back.tokens.dtype == np.int32 and back.tokens.shape == (fs.num_fgrams, 4)
    assert np.all(back.tokens[back.lengths == 2][:, 2:] == -1)
    assert np.all(back.keys[1:] > back.keys[:-1])
    for i in range(fs.num_fgrams):  # the serving lookup, by the fixed key
        assert back.lookup_keys([keymod.fgram_key(back.fgram(i), back.key_seed)])[0] == i
    assert back.lookup_keys([keymod.fgram_key([9, 9, 9])])[0] == -1
    meta = json.loads((tmp_path / "set" / "meta.json").read_text())
    for field in (
        "max_n",
        "num_fgrams",
        "min_count",
        "cutoff_count",
        "tokenizer_sha256",
        "corpus_fingerprint",
        "key_hash",
        "key_seed",
        "fingerprint",
    ):
        assert field in meta


def test_corruption_is_detected(tmp_path, small_set):
    _, fs = small_set
    fs.save(tmp_path / "set")
    counts = np.load(tmp_path / "set" / "counts.npy")
    counts[0] += 1
    np.save(tmp_path / "set" / "counts.npy", counts)
    with pytest.raises(UserError, match="checksum"):
        FgramSet.load(tmp_path / "set")
    np.save(tmp_path / "set" / "counts.npy", counts[:-1])
    with pytest.raises(UserError, match="counts.npy has .* bytes"):
        FgramSet.load(tmp_path / "set")
    (
        tmp_path / "set" / "checksums.json"
    ).unlink()  # a set saved before manifests: its own checks still apply
    with pytest.raises(UserError, match="shape"):
        FgramSet.load(tmp_path / "set")
    np.save(
        tmp_path / "set" / "counts.npy", counts
    )  # right shape, wrong values: the arrays' sha256
    with pytest.raises(UserError, match="counts.npy fails its checksum; the set is corrupt"):
        FgramSet.load(tmp_path / "set")
    with pytest.raises(UserError, match="not an f-gram set"):
        FgramSet.load(tmp_path)


def test_existing_output_is_refused(tmp_path, small_set):
    docs, _ = small_set
    (tmp_path / "set").mkdir()
    with pytest.raises(UserError, match="already exists"):
        build_fgram_set(corpus_of(docs), tmp_path / "set", 3, 10, 2, progress=False)


def test_a_key_collision_is_resolved_by_reseeding(monkeypatch, capsys, small_set):
    docs, good = small_set
    real = keymod.fgram_keys

    def weak(tokens, lengths, seed=0):  # every f-gram collides under seed 0
        return np.zeros(len(lengths), np.uint64) if seed == 0 else real(tokens, lengths, seed)

    monkeypatch.setattr(keymod, "fgram_keys", weak)
    fs = select_fgrams(corpus_of(docs, vocab_size=5), 4, 40, 2, progress=False)
    assert "share the 64-bit key" in capsys.readouterr().err
    assert fs.key_seed == 1 and as_list(fs) == as_list(good)
    assert len(np.unique(fs.keys)) == fs.num_fgrams
    for i in range(fs.num_fgrams):
        assert fs.lookup_keys([keymod.fgram_key(fs.fgram(i), 1)])[0] == i


def test_an_unresolvable_collision_is_refused(monkeypatch, small_set):
    docs, _ = small_set
    monkeypatch.setattr(
        keymod, "fgram_keys", lambda tokens, lengths, seed=0: np.zeros(len(lengths), np.uint64)
    )
    with pytest.raises(KeyCollisionError, match="collide"):
        select_fgrams(corpus_of(docs, vocab_size=5), 4, 40, 2, progress=False)


def test_backoff_ids_are_each_fgrams_longest_proper_suffix_in_the_set(rng):
    """A random subset of all n-grams over 3 tokens: unlike a counted set it has gaps, so the
    longest suffix in the set is often not the (n-1)-suffix."""
    seed = int(rng.integers(2**31))
    print("seed", seed)
    local = np.random.default_rng(seed)
    every = [w for n in range(2, 6) for w in itertools.product(range(3), repeat=n)]
    subset = {every[i] for i in local.choice(len(every), 150, replace=False)}
    # plant a 5-gram whose longest suffix in the set is `cut` tokens shorter, for each cut a
    # 5-gram can take, so a random subset cannot leave one out; each ends in its own token, so
    # no planting undoes another's
    for cut, end in zip((1, 2, 3), local.permutation(3).tolist(), strict=True):
        w = (*local.integers(0, 3, 4).tolist(), end)
        subset.add(w)
        subset.difference_update(w[c:] for c in range(1, cut))
        subset.add(w[cut:])
    chosen = sorted(subset, key=lambda w: (len(w), w))
    tokens = np.full((len(chosen), 5), -1)
    for i, w in enumerate(chosen):
        tokens[i, : len(w)] = w
    fs = FgramSet.create(
        tokens, [len(w) for w in chosen], np.ones(len(chosen)), max_n=5, min_count=1, key_vocab=3
    )
    by_tokens = {fs.fgram(i): i for i in range(fs.num_fgrams)}
    want = []
    for i in range(fs.num_fgrams):
        w = fs.fgram(i)
        suffixes = (w[cut:] for cut in range(1, len(w) - 1))
        want.append(next((by_tokens[s] for s in suffixes if s in by_tokens), -1))
    got = fs.backoff_ids()
    assert got.tolist() == want
    assert (got[fs.lengths == 2] == -1).all()
    cut = fs.lengths - fs.lengths[np.maximum(got, 0)]
    assert {1, 2, 3} <= set(cut[got >= 0].tolist())  # every cut a 5-gram can take occurred
