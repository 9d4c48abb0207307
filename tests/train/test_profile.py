"""`train.profile_steps` writes a jax.profiler trace of exactly those steps to RUN_DIR/profile."""

from __future__ import annotations

import gzip
import json

import pytest

from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.train.loop import train
from tests.train.helpers import tiny_overrides


def test_the_trace_covers_the_window_of_steps(markov_dataset, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = {"train.profile_steps": "[2, 4]", "model.n_layers": 1, "train.eval_batches": 1}
    train(load_config("tiny", tiny_overrides(markov_dataset.path, run_dir, 5, **overrides)))
    assert f"profile of steps [2, 4] written to {run_dir / 'profile'}" in capsys.readouterr().out
    (session,) = (run_dir / "profile" / "plugins" / "profile").iterdir()
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
    assert steps == [3, 4]  # the steps that take the state from step 2 to step 4


def test_a_bad_window_is_one_line():
    for window in ("[3, 2]", "[1]", "[0, 9]"):
        with pytest.raises(UserError, match=r"train.profile_steps=\[.*\] \(expected \[\] or"):
            load_config("tiny", [f"train.profile_steps={window}", "train.steps=5"])
