"""sentencepiece tokenizer: training, exact round trips, byte lengths, fingerprints, bad models."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from scone_jax.data.text import default_corpus
from scone_jax.data.tokenizer import META_SYMBOL, Tokenizer
from scone_jax.errors import UserError

VOCAB = 512


@pytest.fixture(scope="module")
def corpus():
    return default_corpus(max_mb=0.2)


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def trained(request, corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "tok.model"
    return Tokenizer.train(corpus, VOCAB, request.param, path)


@pytest.fixture
def rng():
    seed = random.randrange(2**32)
    print(f"seed={seed}")  # shown by pytest when a test fails
    return random.Random(seed)


def random_unicode(rng: random.Random, n: int) -> str:
    """Any code point except surrogates (not encodable) and U+2581, sentencepiece's space symbol;
    half the characters from a small set of letters and whitespace so words and runs occur."""
    chars = []
    for _ in range(n):
        if rng.random() < 0.5:
            chars.append(rng.choice("the quick brown fox\n\t\r  "))
            continue
        while True:
            c = rng.randrange(0x110000)
            if not 0xD800 <= c < 0xE000 and chr(c) != META_SYMBOL:
                break
        chars.append(chr(c))
    return "".join(chars)


def test_training_gives_the_requested_vocab_and_special_ids(trained):
    assert trained.vocab_size == VOCAB
    assert (trained.bos_id, trained.eos_id) == (1, 2)
    assert trained.path.is_file() and trained.path.is_absolute()
    assert len(trained.sha256) == 64


def test_round_trip_of_random_unicode(trained, rng):
    texts = [random_unicode(rng, rng.randint(0, 60)) for _ in range(200)]
    texts += ["", " ", "  leading and trailing  ", "\n\nnew\nlines\n", "\x00nul"]
    for text, ids in zip(texts, trained.encode_batch(texts)):
        assert ids == trained.encode(text)
        assert trained.decode(ids) == text
        assert trained.decode(np.asarray(ids, dtype=np.uint16)) == text


def test_token_byte_lengths_sum_to_the_text_bytes(trained, rng, corpus):
    # Rule: for text without U+2581, sum(lengths[encode(text)]) == len(text.encode("utf-8")) + 1
    # when the text is non-empty (sentencepiece's dummy-prefix space), and 0 for "".
    lengths = trained.token_byte_lengths()
    assert lengths.dtype == np.int32 and lengths.shape == (VOCAB,)
    assert lengths[0] == lengths[trained.bos_id] == lengths[trained.eos_id] == 0
    texts = [random_unicode(rng, rng.randint(0, 60)) for _ in range(200)] + corpus[:20]
    for text in texts:
        expected = len(text.encode("utf-8")) + (1 if text else 0)
        assert int(lengths[trained.encode(text)].sum()) == expected, repr(text)


def test_training_is_deterministic_and_sha_survives_load(trained, corpus, tmp_path):
    model_type = "bpe" if "bpe" in str(trained.path) else "unigram"
    again = Tokenizer.train(corpus, VOCAB, model_type, tmp_path / "again.model")
    assert again.sha256 == trained.sha256
    loaded = Tokenizer.load(trained.path)
    assert loaded.sha256 == trained.sha256 == hashlib.sha256(trained.path.read_bytes()).hexdigest()
    assert loaded.encode("A sentence to encode.") == trained.encode("A sentence to encode.")
    assert not list(tmp_path.glob(".*tmp*"))  # the atomic write left no temporary file


def test_other_text_gives_another_fingerprint(corpus, tmp_path):
    a = Tokenizer.train(corpus[:20], 400, "bpe", tmp_path / "a.model")
    b = Tokenizer.train(corpus[1:21], 400, "bpe", tmp_path / "b.model")
    assert a.sha256 != b.sha256


def test_load_missing_or_corrupt_model_is_a_user_error(tmp_path, rng):
    with pytest.raises(UserError, match="nope.model does not exist"):
        Tokenizer.load(tmp_path / "nope.model")
    (tmp_path / "junk.model").write_bytes(rng.randbytes(rng.randint(1, 4096)))
    with pytest.raises(UserError, match="junk.model is not a valid sentencepiece model"):
        Tokenizer.load(tmp_path / "junk.model")
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(UserError, match="empty.model is empty"):
        Tokenizer.load(tmp_path / "empty.model")


def test_vocab_size_out_of_range_for_the_corpus_is_explained(tmp_path):
    docs = ["a tiny corpus with few pieces", "just two lines"]
    with pytest.raises(UserError, match=r"vocab_size=100 is too small .*expected >= \d+"):
        Tokenizer.train(docs, 100, "bpe", tmp_path / "t.model")
    with pytest.raises(UserError, match=r"vocab_size=5000 is too large .*expected <= \d+"):
        Tokenizer.train(docs, 5000, "unigram", tmp_path / "t.model")
    with pytest.raises(UserError, match="model_type='word'"):
        Tokenizer.train(docs, 300, "word", tmp_path / "t.model")
    with pytest.raises(UserError, match="empty corpus"):
        Tokenizer.train(["", " \n "], 300, "bpe", tmp_path / "t.model")
    assert not (tmp_path / "t.model").exists()
