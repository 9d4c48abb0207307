"""A Hugging Face tokenizer.json works wherever a sentencepiece model does: the library's own
ids, EOS at document ends, exact bytes per token for bits/byte (byte-level pieces included),
and a fingerprint that keeps guarding datasets and f-gram sets."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
from tokenizers import Tokenizer as LibraryTokenizer

import scone_jax.cli.main as cli_main
from scone_jax.config.schema import DataConfig
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.data.hf_tokenizer import HFTokenizer, byte_level_alphabet
from scone_jax.data.tokenize import build_dataset, dataset_tokenizer
from scone_jax.data.tokenizer import load_tokenizer
from scone_jax.errors import UserError
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.tag import tags_for_dataset
from tests.data.hf_helpers import EOS, random_texts, train_byte_level_bpe


@pytest.fixture(scope="module")
def texts():
    return random_texts(random.Random(), 200)


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory, texts):
    return train_byte_level_bpe(tmp_path_factory.mktemp("hf") / "tokenizer.json", texts)


def test_ids_eos_and_fingerprint_are_the_files(hf_path, texts):
    tok = load_tokenizer(hf_path)
    library = LibraryTokenizer.from_file(str(hf_path))
    assert isinstance(tok, HFTokenizer)
    assert tok.sha256 == hashlib.sha256(hf_path.read_bytes()).hexdigest()
    assert tok.eos_id == library.token_to_id(EOS) and tok.vocab_size == library.get_vocab_size()
    rng = random.Random()
    unseen = ["emoji 🦊 and ∑ never seen", *random_texts(rng, 20)]
    for text in [*texts[:20], *unseen]:
        ids = tok.encode(text)
        assert ids == library.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
    written_out = f"a document quoting {EOS} mid-text"  # text, not a document end
    ids = tok.encode(written_out)
    assert tok.eos_id not in ids and tok.decode(ids) == written_out
    assert int(tok.token_byte_lengths()[ids].sum()) == len(written_out.encode("utf-8"))
    assert tok.encode_batch(unseen) == [tok.encode(t) for t in unseen]


def test_token_bytes_sum_to_the_texts_bytes_byte_pieces_included(hf_path):
    tok = load_tokenizer(hf_path)
    lengths = tok.token_byte_lengths()
    assert lengths[tok.eos_id] == 0 and lengths.shape == (tok.vocab_size,)
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    rng = random.Random()
    partial = 0  # pieces that are a part of a multi-byte character
    for text in ["中🦊é", *random_texts(rng, 30)]:
        ids = tok.encode(text)
        assert int(lengths[ids].sum()) == len(text.encode("utf-8")), text
        pieces = [tok.piece(i) for i in ids]
        partial += sum(1 for p in pieces if alphabet[p[0]] >= 0x80 and len(p) == 1)
    assert partial > 0


def test_a_dataset_made_with_it_ends_documents_in_eos(hf_path, texts, tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], tokenizer=str(hf_path))
    ds = build_dataset(cfg, tmp_path / "ds", progress=False)
    tok = dataset_tokenizer(ds)
    assert isinstance(tok, HFTokenizer) and (ds.path / "tokenizer.json").is_file()
    assert ds.tokenizer_sha256 == tok.sha256 and ds.meta["eos_id"] == tok.eos_id
    assert ds.meta["tokenizer_path"] == str((tmp_path / "ds" / "tokenizer.json").absolute())
    docs = [t for t in texts if t.strip()]
    for i, doc in enumerate(docs):
        ids = ds.doc(i)
        assert ids[-1] == tok.eos_id and tok.decode(ids[:-1]) == doc
    # bits per byte: the token bytes of a dataset are its text bytes, exactly (eos counts 0)
    assert int(ds.token_bytes[np.asarray(ds.tokens)].sum()) == ds.meta["num_bytes"]


def test_the_fingerprint_guards_f_gram_sets(hf_path, texts, tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    other = train_byte_level_bpe(tmp_path / "other.json", texts[:50], vocab_size=300)
    ds = build_dataset(
        DataConfig(corpus=[str(tmp_path / "c.jsonl")], tokenizer=str(hf_path)),
        tmp_path / "a",
        progress=False,
    )
    ds_other = build_dataset(
        DataConfig(corpus=[str(tmp_path / "c.jsonl")], tokenizer=str(other)),
        tmp_path / "b",
        progress=False,
    )
    fs = build_fgram_set(
        Corpus.from_dataset(ds), tmp_path / "fg", 3, 200, 2, with_stats=False, progress=False
    )
    assert fs.tokenizer_sha256 == load_tokenizer(hf_path).sha256
    tags_for_dataset(ds, fs, progress=False)
    with pytest.raises(UserError, match="tokenizer"):
        tags_for_dataset(ds_other, fs, progress=False)


def test_the_tokenize_command_takes_it_and_bad_files_are_one_line(
    hf_path, texts, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(cli_main, "COMMANDS", ("tokenize",))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    base = ["tokenize", "--corpus", str(tmp_path / "c.jsonl"), "--no-progress"]
    assert cli_main.main([*base, "--tokenizer", str(hf_path), "--out", str(tmp_path / "ds")]) == 0
    assert TokenizedDataset.open(tmp_path / "ds").tokenizer_sha256 == load_tokenizer(hf_path).sha256
    (tmp_path / "bad.json").write_text('{"model": {"type": "Nope"}}')
    no_eos = train_byte_level_bpe(tmp_path / "noeos.json", texts, specials=())
    capsys.readouterr()
    for tokenizer, needle in [
        (tmp_path / "bad.json", "is not a valid Hugging Face tokenizer.json ("),
        (tmp_path / "missing.json", "missing.json does not exist (expected a Hugging Face"),
        (no_eos, "has no eos piece (expected one when appending eos;"),
    ]:
        out = tmp_path / f"ds_{tokenizer.stem}"
        assert cli_main.main([*base, "--tokenizer", str(tokenizer), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and needle in err, err
        assert not out.exists()
    assert cli_main.main([*base, "--tokenizer", str(no_eos), "--no-eos", "--out", str(out)]) == 0
