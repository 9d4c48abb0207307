"""A signal whose exception Python swallowed (raised inside jax's garbage-collection hook, say)
still stops the command: set-up raises it at its end, and the training loop starts with it."""

from __future__ import annotations

import signal

import pytest

import scone_jax.train.loop as loop_module
from scone_jax import signals
from scone_jax.config import load_config
from scone_jax.errors import Terminated
from tests.train.helpers import losses, tiny_overrides


def swallowed(signum: int) -> None:
    """What Python does with a handler's exception raised in a callback of its own: prints
    "Exception ignored" and goes on."""
    try:
        signals.raise_for(signum, None)
    except (Terminated, KeyboardInterrupt):
        pass


@pytest.fixture(autouse=True)
def nothing_pending():
    signals.handled()
    yield
    signals.handled()


def test_a_lost_signal_is_raised_again_once_and_a_handled_one_is_forgotten():
    swallowed(signal.SIGTERM)
    with pytest.raises(Terminated):
        signals.raise_lost()
    signals.raise_lost()  # once only
    swallowed(signal.SIGINT)
    signals.handled()  # as the CLI does when KeyboardInterrupt reached it
    signals.raise_lost()
    swallowed(signal.SIGINT)
    assert signals.take_lost() == signal.SIGINT and signals.take_lost() is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_lost_during_set_up_stops_the_run_before_it_trains(
    markov_dataset, tmp_path, monkeypatch, signum
):
    real = loop_module.initial_state

    def initial_state(*args, **kwargs):  # the last part of set-up
        swallowed(signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "initial_state", initial_state)
    cfg = load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "run", 6))
    with pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
        loop_module.train(cfg)
    if signum == signal.SIGTERM:  # a preemption keeps what set-up did, for the rerun
        assert (tmp_path / "run" / "config.yaml").is_file()
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
    else:  # Ctrl-C on a fresh run leaves nothing
        assert not (tmp_path / "run").exists()


def test_a_signal_lost_before_the_loop_stops_it_at_its_first_step_with_a_save(
    markov_dataset, tmp_path, monkeypatch
):
    real = loop_module.StepProfiler

    def profiler(*args, **kwargs):  # made after set-up, just before the loop takes the signals
        swallowed(signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "StepProfiler", profiler)
    cfg = load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "run", 6))
    summary = loop_module.train(cfg)
    assert summary["status"] == "stopped by SIGTERM" and summary["end_step"] == 1
    assert sorted(losses(tmp_path / "run")) == [1]
    assert (tmp_path / "run" / "checkpoints" / "1").is_dir()
