"""A run's f-gram set, counted on the training split, and the training stream's f-gram dropout
(train/fgram_inputs.py)."""

import json

import numpy as np

from scone_jax.config import FgramConfig
from scone_jax.data.dataset import TokenizedDataset, write_dataset
from scone_jax.data.pipeline import BatchStream, WindowSource, split_documents
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.train.fgram_inputs import (
    load_or_build_fgram_set,
    prepare_fgram_inputs,
    train_split_corpus,
)


def test_a_set_counted_on_the_training_split_records_the_datasets_tokenizer(tmp_path):
    """`fgrams dump --text` decodes with the tokenizer recorded at build time: a set counted on the
    training split (`train`, `sweep`, `fgrams build --heldout-fraction`) must record it too."""
    tokenizer = tmp_path / "ds" / "tokenizer.model"
    docs = [np.array([3, 4, 5, 3, 4, 5, 3, 4, 5]) for _ in range(4)]
    (tmp_path / "ds").mkdir()
    write_dataset(
        tmp_path / "ds",
        docs,
        8,
        np.ones(8, np.int32),
        tokenizer_sha256="t" * 64,
        tokenizer_path=str(tokenizer),
    )
    dataset = TokenizedDataset.open(tmp_path / "ds")
    corpus = train_split_corpus(dataset, np.array([0, 2, 3]))
    assert corpus.tokenizer_path == str(tokenizer)
    assert corpus.tokenizer_sha256 == "t" * 64
    build_fgram_set(corpus, tmp_path / "fg", max_n=3, num_fgrams=10, min_count=2, progress=False)
    meta = json.loads((tmp_path / "fg" / "meta.json").read_text())
    assert meta["tokenizer_path"] == str(tokenizer)
    assert meta["num_tokens"] == 27


def test_a_given_set_counted_on_the_held_out_documents_too_is_warned_of(
    markov_dataset, tmp_path, capsys
):
    """A set of the whole dataset lets held-out text choose the f-grams: training says so; a set
    of the training split (as `fgrams build --heldout-fraction` counts it) passes quietly."""
    train_ids, eval_ids = split_documents(markov_dataset.num_docs, 0.2, 0)
    assert len(eval_ids)
    sets = {
        "whole": Corpus.from_dataset(markov_dataset),
        "split": train_split_corpus(markov_dataset, train_ids),
    }
    for name, corpus in sets.items():
        build_fgram_set(
            corpus, tmp_path / name, max_n=4, num_fgrams=50, min_count=2, progress=False
        )
    for name, warned in (("whole", True), ("split", False)):
        cfg = FgramConfig(enabled=True, max_n=4, fgram_set=str(tmp_path / name))
        load_or_build_fgram_set(cfg, markov_dataset, train_ids, tmp_path / "run", progress=False)
        err = capsys.readouterr().err
        assert ("held-out document(s) included" in err) == warned, (name, err)
    whole = FgramConfig(enabled=True, max_n=4, fgram_set=str(tmp_path / "whole"))
    prepare_fgram_inputs(  # the session warned once already (on process 0): not again here
        whole, markov_dataset, train_ids, tmp_path / "run", 64, groups=1, progress=False
    )
    assert not capsys.readouterr().err
    load_or_build_fgram_set(  # nothing held out: nothing to warn of
        FgramConfig(enabled=True, max_n=4, fgram_set=str(tmp_path / "whole")),
        markov_dataset,
        np.arange(markov_dataset.num_docs),
        tmp_path / "run",
        progress=False,
    )
    assert not capsys.readouterr().err


