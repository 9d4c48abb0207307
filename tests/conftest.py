"""Shared fixtures. Tests run on 8 fake CPU devices (set here too, in case pytest is run bare)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _shared_data() -> Path:
    """../shared/data beside the checkout; SCONE_SHARED_DATA or /work/shared/data for clones
    elsewhere."""
    candidates = [
        os.environ.get("SCONE_SHARED_DATA", ""),
        Path(__file__).resolve().parents[2] / "shared" / "data",
        "/work/shared/data",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return Path(candidates[1])


SHARED_DATA = _shared_data()


def markov_documents(
    rng: np.random.Generator, vocab: int, num_docs: int, mean_len: int, branching: int = 3
) -> list[np.ndarray]:
    """Documents from a sparse random Markov chain: learnable structure, fresh each call."""
    successors = rng.integers(1, vocab, size=(vocab, branching))
    docs = []
    for _ in range(num_docs):
        n = int(rng.integers(mean_len // 2, mean_len * 3 // 2))
        seq = np.empty(n, np.int64)
        seq[0] = rng.integers(1, vocab)
        choices = rng.integers(0, branching, size=n)
        for i in range(1, n):
            seq[i] = successors[seq[i - 1], choices[i]]
        docs.append(seq)
    return docs


def make_dataset(path: Path, docs, vocab: int, tokenizer_sha256: str = "t" * 64):
    from scone_jax.data.dataset import TokenizedDataset, write_dataset

    path.mkdir(parents=True)
    write_dataset(
        path,
        docs,
        vocab,
        np.ones(vocab, np.int32),
        tokenizer_sha256=tokenizer_sha256,
        corpus_sha256="c" * 64,
    )
    return TokenizedDataset.open(path)


@pytest.fixture
def rng(request):
    """Fresh random inputs each run; SCONE_TEST_SEED=<printed seed> replays a run's."""
    replay = os.environ.get("SCONE_TEST_SEED")
    seed = int(replay) if replay else int(np.random.SeedSequence().entropy % (2**32))
    print(f"random seed for {request.node.name}: {seed} (replay: SCONE_TEST_SEED={seed})")
    return np.random.default_rng(seed)


@pytest.fixture
def markov_dataset(tmp_path, rng):
    """A fresh learnable tokenized dataset (vocab 64, ~40k tokens)."""
    vocab = 64
    return make_dataset(tmp_path / "markov", markov_documents(rng, vocab, 80, 500), vocab)
