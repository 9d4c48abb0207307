"""What a SCONE batch carries: every position's longest f-gram over its document's token stream,
reaching back before the window start but never into the previous document."""

import numpy as np
import pytest

from scone_jax.config import FgramConfig
from scone_jax.data.pipeline import BatchStream, WindowSource, split_documents
from scone_jax.train.fgram_inputs import prepare_fgram_inputs
from tests.conftest import make_dataset, markov_documents
from tests.fgrams.reference import brute_tag


def test_batches_carry_each_positions_longest_match_within_its_document(tmp_path, rng):
    vocab, seq_len = 12, 8  # short windows over short documents: matches cross both boundaries
    docs = markov_documents(rng, vocab, 40, 12, branching=2)
    dataset = make_dataset(tmp_path / "data", docs, vocab)
    cfg = FgramConfig(enabled=True, max_n=5, num_fgrams=400, min_count=2)
    train_ids, _ = split_documents(dataset.num_docs, 0.0, 0)
    inputs = prepare_fgram_inputs(
        cfg, dataset, train_ids, tmp_path / "run", 4 * seq_len, groups=1, progress=False
    )
    fs = inputs.fgram_set
    want_ids, want_lengths = (
        np.array(a) for a in brute_tag(docs, {fs.fgram(i): i for i in range(fs.num_fgrams)}, 5)
    )
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    stream = BatchStream(
        WindowSource(dataset, train_ids, seq_len),
        4,
        seed=int(rng.integers(1 << 30)),
        transform=inputs.batcher,
    )
    reached_back = crossed_a_document = 0
    for step in range(12):
        batch = stream.batch(step)
        positions = batch["positions"]
        assert batch["fgram_ids"].tolist() == want_ids[positions].tolist()
        lengths = want_lengths[positions]
        reached_back += int((lengths > np.arange(seq_len) + 1).sum())  # starts before the window
        crossed_a_document += int((doc_of[positions] != doc_of[positions[:, :1]]).sum())
        for row, t in zip(*np.nonzero(batch["fgram_ids"] >= 0)):
            n, p = int(lengths[row, t]), int(positions[row, t])
            assert fs.fgram(int(batch["fgram_ids"][row, t])) == tuple(
                dataset.tokens[p - n + 1 : p + 1].tolist()
            )
            assert doc_of[p - n + 1] == doc_of[p]  # all of it inside this position's document
    assert reached_back > 0 and crossed_a_document > 0


def spelled(forest, output: int) -> tuple[int, ...]:
    """The f-gram the node behind flat output slot `output` spells, read from the buffers."""
    per_group = forest.outputs.shape[-1]
    group, slot = divmod(output, per_group)
    node = int(forest.outputs[group, slot])
    block, within = divmod(node, forest.nodes.shape[-1])
    path = forest.paths[group, block, within]
    return tuple(int(t) for t in forest.nodes[group, block, path[path >= 0]])


@pytest.mark.parametrize("permute", [False, True])
def test_suffix_rows_point_at_each_fgram_and_its_suffixes_in_the_set(permute, tmp_path, rng):
    """With fgrams.suffix_rows every matched position points at K - 1 outputs: the f-gram it is
    embedded as, then each proper suffix of that f-gram in the set (2 tokens or more), longest
    first, then nothing; found here by brute force over the set's f-grams (and under the
    permuted control, the suffixes of the f-gram a position is embedded as)."""
    vocab, seq_len, k = 10, 8, 5
    docs = markov_documents(rng, vocab, 40, 14, branching=2)
    dataset = make_dataset(tmp_path / "data", docs, vocab)
    cfg = FgramConfig(
        enabled=True, max_n=k, num_fgrams=300, min_count=2, suffix_rows=True, permute_rows=permute
    )
    train_ids, _ = split_documents(dataset.num_docs, 0.0, 0)
    inputs = prepare_fgram_inputs(
        cfg, dataset, train_ids, tmp_path / "run", 4 * seq_len, groups=2, progress=False
    )
    batcher = inputs.batcher
    embedded_as = [
        tuple(int(t) for t in tokens[:n])
        for tokens, n in zip(batcher.fgram_tokens, batcher.fgram_lengths, strict=True)
    ]
    in_set = set(embedded_as)
    stream = BatchStream(
        WindowSource(dataset, train_ids, seq_len),
        4,
        seed=int(rng.integers(1 << 30)),
        transform=batcher,
    )
    chains_longer_than_one = 0
    for step in range(6):
        batch = stream.batch(step)
        index, ids = batch["forest"].index, batch["fgram_ids"]
        assert index.shape == (*ids.shape, k - 1)
        for row, t in np.ndindex(*ids.shape):
            if ids[row, t] < 0:
                assert (index[row, t] == -1).all()
                continue
            fgram = embedded_as[ids[row, t]]
            want = [fgram] + [fgram[j:] for j in range(1, len(fgram) - 1) if fgram[j:] in in_set]
            links = index[row, t][index[row, t] >= 0]
            assert (index[row, t, len(links) :] == -1).all()  # the chain, then nothing
            assert [spelled(batch["forest"], int(o)) for o in links] == want
            chains_longer_than_one += len(want) > 1
    assert chains_longer_than_one > 0
