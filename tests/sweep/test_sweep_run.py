"""A real 2 x 2 sweep (plus a baseline) end to end: run, skip when rerun, resume a killed
point, re-evaluate a point whose final evaluation was lost, and report."""

from __future__ import annotations

import csv
import json
import signal

import numpy as np
import pytest
import yaml

from scone_jax.cli.main import main
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.data.pipeline import split_documents
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.store import FgramSet
from scone_jax.train.fgram_inputs import train_split_corpus
from tests.train.helpers import cli, read_metrics, wait_for_step

TINY = {
    "model.d_model": 32,
    "model.n_layers": 2,
    "model.n_heads": 2,
    "model.max_seq_len": 32,
    "data.seq_len": 32,
    "data.eval_fraction": 0.1,
    "train.batch_size": 8,
    "train.steps": 12,
    "train.log_every": 4,
    "train.eval_every": 0,
    "train.eval_batches": 2,
    "logging.progress": False,
    "logging.tensorboard": False,
    "optim.warmup_steps": 2,
    "optim.lr": 0.01,
    "checkpoint.every": 4,
    "checkpoint.async_save": False,
    "fgrams.max_n": 3,
    "fgrams.min_count": 2,
}


def _sweep_file(tmp_path, dataset) -> str:
    spec = {
        "name": "tiny2x2",
        "config": "tiny_scone",
        "overrides": {**TINY, "data.dataset": str(dataset.path)},
        "points": {"baseline": {"fgrams.enabled": False}},
        "grid": {"fgrams.num_fgrams": [40, 400], "fgrams.model_size": ["0.5x", "1x"]},
    }
    path = tmp_path / "tiny2x2.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_tiny_sweep_runs_skips_resumes_and_reports(markov_dataset, tmp_path, capsys):
    sweep, out = _sweep_file(tmp_path, markov_dataset), tmp_path / "sw"
    points = out / "points"
    killed = points / "num_fgrams-40_model_size-1x"  # the third run: two finished before it
    proc = cli(["sweep", sweep, "--out", str(out)])
    wait_for_step(killed, 6, proc)  # past its checkpoint at step 4
    proc.send_signal(
        signal.SIGTERM
    )  # to the sweep only: it must stop its running train process too
    assert proc.wait(timeout=180) == 130, proc.communicate()
    log = (out / "logs" / "train_num_fgrams-40_model_size-1x.log").read_text()
    assert "SIGTERM: saved step" in log  # the run checkpointed and exited, it was not orphaned
    assert not (killed / "final_eval.json").exists()

    assert main(["sweep", sweep, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("done already, skipped") == 2 + 2  # the f-gram sets and the first two runs
    log = (out / "logs" / "train_num_fgrams-40_model_size-1x.log").read_text()
    assert "resuming at step" in log
    steps = [r["step"] for r in read_metrics(killed)]
    assert steps == list(range(1, 13))  # resumed, no gap or duplicate in its metrics

    assert main(["sweep", sweep, "--out", str(out)]) == 0  # everything finished: nothing runs
    printed = capsys.readouterr().out
    assert printed.count("done already, skipped") == 7 and "running" not in printed
    assert main(["sweep", sweep, "--out", str(out), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("# [done]") == 7
    # other overrides make other runs: the dry run refuses them as the real run would
    assert main(["sweep", sweep, "--out", str(out), "--dry-run", "train.steps=13"]) == 2
    err = capsys.readouterr().err
    assert "holds a run with a different config (differs in train.steps)" in err

    lost = points / "num_fgrams-400_model_size-0.5x" / "final_eval.json"
    before = json.loads(lost.read_text())
    lost.unlink()  # as if killed between its last checkpoint and its final evaluation
    assert main(["sweep", sweep, "--out", str(out)]) == 0
    assert json.loads(lost.read_text()) == before
    assert (
        "already complete"
        in (out / "logs" / "train_num_fgrams-400_model_size-0.5x.log").read_text()
    )

    # the shared f-gram sets were counted on the training split, exactly as train would count them
    dataset = TokenizedDataset.open(markov_dataset.path)
    train_ids, _ = split_documents(dataset.num_docs, 0.1, 0)
    reference = build_fgram_set(
        train_split_corpus(dataset, train_ids),
        tmp_path / "ref",
        max_n=3,
        num_fgrams=400,
        min_count=2,
        progress=False,
    )
    shared = FgramSet.load(
        json.loads((points / "num_fgrams-400_model_size-1x" / "run_info.json").read_text())[
            "fgram_set"
        ]
    )
    np.testing.assert_array_equal(shared.tokens, reference.tokens)
    np.testing.assert_array_equal(shared.counts, reference.counts)

    assert main(["report", str(out)]) == 0
    report = out / "report"
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert [r["point"] for r in rows] == [
        "baseline",
        "num_fgrams-40_model_size-0.5x",
        "num_fgrams-40_model_size-1x",
        "num_fgrams-400_model_size-0.5x",
        "num_fgrams-400_model_size-1x",
    ]
    for r in rows:
        final = json.loads((points / r["point"] / "final_eval.json").read_text())["results"]
        assert r["status"] == "complete"
        assert float(r["ppl_heldout"]) == final["heldout"]["perplexity"]
        assert float(r["train_flops"]) > 0 and float(r["inference_flops_per_token"]) > 0
    assert (
        len({r["accelerator_params"] for r in rows}) == 1
    )  # f-gram model and table stay off the accelerator
    scone = [r for r in rows if r["scone"] == "True"]
    assert {int(r["table_rows"]) for r in scone} <= {40, 400} and all(
        0 < float(r["coverage"]) <= 1 for r in scone
    )
    assert float(scone[1]["fgram_model_params"]) > float(
        scone[0]["fgram_model_params"]
    )  # 1x > 0.5x
    # training FLOPs grow with the f-gram model; the baseline costs least
    assert float(rows[0]["train_flops"]) < min(float(r["train_flops"]) for r in scone)
    table = (report / "results.md").read_text()
    assert all(f"| {r['point']} | complete |" in table for r in rows)
    for plot in (
        "ppl_vs_num_fgrams.png",
        "ppl_vs_fgram_model_size.png",
        "ppl_vs_accelerator_params.png",
    ):
        data = (report / plot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000 and f"![{plot}]({plot})" in table
    assert not (report / "ppl_vs_max_n.png").exists()  # K did not vary
