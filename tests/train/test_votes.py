"""The processes' votes (train/votes.py): each process's signal and f-gram counts go into the
train step as one row of a small array and come back reduced with its metrics, so a job of
several processes agrees without a host-side gather. Multi-process jobs use them
(tests/multihost: SIGTERM, the global f-gram metrics); here a single process is made to use them
too, and must train, measure and stop exactly as it does without them."""

import os
import signal

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import scone_jax.train.loop as loop_module
from scone_jax.config import load_config
from scone_jax.train.session import Session
from scone_jax.train.votes import process_votes, read_votes, reduce_votes
from tests.train.helpers import SCONE_OVERRIDES, read_metrics, tiny_overrides


@pytest.mark.parametrize("shape", [(2, 2, 2), (8, 1, 1), (1, 2, 4)])
def test_a_vote_fills_one_row_and_the_step_reduces_the_rows(shape, rng):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "fsdp", "tensor"))
    vector = rng.integers(-5, 50, size=6)
    print(f"vector {vector.tolist()}")
    votes = process_votes(mesh, vector)
    rows = np.asarray(votes)
    assert rows.shape == (8, 6)
    assert sum(np.array_equal(r, vector) for r in rows) == 1
    assert np.count_nonzero(rows) == np.count_nonzero(vector)
    reduced = jax.device_get(jax.jit(reduce_votes)(votes))
    np.testing.assert_array_equal(reduced["votes_sum"], vector)
    assert reduced["votes_stop"] == max(vector[0], 0)


def test_reading_votes_gives_the_signal_and_the_counts_and_leaves_the_metrics():
    metrics = {
        "loss": 1.5,
        "votes_stop": np.int32(signal.SIGTERM),  # two processes got SIGTERM
        "votes_sum": np.array([30, 100, 70, 2]),
    }
    stop, counts = read_votes(metrics)
    assert stop == signal.SIGTERM
    np.testing.assert_array_equal(counts, [100, 70, 2])
    assert metrics == {"loss": 1.5}
    assert read_votes({"loss": 1.0}) is None


def force_votes(monkeypatch, signal_at: int | None = None):
    """A single process that votes as a process of a larger job does; `signal_at` sends this
    process SIGTERM while step `signal_at` is being queued (its vote already cast)."""
    monkeypatch.setattr(Session, "votes_across", property(lambda self: True))
    make_step = Session.train_step

    def train_step(session):
        step_fn = make_step(session)

        def step(state, batch, *votes):
            assert votes, "the step must take the votes"
            if int(state["step"]) + 1 == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return step_fn(state, batch, *votes)

        return step

    monkeypatch.setattr(Session, "train_step", train_step)


MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}


def run_config(dataset, run_dir, steps, **extra):
    overrides = tiny_overrides(dataset, run_dir, steps, **{**SCONE_OVERRIDES, **MESH, **extra})
    return load_config("tiny", overrides)


def test_a_voting_process_trains_and_measures_as_one_that_decides_alone(
    markov_dataset, tmp_path, monkeypatch
):
    assert loop_module.train(run_config(markov_dataset.path, tmp_path / "alone", 6))["status"] == (
        "complete"
    )
    force_votes(monkeypatch)
    assert loop_module.train(run_config(markov_dataset.path, tmp_path / "votes", 6))["status"] == (
        "complete"
    )
    alone, voting = read_metrics(tmp_path / "alone"), read_metrics(tmp_path / "votes")
    assert [r["step"] for r in voting] == list(range(1, 7))
    for key in ("loss", "match_rate", "distinct_ratio", "mean_match_length", "fgram_nodes"):
        assert [r[key] for r in voting] == [r[key] for r in alone], key
    assert not any(k.startswith("votes") for r in voting for k in r)


def test_a_signal_voted_with_a_step_stops_every_process_at_the_step_after_it(
    markov_dataset, tmp_path, monkeypatch
):
    """The signal comes while step 4 is queued, after its vote: step 5 carries it, its metrics
    are read once step 6 is queued, and the run saves step 6 (deciding alone, it saves step 4).
    No checkpoint is due on the way: a step that is saved is read at once, and would stop there."""
    force_votes(monkeypatch, signal_at=4)
    cfg = run_config(markov_dataset.path, tmp_path / "run", 40, **{"checkpoint.every": 1000})
    summary = loop_module.train(cfg)
    assert summary["status"] == "stopped by SIGTERM" and summary["end_step"] == 6
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == list(range(1, 7))
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert "6" in saved and not any(name.isdigit() and int(name) > 6 for name in saved)
