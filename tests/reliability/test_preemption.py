"""Preemption: a SCONE run killed with SIGKILL at random points, again and again, ends with the
same parameters, bit for bit, as a run never interrupted, and a metrics log without gaps or
duplicated steps."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import DAMAGED_DIR
from scone_jax.artifacts.restore import load_run_params
from tests.reliability.faults import TALLY, faulty_cli, finish
from tests.train.helpers import SCONE_OVERRIDES, losses, read_metrics, tiny_overrides, wait_for_step

pytestmark = pytest.mark.slow
SCONE = {
    **SCONE_OVERRIDES,
    "checkpoint.every": 3,
    "checkpoint.async_save": "true",
    "train.eval_every": 10,
}
STEPS, KILLS = 40, 6


def logged_steps(run_dir) -> int:
    try:
        return max((r["step"] for r in read_metrics(run_dir)), default=0)
    except FileNotFoundError:
        return 0


def test_sigkill_at_random_points_then_resume_is_bitwise_identical(markov_dataset, tmp_path, rng):
    args = lambda run: ["train", "tiny", *tiny_overrides(markov_dataset.path, run, STEPS, **SCONE)]  # noqa: E731
    straight = finish(faulty_cli(args(tmp_path / "straight"), devices=1, compile_cache=True))
    assert straight.returncode == 0, straight.stderr[-2000:]

    run = tmp_path / "killed"
    planned = np.sort(rng.choice(np.arange(2, STEPS - 20), KILLS, replace=False))
    for kill, step in enumerate(planned, 1):
        proc = faulty_cli(args(run), devices=1, compile_cache=True)
        target = max(
            int(step), logged_steps(run) + 1
        )  # past anything logged, so the run made progress
        wait_for_step(run, target, proc, timeout=300)
        time.sleep(
            rng.uniform(0.0, 0.2)
        )  # then a random instant: inside a step, an eval or an async save
        assert proc.poll() is None, f"the run finished before kill {kill}"
        proc.kill()
        proc.communicate()
        TALLY["faults injected"] += 1
        print(f"kill {kill}: after step {target}; {logged_steps(run)} steps logged")
    resumed = finish(faulty_cli(args(run), devices=1, compile_cache=True))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming at step" in resumed.stdout
    TALLY["restarts survived"] += KILLS

    train_steps = [r["step"] for r in read_metrics(run)]
    assert train_steps == list(range(1, STEPS + 1)), "gaps, duplicates or disorder in metrics.jsonl"
    eval_steps = [r["step"] for r in read_metrics(run, "eval")]
    assert eval_steps == list(range(10, STEPS + 1, 10))
    assert losses(run) == losses(tmp_path / "straight")
    assert not (run / DAMAGED_DIR).exists(), "a kill made a committed checkpoint fail its checksums"
    for a, b in zip(
        *(
            jax.tree.leaves(jax.device_get(load_run_params(r).params))
            for r in (run, tmp_path / "straight")
        ),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
