"""`train.profile_steps` writes a jax.profiler trace of exactly those steps to RUN_DIR/profile
(the train loop's use of it is run by tests/cli/test_bring_your_own.py)."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from scone_jax.config import load_config
from scone_jax.config.schema import TrainConfig
from scone_jax.errors import UserError
from scone_jax.train.profile import StepProfiler


def run_steps(profiler: StepProfiler, total: int) -> None:
    """The train loop's calls, around a jitted stand-in for the step."""
    step_fn = jax.jit(lambda x: jnp.tanh(x @ x.T) @ x)
    state = jnp.ones((64, 64))
    try:
        for done in range(total):
            with profiler.step(done):
                state = step_fn(state)
            profiler.after(done + 1, state)
    finally:
        profiler.close()


def test_the_trace_holds_exactly_the_window_of_steps(tmp_path, capsys):
    run_steps(StepProfiler(tmp_path, TrainConfig(steps=6, profile_steps=[2, 4])), 6)
    assert f"profile of steps [2, 4] written to {tmp_path / 'profile'}" in capsys.readouterr().out
    (session,) = (tmp_path / "profile" / "plugins" / "profile").iterdir()
    xplane = list(session.glob("*.xplane.pb"))
    assert len(xplane) == 1 and xplane[0].stat().st_size > 0  # TensorBoard / XProf
    with gzip.open(session / "perfetto_trace.json.gz") as f:  # Perfetto
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = sorted(
        int(e["args"]["step_num"])
        for e in events
        if e.get("name") == "train" and "step_num" in e.get("args", {})
    )
    assert steps == [3, 4]  # the steps that take the state from step 2 to 4, as the log numbers


def test_no_window_or_another_process_writes_nothing(tmp_path):
    run_steps(StepProfiler(tmp_path / "a", TrainConfig(steps=3)), 3)
    other = TrainConfig(steps=3, profile_steps=[0, 1], profile_process=1)
    run_steps(StepProfiler(tmp_path / "b", other), 3)  # this is process 0
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_bad_window_is_one_line():
    for window in ("[3, 2]", "[1]", "[0, 9]"):
        with pytest.raises(UserError, match=r"train.profile_steps=\[.*\] \(expected \[\] or"):
            load_config("tiny", [f"train.profile_steps={window}", "train.steps=5"])
