"""2 processes x 4 devices == 1 process x 8 devices, through a lost peer, a restart and a resume.

The job trains with interval checkpoints; process 1 is killed mid-run, process 0's watchdog
stops it, and the same command run again resumes from the last (collective) checkpoint. Per-step
losses and the final parameters must equal a single-process run on the same mesh shape.
Reductions cross processes through gloo, so equality is to float rounding, not bitwise.
"""

import os
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.run_dir import best_checkpoint_dir
from scone_jax.config import load_config
from scone_jax.train.loop import train
from scone_jax.train.session import open_session
from tests.multihost.helpers import scone_job, scone_process_pids, wait_for_job_step
from tests.train.helpers import losses, read_metrics, tiny_overrides

STEPS = 16
MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "checkpoint.every": 4}
# each process decides on its own whether an eval is a new best, and the save is collective
BEST = {"train.eval_every": 2, "checkpoint.keep_best": "heldout"}


def _final_params(cfg, run_dir: Path, session) -> list[np.ndarray]:
    ckpt = Checkpointer(run_dir / "checkpoints", 1, 10, False)
    state = ckpt.restore(session.setup.abstract_state, session.setup.shardings, STEPS)
    ckpt.close()
    assert int(jax.device_get(state["step"])) == STEPS
    return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state["params"])]


@pytest.mark.slow
def test_two_processes_resume_after_a_lost_peer_and_match_one_process(markov_dataset, tmp_path):
    single_cfg = load_config(
        "tiny", tiny_overrides(markov_dataset.path, tmp_path / "single", STEPS, **MESH, **BEST)
    )
    assert len(jax.devices()) == 8
    train(single_cfg)

    multi = tmp_path / "multi"
    args = ["train", "tiny", *tiny_overrides(markov_dataset.path, multi, STEPS, **MESH, **BEST)]
    env = {"SCONE_PEER_TIMEOUT": "8"}
    job = scone_job(2, *args, env=env)
    wait_for_job_step(multi, 6, job)
    os.kill(scone_process_pids(job.proc.pid)[1], signal.SIGKILL)
    job.finish(120)
    job.wait_for(r"^\[p0\] scone-jax: process 1 of 2 is (lost|gone) .*; stopping process 0")
    assert job.status(0) == 75
    saved = sorted(int(p.name) for p in (multi / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and max(saved) < STEPS

    again = scone_job(2, *args, env=env)
    assert again.finish(300) == 0, again.output[-3000:]
    again.wait_for(rf"^\[p0\] run .*resuming at step {max(saved)}$")
    assert not any(line.startswith("[p1] run ") for line in again.lines)  # process 0 reports

    a, b = losses(tmp_path / "single"), losses(multi)
    assert (
        sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    )  # resumed log: no gaps, no duplicates
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=2e-5)
    session = open_session(single_cfg, tmp_path / "single")
    for x, y in zip(
        _final_params(single_cfg, multi, session),
        _final_params(single_cfg, tmp_path / "single", session),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, atol=5e-4, rtol=1e-3)
    evals = {r["step"]: r["loss"] for r in read_metrics(multi, "eval") if r["set"] == "heldout"}
    kept = [int(p.name) for p in best_checkpoint_dir(multi).iterdir() if p.name.isdigit()]
    assert kept == [min(evals, key=lambda s: (evals[s], s))], evals
