import json

import numpy as np

from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.stats import compute_stats, format_stats, save_stats
from scone_jax.fgrams.store import FgramSet

from .helpers import corpus_of
from .reference import brute_tag


def test_build_writes_stats_that_match_brute_force(tmp_path, rng):
    docs = [rng.integers(0, 5, int(rng.integers(0, 500))) for _ in range(8)]
    fs = build_fgram_set(corpus_of(docs), tmp_path / "set", 4, 30, 3, progress=False)
    stats = json.loads((tmp_path / "set" / "stats.json").read_text())
    assert (tmp_path / "set" / "stats.png").stat().st_size > 1000
    table = {fs.fgram(i): i for i in range(fs.num_fgrams)}
    _, lens = brute_tag(docs, table, 4)
    lens = np.array(lens)
    cov = stats["coverage"]
    assert cov["num_tokens"] == len(lens)
    assert cov["matched_tokens"] == int(np.count_nonzero(lens))
    assert np.isclose(cov["coverage"], np.mean(lens > 0))
    assert np.isclose(cov["mean_match_length"], lens[lens > 0].mean())
    assert cov["tokens_matched_per_length"] == {str(n): int(np.sum(lens == n)) for n in (2, 3, 4)}
    s = stats["fgram_set"]
    assert s["cutoff_count"] == int(fs.counts[-1]) == fs.cutoff_count
    assert s["fgrams_per_length"] == {str(n): int(np.sum(fs.lengths == n)) for n in (2, 3, 4)}
    assert sum(s["count_histogram"]["fgrams"]) == fs.num_fgrams
    text = format_stats(stats)
    assert "cutoff count" in text and "coverage" in text


def test_stats_without_a_corpus(tmp_path, rng):
    docs = [rng.integers(0, 4, 300)]
    fs = build_fgram_set(
        corpus_of(docs), tmp_path / "set", 3, 10, 2, progress=False, with_stats=False
    )
    assert not (tmp_path / "set" / "stats.json").exists()
    stats = compute_stats(FgramSet.load(tmp_path / "set"))
    assert "coverage" not in stats and stats["fgram_set"]["num_fgrams"] == fs.num_fgrams
    save_stats(stats, tmp_path / "out" / "s.json", tmp_path / "out" / "s.png")
    assert json.loads((tmp_path / "out" / "s.json").read_text()) == stats
    assert (tmp_path / "out" / "s.png").is_file()
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []
