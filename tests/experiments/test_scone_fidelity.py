"""The fidelity grid's bookkeeping (experiments/scone_fidelity.py): every variant is a config
that loads, is paired with a baseline of its own family and recipe, and writes its own log."""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from scone_jax.config.load import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location(
        "scone_fidelity", REPO / "experiments" / "scone_fidelity.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variant_loads_and_has_a_plain_baseline_with_its_recipe(fidelity):
    for variant, (preset, overrides) in fidelity.VARIANTS.items():
        cfg = load_config(preset, [*fidelity.COMMON, *overrides])
        baseline = fidelity.baseline_of(variant)
        base_preset, base_overrides = fidelity.VARIANTS[baseline]
        base_cfg = load_config(base_preset, [*fidelity.COMMON, *base_overrides])
        assert not base_cfg.fgrams.enabled, (variant, baseline)
        assert base_cfg.model.family == cfg.model.family, (variant, baseline)
        # the same split and schedule: only the model may differ from its baseline
        assert base_cfg.data == cfg.data, (variant, baseline)
        assert base_cfg.optim.warmup_steps == cfg.optim.warmup_steps, (variant, baseline)
        if cfg.fgrams.enabled:  # a baseline at another rate is compared with the plain one
            for field in ("lr", "weight_decay"):
                assert getattr(base_cfg.optim, field) == getattr(cfg.optim, field), (variant, field)


def test_recipe_variants_pair_with_the_baseline_of_their_recipe(fidelity):
    assert fidelity.baseline_of("tiny_llama_scone_split2") == "tiny_llama_split2"
    assert fidelity.baseline_of("tiny_scone_warmup20") == "tiny_warmup20"
    assert fidelity.baseline_of("tiny_llama_scone_drop0.05") == "tiny_llama"
    assert fidelity.baseline_of("tiny_scone") == "tiny"
    assert fidelity.baseline_of("tiny_llama_scone_lr1.5e-3") == "tiny_llama_lr1.5e-3"
    assert fidelity.baseline_of("tiny_llama_scone_wd0.03") == "tiny_llama_wd0.03"


def test_variants_whose_names_share_a_prefix_up_to_a_dot_keep_separate_logs(
    fidelity, tmp_path, monkeypatch
):
    logs = []
    monkeypatch.setattr(fidelity, "scone_jax", lambda *args, log: logs.append(log))
    for variant in ("tiny_llama_scone_drop0.05", "tiny_llama_scone_drop0.1"):
        fidelity.run_point(tmp_path, tmp_path / "data", "wikitext_valid", variant, 0, 1500)
    assert len(set(logs)) == 2
    assert [p.name for p in logs] == [
        "tiny_llama_scone_drop0.05_s0_1500.log",
        "tiny_llama_scone_drop0.1_s0_1500.log",
    ]


def test_pynews_is_the_decompressed_release_notes_split_by_paragraph(
    fidelity, tmp_path, monkeypatch
):
    share, work = tmp_path / "share", tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(fidelity, "SYSTEM_SHARE", share)
    assert fidelity.corpus_args("pynews", work) is None  # no Python docs installed: skipped
    text = "What's New\n\nbpo-1: a fix.\n\ngh-2: another.\n"
    (share / "doc" / "python3.11").mkdir(parents=True)
    (share / "doc" / "python3.11" / "NEWS.gz").write_bytes(gzip.compress(text.encode()))
    args = fidelity.corpus_args("pynews", work)
    assert args == ["--corpus", str(work / "pynews.txt"), "--doc-split", "blank_line"]
    assert (work / "pynews.txt").read_text() == text
    assert sorted(p.name for p in work.iterdir()) == ["pynews.txt"]  # no temporary file left


def test_an_unknown_corpus_names_the_known_ones(fidelity, tmp_path):
    with pytest.raises(
        SystemExit, match=r"unknown corpus 'nope' \(expected one of embedded, .*pynews"
    ):
        fidelity.corpus_args("nope", tmp_path)


def test_a_quarter_corpus_is_the_first_quarter_of_its_paragraphs(fidelity, tmp_path, monkeypatch):
    share, work = tmp_path / "share", tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(fidelity, "SYSTEM_SHARE", share)
    assert fidelity.corpus_args("pynews_quarter", work) is None  # no whole corpus, no quarter
    paragraphs = [f"paragraph {i}\nits second line" for i in range(10)]
    (share / "doc" / "python3.12").mkdir(parents=True)
    news = "\n\n\n".join(paragraphs).encode()  # extra blank lines are no paragraph
    (share / "doc" / "python3.12" / "NEWS.gz").write_bytes(gzip.compress(news))
    args = fidelity.corpus_args("pynews_quarter", work)
    assert args == ["--corpus", str(work / "pynews_quarter.txt"), "--doc-split", "blank_line"]
    kept = [p.strip() for p in (work / "pynews_quarter.txt").read_text().split("\n\n")]
    assert kept == paragraphs[:2]


def test_the_cost_curve_plots_known_variants_and_needs_a_baseline(fidelity, tmp_path):
    plotted = [v for series in fidelity.COST_CURVE_SERIES.values() for v in series]
    assert set(plotted) <= set(fidelity.VARIANTS)
    rows = [
        {
            "corpus": "wikitext",
            "steps": 1500,
            "variant": v,
            "seed": seed,
            "perplexity": 20.0 + seed + i,
            "train_flops": 1e12 * (1 + i / 4),
        }
        for i, v in enumerate(plotted)
        for seed in range(3)
    ]
    out = tmp_path / "curve.png"
    fidelity.plot_cost_curve(rows[3:], "wikitext", 1500, out)  # no baseline: nothing to scale by
    assert not out.exists()
    fidelity.plot_cost_curve(rows, "wikitext", 1500, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_preset_table_pairs_each_family_and_leaves_out_corpora_not_run(fidelity):
    def row(corpus, variant, ppl, change=None, spread=None):
        return {
            "corpus": corpus,
            "steps": 400,
            "variant": variant,
            "seeds": 4,  # one seed more than the pairs: the table counts pairs
            "perplexity_mean": ppl,
            "change_vs_baseline": change,
            "change_range": spread,
            "paired_seeds": 3,
        }

    summary = [
        row("shakespeare", "tiny", 50.0, 0.0, [0.0, 0.0]),
        row("shakespeare", "tiny_scone", 45.0, -0.1, [-0.12, -0.08]),
        row("shakespeare", "tiny_llama", 40.0, 0.0, [0.0, 0.0]),
        row("wikitext_valid", "tiny", 30.0, 0.0, [0.0, 0.0]),  # a diagnosis corpus: not a row
        row("wikitext_valid", "tiny_scone", 29.0, -0.03, [-0.04, -0.02]),
    ]
    lines = fidelity.preset_table(summary).splitlines()
    assert len(lines) == 3
    assert lines[2] == ("| shakespeare | 400 | 50.00 | 45.00 | -10.0% (-12.0..-8.0) | 3 | | | | |")


def test_the_report_pairs_seeds_and_says_how_many_pairs_a_change_rests_on(fidelity, tmp_path):
    def run(variant, seed, perplexity):
        return {
            "corpus": "embedded",
            "variant": variant,
            "seed": seed,
            "steps": 400,
            "perplexity": perplexity,
            "train_flops": 2.0 if "scone" in variant else 1.0,
            "match_rate": 0.5,
        }

    results = tmp_path / "results"
    results.mkdir()
    earlier = [run("tiny", 0, 50.0), run("tiny", 1, 40.0)]
    earlier += [run("tiny_scone", 0, 45.0), run("tiny_scone", 1, 38.0), run("tiny_scone", 2, 1.0)]
    (results / "runs.json").write_text(json.dumps(earlier))
    fidelity.report(argparse.Namespace(out=str(tmp_path / "none"), results=str(results)))
    summary = {r["variant"]: r for r in json.loads((results / "summary.json").read_text())}
    ours = summary["tiny_scone"]
    # seed 2 has no baseline: it counts in the mean perplexity, not in the change
    assert ours["seeds"] == 3 and ours["paired_seeds"] == 2
    assert ours["change_vs_baseline"] == pytest.approx((45 / 50 + 38 / 40) / 2 - 1)
    assert "| embedded | 400 | tiny_scone | 3 (2 paired) |" in (results / "summary.md").read_text()
    assert "| 2 |" in (results / "presets.md").read_text()
