"""The Beam pipeline on a real multi-worker engine: the FnApi runner with 2 SDK worker
processes (gRPC control, data and state planes, as on a cluster), offline, on a corpus cut into
many shards; the set equals the local backend's and the brute-force reference's, and the
shards were counted in at least 2 processes other than this one (`make test-beam`)."""

import numpy as np
import pytest

pytest.importorskip("apache_beam")

from scone_jax.fgrams.beam import worker_name  # noqa: E402
from scone_jax.fgrams.beam_runner import local_args  # noqa: E402
from scone_jax.fgrams.build import select_fgrams  # noqa: E402

from .helpers import as_list, corpus_of  # noqa: E402
from .reference import brute_select  # noqa: E402
from .test_beam import assert_same  # noqa: E402


@pytest.mark.slow
def test_two_worker_processes_count_the_shards_and_agree_with_local(rng):
    vocab = int(rng.integers(5, 40))
    p = 1.0 / np.arange(1, vocab + 1) ** 1.2
    docs = [
        rng.choice(vocab, int(rng.integers(0, 1500)), p=p / p.sum()) for _ in range(40)
    ]  # Zipf-like, so long n-grams repeat
    k, m, s, shard = 5, int(rng.integers(2, 5)), int(rng.integers(50, 400)), 1000
    print(f"vocab {vocab}, {sum(map(len, docs))} tokens, min count {m}, S={s}")
    local = select_fgrams(corpus_of(docs), k, s, m, progress=False)
    beam = select_fgrams(
        corpus_of(docs),
        k,
        s,
        m,
        backend="beam",
        beam_options=local_args(2),
        beam_shard_tokens=shard,
        progress=False,
    )
    assert_same(beam, local)
    assert as_list(beam) == brute_select(docs, k, s, m)
    workers = beam.meta["beam_worker_tokens"]
    print(f"tokens counted per worker process: {workers}")
    assert len(workers) >= 2 and worker_name() not in workers
    assert sum(workers.values()) == (k - 1) * sum(map(len, docs))
