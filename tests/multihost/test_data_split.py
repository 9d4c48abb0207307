"""Each process reads only its rows of every global batch; together they are the single-process
batch."""

import numpy as np
import pytest

from scone_jax.data.pipeline import BatchStream, WindowSource, eval_batches, split_documents
from tests.conftest import make_dataset, markov_documents


@pytest.fixture
def source(tmp_path, rng):
    dataset = make_dataset(tmp_path / "ds", markov_documents(rng, 50, 40, 200), 50)
    train_ids, _ = split_documents(dataset.num_docs, 0.1, seed=0)
    return WindowSource(dataset, train_ids, 16)


@pytest.mark.parametrize("processes", [2, 4])
def test_train_batches_are_disjoint_and_cover_the_global_batch(source, processes):
    whole = BatchStream(source, 16, seed=7)
    parts = [
        BatchStream(source, 16, seed=7, process_index=p, process_count=processes)
        for p in range(processes)
    ]
    steps = range(0, 3 * len(source) // 16)  # past an epoch boundary: a new permutation
    for step in steps:
        rows = [part.batch(step) for part in parts]
        assert all(r["inputs"].shape == (16 // processes, 16) for r in rows)
        if step * 16 // len(source) == (step * 16 + 15) // len(
            source
        ):  # within one epoch (one permutation)
            starts = np.concatenate([r["positions"][:, 0] for r in rows])
            assert len(np.unique(starts)) == 16  # no window read by two processes
        for key in ("inputs", "targets", "positions"):
            np.testing.assert_array_equal(
                np.concatenate([r[key] for r in rows]), whole.batch(step)[key]
            )


def test_eval_batches_split_the_same_way(source):
    whole = eval_batches(source, 8, 3)
    parts = [eval_batches(source, 8, 3, process_index=p, process_count=2) for p in range(2)]
    for k, batch in enumerate(whole):
        np.testing.assert_array_equal(
            np.concatenate([parts[0][k]["inputs"], parts[1][k]["inputs"]]), batch["inputs"]
        )
