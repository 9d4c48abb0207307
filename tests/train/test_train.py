"""Training end to end: loss goes down, 1 device == 8 devices, resume is bitwise, signals save."""

import json
import shutil
import signal

import numpy as np
import pytest

from scone_jax.artifacts.run_dir import FINAL_EVAL_FILE, checkpoints_dir
from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.train.loop import train
from tests.conftest import make_dataset, markov_documents
from tests.train.helpers import cli, cli_run, losses, read_metrics, tiny_overrides, wait_for_step


def test_loss_decreases_on_the_8_device_mesh(markov_dataset, tmp_path):
    cfg = load_config(
        "tiny",
        tiny_overrides(
            markov_dataset.path,
            tmp_path / "run",
            steps=40,
            **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "train.eval_every": 20},
        ),
    )
    summary = train(cfg)
    assert summary["status"] == "complete" and summary["end_step"] == 40
    loss = losses(tmp_path / "run")
    assert sorted(loss) == list(range(1, 41))  # one record per step, no gaps
    assert np.mean([loss[s] for s in range(36, 41)]) < np.mean([loss[s] for s in range(1, 6)]) - 0.5
    evals = read_metrics(tmp_path / "run", "eval")
    assert [e["step"] for e in evals] == [20, 40] and evals[1]["perplexity"] < evals[0][
        "perplexity"
    ]
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert load_config(tmp_path / "run" / "config.yaml") == cfg


def test_one_device_equals_the_data_fsdp_tensor_mesh(markov_dataset, tmp_path):
    for family in ("gpt2", "llama"):
        one = cli_run(
            [
                "train",
                "tiny",
                *tiny_overrides(
                    markov_dataset.path,
                    tmp_path / f"one_{family}",
                    steps=12,
                    **{"model.family": family},
                ),
            ],
            devices=1,
        )
        assert one.returncode == 0, one.stderr[-2000:]
        cfg = load_config(
            "tiny",
            tiny_overrides(
                markov_dataset.path,
                tmp_path / f"eight_{family}",
                steps=12,
                **{"model.family": family, "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2},
            ),
        )
        train(cfg)
        a, b = losses(tmp_path / f"one_{family}"), losses(tmp_path / f"eight_{family}")
        assert sorted(a) == sorted(b) == list(range(1, 13))
        np.testing.assert_allclose([a[s] for s in a], [b[s] for s in a], rtol=2e-5)


def test_kill_and_resume_is_bitwise_identical(markov_dataset, tmp_path):
    steps = 24
    straight = cli_run(
        ["train", "tiny", *tiny_overrides(markov_dataset.path, tmp_path / "straight", steps)]
    )
    assert straight.returncode == 0, straight.stderr[-2000:]
    args = ["train", "tiny", *tiny_overrides(markov_dataset.path, tmp_path / "killed", steps)]
    proc = cli(args)
    wait_for_step(tmp_path / "killed", 12, proc)
    assert proc.poll() is None, "the run ended before the kill"
    proc.kill()  # SIGKILL: no chance to save; resume from the last interval checkpoint
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    saved = sorted(
        int(p.name) for p in checkpoints_dir(tmp_path / "killed").iterdir() if p.name.isdigit()
    )
    assert (
        saved and max(saved) < steps and max(losses(tmp_path / "killed")) < steps
    )  # killed mid-run
    assert not (tmp_path / "killed" / FINAL_EVAL_FILE).exists()
    resumed = cli_run(args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming at step {max(saved)}" in resumed.stdout
    assert losses(tmp_path / "killed") == losses(
        tmp_path / "straight"
    )  # bitwise, every step, no gaps


def test_sigterm_saves_then_resume_completes(markov_dataset, tmp_path):
    args = [
        "train",
        "tiny",
        *tiny_overrides(markov_dataset.path, tmp_path / "run", 400, **{"checkpoint.every": 1000}),
    ]
    proc = cli(args)
    wait_for_step(tmp_path / "run", 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM: saved step" in out
    saved = max(losses(tmp_path / "run"))
    ckpts = sorted(
        int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert ckpts == [saved] and saved < 400
    summary = train(load_config(tmp_path / "run" / "config.yaml"))
    assert summary["start_step"] == saved and summary["end_step"] == 400


def test_nan_loss_stops_with_a_clear_message(markov_dataset, tmp_path):
    res = cli_run(
        [
            "train",
            "tiny",
            *tiny_overrides(
                markov_dataset.path,
                tmp_path / "run",
                10,
                **{"optim.lr": 1e30, "optim.grad_clip": 0.0, "optim.warmup_steps": 0},
            ),
        ]
    )
    assert res.returncode == 2
    assert "loss is nan" in res.stderr.lower() and "Traceback" not in res.stderr
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .startswith("scone-jax train: error: loss is nan at step")
    )
    saved = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved == [], f"the diverged state was saved: {saved}"


def test_eval_command_reports_perplexity(markov_dataset, tmp_path):
    train(load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "run", 10)))
    res = cli_run(["eval", str(tmp_path / "run"), "--dataset", str(markov_dataset.path), "--json"])
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    out = json.loads(res.stdout)
    assert out["step"] == 10 and set(out["results"]) == {"heldout", "markov"}
    assert all(1 < r["perplexity"] < 64 for r in out["results"].values())


def test_an_eval_dataset_named_twice_is_evaluated_once(markov_dataset, tmp_path, monkeypatch):
    from scone_jax.evaluation.run import evaluate_run

    train(load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "run", 4)))
    monkeypatch.chdir(markov_dataset.path.parent)
    name = markov_dataset.path.name
    results = evaluate_run(tmp_path / "run", [name, f"./{name}", str(markov_dataset.path)])
    assert set(results["results"]) == {"heldout", name}


