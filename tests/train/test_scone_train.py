"""SCONE training end to end: the combine modes train, 1 device == 8 devices, resume is
bitwise. That the shipped SCONE presets beat their baselines is tests/fidelity (its own target)."""

import json
import shutil

import numpy as np
import pytest

from scone_jax.config import load_config
from scone_jax.train.loop import train
from tests.train.helpers import (
    SCONE_OVERRIDES,
    cli,
    cli_run,
    losses,
    read_metrics,
    tiny_overrides,
    wait_for_step,
)


def scone_overrides(dataset, run_dir, steps, **extra):
    return tiny_overrides(dataset, run_dir, steps, **{**SCONE_OVERRIDES, **extra})


@pytest.mark.parametrize(
    "combine, noise, suffix_rows, fgram_rules",
    [  # the second with embedding dropout (its draws must not depend on the mesh), suffix rows
        # (a [B, T, K - 1] index) and its own layout for the f-gram model
        ("replace", 0.0, False, {}),
        (
            "gated",
            0.2,
            True,
            {"mesh.rules": "{fgram/mlp: null, fgram/heads: null, fgram/embed: [fsdp, data]}"},
        ),
    ],
)
def test_one_device_equals_eight_and_the_modes_train(
    markov_dataset, tmp_path, combine, noise, suffix_rows, fgram_rules
):
    mode = {
        "fgrams.combine": combine,
        "fgrams.embed_drop_rate": noise,
        "fgrams.suffix_rows": str(suffix_rows).lower(),
    }
    one = cli_run(
        ["train", "tiny", *scone_overrides(markov_dataset.path, tmp_path / "one", 16, **mode)],
        devices=1,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    train(
        load_config(
            "tiny",
            scone_overrides(
                markov_dataset.path,
                tmp_path / "eight",
                16,
                **{
                    **mode,
                    "mesh.data": 2,
                    "mesh.fsdp": 2,
                    "mesh.tensor": 2,
                    **fgram_rules,
                },
            ),
        )
    )
    a, b = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert sorted(a) == sorted(b) == list(range(1, 17))
    np.testing.assert_allclose([a[s] for s in a], [b[s] for s in a], rtol=2e-5)
    assert np.mean([a[s] for s in range(13, 17)]) < np.mean([a[s] for s in range(1, 5)]) - 0.3
    records = read_metrics(tmp_path / "eight")
    assert all(
        0 < r["match_rate"] <= 1 and 0 < r["distinct_ratio"] <= 1 and r["mean_match_length"] >= 2
        for r in records
    )
    assert all(r["grad_norm_fgram"] > 0 and r["grad_norm_backbone"] > 0 for r in records)
    # the gate's RMS is logged for the gated rule only, and it leaves zero once training starts
    assert all(("fgram_gate_rms" in r) == (combine == "gated") for r in records)
    if combine == "gated":
        assert records[-1]["fgram_gate_rms"] > 0


def test_the_sharded_step_never_replicates_what_it_shards(markov_dataset, tmp_path):
    """On the data x fsdp x tensor mesh every lookup (tokens, f-gram nodes, positions), in training
    and in export, comes out batch-sharded: XLA's SPMD partitioner falls back to replicating a
    tensor (and says so) when it cannot reshard it, which on a real mesh means every device
    computing the whole batch."""
    run = cli_run(
        [
            "train",
            "tiny",
            *scone_overrides(
                markov_dataset.path,
                tmp_path / "run",
                2,
                **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "train.eval_every": 2},
            ),
        ]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Involuntary full rematerialization" not in run.stderr
    export = cli_run(["export", tmp_path / "run", "--out", tmp_path / "table"])  # on the run's mesh
    assert export.returncode == 0, export.stderr[-2000:]
    assert "Involuntary full rematerialization" not in export.stderr


def test_scone_kill_and_resume_is_bitwise_identical(markov_dataset, tmp_path):
    """With f-gram dropout and embedding dropout on: their draws, too, must come out the same
    after a resume."""
    noise = {"fgrams.drop_rate": 0.5, "fgrams.embed_drop_rate": 0.2}
    args = lambda name: [  # noqa: E731
        "train",
        "tiny",
        *scone_overrides(markov_dataset.path, tmp_path / name, 20, **noise),
    ]
    straight = cli_run(args("straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    proc = cli(args("killed"))
    wait_for_step(tmp_path / "killed", 11, proc, timeout=300)
    proc.kill()
    proc.communicate()
    resumed = cli_run(args("killed"))
    assert resumed.returncode == 0 and "resuming at step 10" in resumed.stdout, resumed.stderr[
        -2000:
    ]
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")
    # the training stream dropped about half the matches the tags hold
    coverage = json.loads((tmp_path / "straight" / "fgrams" / "stats.json").read_text())
    fed = np.mean([r["match_rate"] for r in read_metrics(tmp_path / "straight")])
    assert fed < 0.75 * coverage["coverage"]["coverage"], (fed, coverage["coverage"])


def test_a_run_directory_moved_elsewhere_resumes(markov_dataset, tmp_path, capsys):
    """A run dir is its contents, not its path: moved (the original gone), it resumes from its
    checkpoint to the same losses; its f-gram set and tags are reused, not rebuilt."""
    import json

    from scone_jax.metrics.flops import count_fgram_params

    cfg = load_config("tiny", scone_overrides(markov_dataset.path, tmp_path / "first", 10))
    train(cfg)
    fgram_params = count_fgram_params(cfg.fgrams, cfg.model)  # counted beside the backbone's
    assert (
        f" + {fgram_params:,} in the f-gram model (training only), mesh" in capsys.readouterr().out
    )
    info = json.loads((tmp_path / "first" / "run_info.json").read_text())
    assert info["params_fgram_model"] == fgram_params > 0
    straight = losses(tmp_path / "first")
    (tmp_path / "first").rename(tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved" / "checkpoints" / "10")
    fgram_set = (tmp_path / "moved" / "fgrams" / "meta.json").stat().st_mtime_ns
    summary = train(
        load_config("tiny", scone_overrides(markov_dataset.path, tmp_path / "moved", 10))
    )
    assert summary["start_step"] == 5 and summary["end_step"] == 10
    assert losses(tmp_path / "moved") == straight
    assert (tmp_path / "moved" / "fgrams" / "meta.json").stat().st_mtime_ns == fgram_set
    assert load_config(tmp_path / "moved" / "config.yaml").run_dir == str(tmp_path / "moved")
