"""The Beam pipeline (DirectRunner) produces exactly the local backend's set."""

import pytest

pytest.importorskip("apache_beam")

from scone_jax.fgrams.build import select_fgrams  # noqa: E402
from scone_jax.fgrams.corpus import Corpus  # noqa: E402

from ..conftest import make_dataset  # noqa: E402
from .helpers import as_list, corpus_of, random_docs  # noqa: E402
from .reference import brute_select  # noqa: E402


def assert_same(a, b):
    assert as_list(a) == as_list(b)
    assert a.fingerprint == b.fingerprint
    for field in ("survivors_per_length", "candidates_per_length", "cutoff_count", "num_fgrams"):
        assert a.meta[field] == b.meta[field], field


def test_beam_equals_local_on_random_corpora(rng):
    done = 0
    while done < 3:
        docs = random_docs(rng, max_docs=10, max_len=200)
        k, m, s = int(rng.integers(2, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 80))
        if not brute_select(docs, k, s, m):
            continue
        local = select_fgrams(corpus_of(docs), k, s, m, progress=False)
        beam = select_fgrams(corpus_of(docs), k, s, m, backend="beam", progress=False)
        assert_same(beam, local)
        assert as_list(beam) == brute_select(docs, k, s, m)
        done += 1


def test_beam_reads_a_dataset_directory_and_pruning_is_only_an_optimisation(tmp_path, rng):
    from scone_jax.fgrams.beam import count_with_beam

    docs = [rng.integers(0, 7, int(rng.integers(0, 600))) for _ in range(12)]
    ds = make_dataset(tmp_path / "ds", docs, 7)
    corpus = Corpus.from_dataset(ds)
    local = select_fgrams(corpus, 5, 100_000, 3, progress=False)  # S above the number of candidates
    beam = select_fgrams(corpus, 5, 100_000, 3, backend="beam", progress=False, tmp_dir=tmp_path)
    assert_same(beam, local)
    assert local.num_fgrams < 100_000

    def rows(result):
        tokens, lengths, counts = result[:3]
        return sorted((tuple(t[:n].tolist()), int(c)) for t, n, c in zip(tokens, lengths, counts))

    pruned = count_with_beam(corpus, 5, 3, 100, shard_tokens=500)
    unpruned = count_with_beam(corpus, 5, 3, 100, prune=False, shard_tokens=500)
    assert rows(pruned) == rows(unpruned) and len(rows(pruned)) >= 100
    assert pruned[3] == unpruned[3]  # same survivors; pruning only shrinks the candidates
    assert all(pruned[4][n] <= unpruned[4][n] for n in pruned[4])
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # the pipeline's files are cleaned up


def test_cli_beam_backend_matches_local(tmp_path, rng, capsys):
    from scone_jax.cli.main import main

    docs = [rng.integers(0, 6, int(rng.integers(0, 300))) for _ in range(8)]
    a = make_dataset(tmp_path / "a", docs, 6)
    b = make_dataset(tmp_path / "b", docs[::-1], 6)
    common = [
        "--max-n",
        "4",
        "--num-fgrams",
        "60",
        "--min-count",
        "2",
        "--no-progress",
        "--no-stats",
    ]
    assert main(["fgrams", "build", str(a.path), "--out", str(tmp_path / "local"), *common]) == 0
    assert (
        main(
            [
                "fgrams",
                "build",
                str(a.path),
                "--out",
                str(tmp_path / "beam"),
                "--backend",
                "beam",
                "--beam-dataset",
                str(a.path),
                "--beam-no-prune",
                "--beam-options=--runner=DirectRunner --direct_num_workers=1",
                *common,
            ]
        )
        == 0
    )
    capsys.readouterr()
    main(["fgrams", "dump", str(tmp_path / "local")])
    local = capsys.readouterr().out
    main(["fgrams", "dump", str(tmp_path / "beam")])
    assert capsys.readouterr().out == local and local
    code = main(
        [
            "fgrams",
            "build",
            str(a.path),
            "--out",
            str(tmp_path / "bad"),
            "--backend",
            "beam",
            "--beam-dataset",
            str(b.path),
            *common,
        ]
    )
    assert code == 2 and "not a copy" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    code = main(
        ["fgrams", "build", str(a.path), "--out", str(tmp_path / "bad"), "--beam-no-prune", *common]
    )
    assert code == 2 and "need --backend beam" in capsys.readouterr().err