def test_a_finished_run_rerun_with_an_added_eval_set_evaluates_it(markov_dataset, tmp_path):
    """data.eval_datasets and train.eval_batches may change on a rerun: a finished run is
    evaluated again with them (the sets it had give the same numbers on the same batches)."""
    settings = tiny_overrides(markov_dataset.path, tmp_path / "run", 6)
    first = train(load_config("tiny", settings))
    again = train(load_config("tiny", settings))
    assert again["status"] == "already complete" and again["eval"] == first["eval"]
    added = train(load_config("tiny", [*settings, f"data.eval_datasets=[{markov_dataset.path}]"]))
    assert added["status"] == "already complete"
    assert set(added["eval"]) == {"heldout", "markov"}
    assert added["eval"]["heldout"] == first["eval"]["heldout"]
    recorded = json.loads((tmp_path / "run" / FINAL_EVAL_FILE).read_text())
    assert recorded["results"] == added["eval"]
    assert (recorded["eval_datasets"], recorded["eval_batches"]) == ([str(markov_dataset.path)], 2)
    # other eval batches: evaluated again, and recorded so
    more = train(load_config("tiny", [*settings, "train.eval_batches=3"]))
    assert more["eval"]["heldout"] != first["eval"]["heldout"]
    assert json.loads((tmp_path / "run" / FINAL_EVAL_FILE).read_text())["eval_batches"] == 3


def test_a_resume_refuses_other_tokens_at_the_dataset_path(tmp_path, rng):
    """The dataset a run started on may not be swapped under its path: its tokens' hash is
    recorded at the first start and checked at every other."""
    path = tmp_path / "data"
    make_dataset(path, markov_documents(rng, 64, 80, 500), 64)
    settings = tiny_overrides(path, tmp_path / "run", 4)
    train(load_config("tiny", settings))
    recorded = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert (
        recorded["dataset_tokens_sha256"]
        == json.loads((path / "meta.json").read_text())["tokens_sha256"]
    )
    shutil.rmtree(path)
    make_dataset(path, markov_documents(rng, 64, 80, 500), 64)  # other text, same place
    with pytest.raises(UserError, match=r"started on the dataset at .* holds other tokens"):
        train(load_config("tiny", settings))
    assert json.loads((tmp_path / "run" / "run_info.json").read_text()) == recorded
