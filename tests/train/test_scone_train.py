"""SCONE training end to end: both combine modes train, 1 device == 8 devices, resume is
bitwise, and on real text SCONE beats the same backbone without it."""

import shutil

import numpy as np
import pytest

from scone_jax.config import load_config
from scone_jax.train.loop import train
from tests.conftest import SHARED_DATA
from tests.train.helpers import cli, cli_run, losses, read_metrics, tiny_overrides, wait_for_step

SCONE = {"fgrams.enabled": "true", "fgrams.max_n": 4, "fgrams.num_fgrams": 3000, "fgrams.min_count": 2,
         "fgrams.n_layers": 1}


def scone_overrides(dataset, run_dir, steps, **extra):
    return tiny_overrides(dataset, run_dir, steps, **{**SCONE, **extra})


@pytest.mark.parametrize("combine, fgram_rules", [  # the second with its own layout for the f-gram model
    ("replace", {}), ("add", {"mesh.rules": "{fgram/mlp: null, fgram/heads: null, fgram/embed: [fsdp, data]}"})])
def test_one_device_equals_eight_and_both_modes_train(markov_dataset, tmp_path, combine, fgram_rules):
    one = cli_run(["train", "tiny", *scone_overrides(markov_dataset.path, tmp_path / "one", 16,
                                                     **{"fgrams.combine": combine})], devices=1)
    assert one.returncode == 0, one.stderr[-2000:]
    train(load_config("tiny", scone_overrides(markov_dataset.path, tmp_path / "eight", 16, **{
        "fgrams.combine": combine, "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, **fgram_rules})))
    a, b = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert sorted(a) == sorted(b) == list(range(1, 17))
    np.testing.assert_allclose([a[s] for s in a], [b[s] for s in a], rtol=2e-5)
    assert np.mean([a[s] for s in range(13, 17)]) < np.mean([a[s] for s in range(1, 5)]) - 0.3
    records = read_metrics(tmp_path / "eight")
    assert all(0 < r["match_rate"] <= 1 and 0 < r["distinct_ratio"] <= 1 and r["mean_match_length"] >= 2
               for r in records)


def test_the_sharded_step_never_replicates_what_it_shards(markov_dataset, tmp_path):
    """On the data x fsdp x tensor mesh every lookup (tokens, f-gram nodes, positions), in training
    and in export, comes out batch-sharded: XLA's SPMD partitioner falls back to replicating a tensor (and says so) when
    it cannot reshard it, which on a real mesh means every device computing the whole batch."""
    run = cli_run(["train", "tiny", *scone_overrides(markov_dataset.path, tmp_path / "run", 2, **{
        "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "train.eval_every": 2})])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Involuntary full rematerialization" not in run.stderr
    export = cli_run(["export", tmp_path / "run", "--out", tmp_path / "table"])  # on the run's mesh
    assert export.returncode == 0, export.stderr[-2000:]
    assert "Involuntary full rematerialization" not in export.stderr


def test_scone_kill_and_resume_is_bitwise_identical(markov_dataset, tmp_path):
    args = lambda name: ["train", "tiny", *scone_overrides(markov_dataset.path, tmp_path / name, 20)]  # noqa: E731
    straight = cli_run(args("straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    proc = cli(args("killed"))
    wait_for_step(tmp_path / "killed", 11, proc, timeout=300)
    proc.kill()
    proc.communicate()
    resumed = cli_run(args("killed"))
    assert resumed.returncode == 0 and "resuming at step 10" in resumed.stdout, resumed.stderr[-2000:]
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")


def test_a_run_directory_moved_elsewhere_resumes(markov_dataset, tmp_path):
    """A run dir is its contents, not its path: moved (the original gone), it resumes from its
    checkpoint to the same losses; its f-gram set and tags are reused, not rebuilt."""
    train(load_config("tiny", scone_overrides(markov_dataset.path, tmp_path / "first", 10)))
    straight = losses(tmp_path / "first")
    (tmp_path / "first").rename(tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved" / "checkpoints" / "10")
    fgram_set = (tmp_path / "moved" / "fgrams" / "meta.json").stat().st_mtime_ns
    summary = train(load_config("tiny", scone_overrides(markov_dataset.path, tmp_path / "moved", 10)))
    assert summary["start_step"] == 5 and summary["end_step"] == 10
    assert losses(tmp_path / "moved") == straight
    assert (tmp_path / "moved" / "fgrams" / "meta.json").stat().st_mtime_ns == fgram_set
    assert load_config(tmp_path / "moved" / "config.yaml").run_dir == str(tmp_path / "moved")


def wikitext_documents():
    path = SHARED_DATA / "wikitext-2" / "valid.txt"
    if not path.is_file():
        pytest.skip(f"{path} is not present on this machine")
    return path


def test_scone_beats_the_baseline_on_real_text(tmp_path):
    """A very small run of experiments/wikitext_scone_vs_baseline (see docs/experiments.md)."""
    corpus = wikitext_documents()
    common = {"data.corpus": f"[{corpus}]", "data.doc_split": "blank_line", "data.tokenizer_vocab_size": 1024,
              "model.d_model": 64, "model.n_layers": 2, "model.n_heads": 4, "model.max_seq_len": 64,
              "data.seq_len": 64, "train.batch_size": 16, "train.steps": 300, "train.eval_every": 0,
              "train.eval_batches": 8, "optim.lr": 0.003, "optim.warmup_steps": 10, "logging.progress": "false",
              "logging.tensorboard": "false", "checkpoint.every": 1000, "data.eval_fraction": 0.05}
    base = load_config("tiny", [f"{k}={v}" for k, v in {**common, "run_dir": tmp_path / "base"}.items()])
    b = train(base)["eval"]["heldout"]["perplexity"]
    scone = load_config("tiny", [f"{k}={v}" for k, v in {
        **common, "run_dir": tmp_path / "scone", "data.dataset": tmp_path / "base" / "dataset",
        "fgrams.enabled": "true", "fgrams.max_n": 4, "fgrams.num_fgrams": 20000, "fgrams.min_count": 3,
        "fgrams.n_layers": 1}.items()])
    s = train(scone)["eval"]["heldout"]["perplexity"]
    print(f"held-out perplexity: baseline {b:.2f}, SCONE {s:.2f}")
    assert s < b
