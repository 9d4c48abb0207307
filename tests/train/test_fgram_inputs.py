"""A run's f-gram set, counted on the training split (train/fgram_inputs.py)."""

import json

import numpy as np

from scone_jax.data.dataset import TokenizedDataset, write_dataset
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.train.fgram_inputs import train_split_corpus


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
