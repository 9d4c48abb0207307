"""A step's metrics are read once the next step is queued, except where its state is used; every
step is still recorded once, in order, and a failure with a step queued keeps that step."""

import pytest

import scone_jax.train.loop as loop_module
from scone_jax.config import load_config
from scone_jax.train.session import Session
from tests.train.helpers import losses, tiny_overrides


def tiny_config(dataset, run_dir, steps, **extra):
    return load_config("tiny", tiny_overrides(dataset, run_dir, steps, **extra))


class Events(list):
    fail_at: int | None = None


@pytest.fixture
def events(monkeypatch):
    """("queued", k) when step k is handed to the jitted step, ("read", k) when its metrics are
    read; `events.fail_at` makes queuing that step raise instead."""
    log = Events()
    make_step = Session.train_step

    def train_step(session):
        step_fn = make_step(session)
        queued = [0]

        def traced(state, batch):
            queued[0] += 1
            if queued[0] == log.fail_at:
                raise RuntimeError(f"injected failure queuing step {log.fail_at}")
            log.append(("queued", int(state["step"]) + 1))
            return step_fn(state, batch)

        return traced

    record = loop_module.StepRecorder.record

    def traced_record(self, step, *args):
        log.append(("read", step))
        return record(self, step, *args)

    monkeypatch.setattr(Session, "train_step", train_step)
    monkeypatch.setattr(loop_module.StepRecorder, "record", traced_record)
    return log


def test_a_step_is_read_after_the_next_is_queued_unless_its_state_is_used(
    markov_dataset, tmp_path, events
):
    # checkpoints at 5 and 10, an evaluation at 8, the last step 12: those are read at once
    cfg = tiny_config(markov_dataset.path, tmp_path / "run", 12, **{"train.eval_every": 8})
    summary = loop_module.train(cfg)
    assert summary["status"] == "complete"
    at_once = {5, 8, 10, 12}
    for k in range(1, 12):
        read_before_next = events.index(("read", k)) < events.index(("queued", k + 1))
        assert read_before_next == (k in at_once), (k, events)
    assert [k for kind, k in events if kind == "read"] == list(range(1, 13))  # each once, in order
    assert sorted(losses(tmp_path / "run")) == list(range(1, 13))


def test_a_failure_after_queuing_a_step_records_and_saves_the_step_before(
    markov_dataset, tmp_path, events
):
    events.fail_at = 8  # queuing step 8 fails: step 7, queued and not yet read, is kept
    cfg = tiny_config(markov_dataset.path, tmp_path / "run", 12)
    with pytest.raises(RuntimeError, match="injected failure queuing step 8"):
        loop_module.train(cfg)
    assert sorted(losses(tmp_path / "run")) == list(range(1, 8))
    saved = sorted(
        int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert saved == [5, 7]
