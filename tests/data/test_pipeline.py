import numpy as np
import pytest

from scone_jax.data.pipeline import BatchStream, WindowSource, eval_batches, split_documents
from scone_jax.errors import UserError
from tests.conftest import make_dataset, markov_documents


@pytest.fixture
def dataset(tmp_path, rng):
    docs = markov_documents(rng, 40, 30, 60)
    docs[3] = docs[3][:1]  # a single-token document
    docs[5] = docs[5][:0]  # an empty document
    return make_dataset(tmp_path / "ds", docs, 40)


def test_split_is_a_seeded_partition():
    train, held = split_documents(100, 0.1, seed=3)
    assert len(held) == 10 and np.intersect1d(train, held).size == 0
    assert np.array_equal(np.union1d(train, held), np.arange(100))
    assert np.array_equal(split_documents(100, 0.1, 3)[1], held)
    assert not np.array_equal(split_documents(100, 0.1, 4)[1], held)
    assert len(split_documents(5, 0.01, 0)[1]) == 1 and len(split_documents(5, 0.0, 0)[1]) == 0


def test_windows_pack_the_selected_documents(dataset, rng):
    ids = np.sort(rng.choice(dataset.num_docs, 20, replace=False))
    src = WindowSource(dataset, ids, seq_len=16)
    stream = np.concatenate([dataset.doc(i) for i in ids])
    assert len(src) == (len(stream) - 1) // 16
    for w in range(len(src)):
        item = src[w]
        np.testing.assert_array_equal(item["tokens"], stream[w * 16 : w * 16 + 17])
        np.testing.assert_array_equal(dataset.tokens[item["positions"]], item["tokens"])


def test_each_epoch_visits_every_window_once(dataset):
    src = WindowSource(dataset, np.arange(dataset.num_docs), seq_len=8)
    stream = BatchStream(src, global_batch=1, seed=7)
    n = len(src)
    epoch1 = [int(stream.batch(s)["positions"][0, 0]) for s in range(n)]
    epoch2 = [int(stream.batch(s)["positions"][0, 0]) for s in range(n, 2 * n)]
    all_starts = sorted(int(src[w]["positions"][0]) for w in range(n))
    assert sorted(epoch1) == all_starts and sorted(epoch2) == all_starts
    assert epoch1 != epoch2  # reshuffled each epoch


def test_batches_are_a_function_of_seed_and_step(dataset):
    src = WindowSource(dataset, np.arange(dataset.num_docs), seq_len=8)
    a, b = BatchStream(src, 4, seed=1), BatchStream(src, 4, seed=1)
    for step in (0, 5, 17):
        np.testing.assert_array_equal(a.batch(step)["inputs"], b.batch(step)["inputs"])
    assert not np.array_equal(a.batch(3)["inputs"], BatchStream(src, 4, seed=2).batch(3)["inputs"])
    it = a.iterate(5)
    for step in range(5, 9):
        np.testing.assert_array_equal(next(it)["inputs"], a.batch(step)["inputs"])


@pytest.mark.parametrize("processes", [2, 4])
def test_hosts_read_disjoint_rows_whose_union_is_the_global_batch(dataset, processes):
    src = WindowSource(dataset, np.arange(dataset.num_docs), seq_len=8)
    single = BatchStream(src, 8, seed=5)
    hosts = [
        BatchStream(src, 8, seed=5, process_index=p, process_count=processes)
        for p in range(processes)
    ]
    for step in range(6):
        parts = [h.batch(step)["positions"] for h in hosts]
        np.testing.assert_array_equal(np.concatenate(parts), single.batch(step)["positions"])
        starts = [set(p[:, 0].tolist()) for p in parts]
        assert all(
            not (starts[i] & starts[j]) for i in range(processes) for j in range(i + 1, processes)
        )


def test_inputs_and_targets_are_shifted(dataset):
    src = WindowSource(dataset, np.arange(dataset.num_docs), seq_len=8)
    b = BatchStream(src, 2, seed=0).batch(0)
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])


def test_errors(dataset):
    src = WindowSource(dataset, np.arange(dataset.num_docs), seq_len=8)
    with pytest.raises(UserError, match="not divisible"):
        BatchStream(src, 6, seed=0, process_count=4)
    with pytest.raises(UserError, match="fewer than one window"):
        BatchStream(WindowSource(dataset, np.array([3, 5]), seq_len=8), 2, seed=0)
    with pytest.raises(UserError, match="fewer than one eval batch"):
        eval_batches(WindowSource(dataset, np.array([0]), seq_len=8), 64, 2)
