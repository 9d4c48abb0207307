"""Paper presets: parameter counts against SCONE.md section 6 (the paper's tables)."""

import pytest

from scone_jax.cli.main import main
from scone_jax.config import load_config
from scone_jax.metrics.flops import count_fgram_params, count_params

# preset -> (backbone parameters, f-gram model parameters or None), in millions, from the paper
PAPER = {
    "gpt2_128m": (128, None),
    "gpt2_419m": (419, None),
    "gpt2_589m": (589, None),
    "gpt2_419m_baseline_x2": (759, None),
    "gpt2_589m_baseline_x2": (1099, None),
    "gpt2_419m_scone_170m": (419, 170),
    "gpt2_419m_scone_1020m": (419, 1020),
    "olmo_0.7b": (700, None),
    "olmo_1b": (1000, None),
    "olmo_1.3b": (1300, None),
    "olmo_1.9b_baseline": (1900, None),
    "olmo_1b_scone_10m_fg0.6b": (1000, 600),
    "olmo_1b_scone_1b_fg1.8b": (1000, 1800),
    "olmo_1.3b_scone_10m_fg1.8b": (1300, 1800),
}


@pytest.mark.parametrize("preset", PAPER)
def test_paper_preset_parameter_counts(preset):
    cfg = load_config(f"paper/{preset}")
    backbone, fgram = PAPER[preset]
    tolerance = 0.005 if preset.startswith("gpt2") else 0.03  # the paper rounds OLMo sizes to 0.1B
    assert count_params(cfg.model, cfg.model.vocab_size)[0] == pytest.approx(
        backbone * 1e6, rel=tolerance
    )
    if fgram:
        assert count_fgram_params(cfg.fgrams, cfg.model) == pytest.approx(
            fgram * 1e6, rel=tolerance
        )


def test_doubled_baselines_double_the_non_embedding_parameters():
    for small, big in [
        ("gpt2_128m", "gpt2_128m_baseline_x2"),
        ("gpt2_419m", "gpt2_419m_baseline_x2"),
        ("gpt2_589m", "gpt2_589m_baseline_x2"),
    ]:
        a, b = (load_config(f"paper/{p}").model for p in (small, big))
        na, nb = (
            count_params(m, m.vocab_size)[0] - count_params(m, m.vocab_size)[1] for m in (a, b)
        )
        assert nb == pytest.approx(2 * na, rel=1e-4)  # all but the final norm doubles


def test_counts_are_printed(capsys):
    assert main(["train", "paper/gpt2_419m_scone_170m", "--count-params"]) == 0
    out = capsys.readouterr().out
    assert "backbone 418.7M parameters" in out and "f-gram model 170.0M" in out
