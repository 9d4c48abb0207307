"""The fgrams.permute_rows control (docs/fidelity.md): every f-gram is embedded as another f-gram,
one fixed permutation of the set, so the tags and table size stay and only the n-grams' meaning
goes; such a run trains but is never exported."""

import numpy as np
import pytest

from scone_jax.config import FgramConfig, load_config
from scone_jax.data.pipeline import split_documents
from scone_jax.errors import UserError
from scone_jax.export.table import export_table
from scone_jax.train.fgram_inputs import prepare_fgram_inputs
from scone_jax.train.loop import train
from tests.train.helpers import tiny_overrides


def test_permuted_rows_are_another_fgrams_with_the_same_tags(markov_dataset, tmp_path):
    train_ids, _ = split_documents(markov_dataset.num_docs, 0.0, 0)
    made = {}
    for permute in (False, True):
        cfg = FgramConfig(enabled=True, max_n=4, num_fgrams=500, min_count=2, permute_rows=permute)
        made[permute] = prepare_fgram_inputs(
            cfg, markov_dataset, train_ids, tmp_path / "run", 64, groups=1, progress=False
        ).batcher
    plain, permuted = made[False], made[True]
    np.testing.assert_array_equal(
        plain.tag_ids, permuted.tag_ids
    )  # the same positions match the same ids
    rows = lambda b: [tuple(t[:n]) for t, n in zip(b.fgram_tokens, b.fgram_lengths, strict=True)]  # noqa: E731
    a, b = rows(plain), rows(permuted)
    assert sorted(a) == sorted(b)  # the same f-grams, as many rows
    moved = np.mean([x != y for x, y in zip(a, b, strict=True)])
    assert moved > 0.95, f"only {moved:.0%} of the f-grams were given another's tokens"


def test_a_control_run_trains_and_is_not_exported(markov_dataset, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(
        "tiny_scone",
        tiny_overrides(
            markov_dataset.path,
            run_dir,
            3,
            **{
                "fgrams.max_n": 4,
                "fgrams.num_fgrams": 500,
                "fgrams.min_count": 2,
                "fgrams.n_layers": 1,
                "fgrams.permute_rows": "true",
            },
        ),
    )
    assert train(cfg)["end_step"] == 3
    with pytest.raises(UserError, match="permute_rows"):
        export_table(run_dir, str(tmp_path / "table"), progress=False)
    assert not (tmp_path / "table").exists() and not (tmp_path / "table.partial").exists()