def test_a_set_counted_on_another_split_of_the_dataset_is_warned_of_with_its_leaks(
    markov_dataset, tmp_path, capsys, rng
):
    """A set counted with another --heldout-fraction/--split-seed let some of this run's held-out
    documents choose f-grams: training counts them (against a brute-force count); a set whose
    held-out documents cover the run's, or an unrecorded split of it, is handled too."""
    n = markov_dataset.num_docs
    run_seed, set_seed = (int(x) for x in rng.choice(1000, 2, replace=False))
    print("run split seed", run_seed, "set split seed", set_seed)
    train_ids, eval_ids = split_documents(n, 0.2, run_seed)
    sets = {
        "other_seed": (0.2, set_seed),
        "same": (0.2, run_seed),
        "wider_same_seed": (0.4, run_seed),  # holds out a superset of the run's documents
        "unrecorded": (0.2, None),
    }
    for name, (fraction, seed) in sets.items():
        ids = split_documents(n, fraction, set_seed if seed is None else seed)[0]
        build_fgram_set(
            train_split_corpus(markov_dataset, ids, fraction if seed is not None else None, seed),
            tmp_path / name,
            max_n=4,
            num_fgrams=50,
            min_count=2,
            progress=False,
        )
    set_train = set(split_documents(n, 0.2, set_seed)[0].tolist())
    leaked = sum(int(i) in set_train for i in eval_ids)
    assert leaked, "the two splits should differ"
    expected = {
        "other_seed": f"{leaked} of this run's {len(eval_ids)} held-out document(s) chose",
        "same": None,
        "wider_same_seed": None,
        "unrecorded": f"some of this run's {len(eval_ids)} held-out document(s) may have chosen",
    }
    for name, needle in expected.items():
        cfg = FgramConfig(enabled=True, max_n=4, fgram_set=str(tmp_path / name))
        load_or_build_fgram_set(cfg, markov_dataset, train_ids, tmp_path / "run", progress=False)
        err = capsys.readouterr().err
        print(name, err)
        if needle is None:
            assert not err, name
        else:
            assert "counted on another split" in err and needle in err, name
            assert len(err.strip().splitlines()) == 1


def dropping_stream(dataset, tmp_path, rng, **dropout):
    """A run's f-gram inputs with f-gram dropout (`dropout`: the FgramConfig fields) and the
    training stream through them, calibrated."""
    train_ids, _ = split_documents(dataset.num_docs, 0.0, 0)
    cfg = FgramConfig(enabled=True, max_n=4, num_fgrams=500, min_count=2, **dropout)
    fgrams = prepare_fgram_inputs(
        cfg,
        dataset,
        train_ids,
        tmp_path / "run",
        64,
        groups=1,
        progress=False,
        seed=int(rng.integers(2**31)),
    )
    source = WindowSource(dataset, train_ids, 16)
    stream = BatchStream(source, 8, seed=0, transform=fgrams.train_transform())
    fgrams.train_transform().calibrate(stream.raw_batch(k) for k in range(4))
    return fgrams, stream


def test_fgram_dropout_thins_the_training_stream_and_leaves_evaluation_whole(
    markov_dataset, tmp_path, rng
):
    fgrams, stream = dropping_stream(markov_dataset, tmp_path, rng, drop_rate=0.5)
    kept = dropped = 0
    for step in range(20):
        raw = stream.raw_batch(step)
        trained = stream.batch(step)["fgram_ids"]
        whole = fgrams.transform()(raw)["fgram_ids"]  # what evaluation sees
        assert ((trained == whole) | (trained == -1)).all()
        kept += int((trained >= 0).sum())
        dropped += int(((whole >= 0) & (trained == -1)).sum())
    assert abs(dropped / (kept + dropped) - 0.5) < 0.05


def test_backoff_dropout_feeds_the_longest_suffix_in_the_set_to_the_training_stream(
    markov_dataset, tmp_path, rng
):
    fgrams, stream = dropping_stream(markov_dataset, tmp_path, rng, drop_rate=0.5, drop_to="suffix")
    backoff = fgrams.fgram_set.backoff_ids()
    backed_off = 0
    for step in range(20):
        trained = stream.batch(step)["fgram_ids"]
        whole = fgrams.transform()(stream.raw_batch(step))["fgram_ids"]
        fallback = np.where(whole >= 0, backoff[np.maximum(whole, 0)], -1)
        assert ((trained == whole) | (trained == fallback)).all()
        backed_off += int(((trained != whole) & (trained >= 0)).sum())
    assert backed_off > 0


def test_backoff_under_permuted_rows_reports_the_fed_fgrams_own_lengths(
    markov_dataset, tmp_path, rng
):
    """The permuted control reorders the rows F embeds, not the f-grams a position is fed: the
    mean match length is that of the fed f-grams, backoffs included."""
    fgrams, stream = dropping_stream(
        markov_dataset, tmp_path, rng, drop_rate=0.5, drop_to="suffix", permute_rows=True
    )
    set_lengths = np.asarray(fgrams.fgram_set.lengths)
    for step in range(10):
        out = stream.batch(step)
        fed = out["fgram_ids"][out["fgram_ids"] >= 0]
        assert np.isclose(out["fgram_stats"]["mean_match_length"], set_lengths[fed].mean())
