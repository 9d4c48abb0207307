"""launch/slurm_submit.py and launch/slurm.sbatch against a real SLURM cluster on this machine
(tests/slurm/local_cluster.py): 2 processes x 2 CPU devices, mesh data=2 x fsdp=2.

- A 2-node job trains like 1 process on the same mesh (losses equal to float rounding: the
  reductions cross processes through gloo); it is the uninterrupted run the others must equal.
- A time limit's early warning and `scancel --signal=TERM --full` (how SLURM preempts: the batch
  script's whole process group gets the signal) each make every process save the step it is in
  and exit 143, before any kill; `scontrol requeue` resumes, and the finished run equals the
  uninterrupted one bit for bit, every step logged once.
- A hung process (SIGSTOP; one node, 2 tasks) ends the job within the watchdog's bound with one
  line naming it; resubmitting resumes, again to the same parameters. A hung process is the case
  only the watchdog catches: a task that dies srun sees exit and ends the step itself
  (--kill-on-bad-exit), which races the watchdog's line.
"""

from __future__ import annotations

import os
import re
import signal
import time

import jax
import numpy as np
import pytest

from scone_jax.artifacts.restore import load_run_params
from scone_jax.artifacts.run_dir import checkpoints_dir, committed_steps
from scone_jax.sharding.mesh import make_mesh
from tests.conftest import make_dataset, markov_documents
from tests.slurm.jobs import SlurmJob
from tests.slurm.local_cluster import LocalCluster
from tests.train.helpers import cli_run, losses, read_metrics, tiny_overrides

pytestmark = pytest.mark.slurm
STEPS = 40
CONFIG = {"mesh.data": 2, "mesh.fsdp": 2, "checkpoint.every": 5}
KILL_WAIT_S = 15  # the cluster's KillWait
LOST_PEER_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("slurm_cluster"), nodes=2) as c:
        yield c


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"dataset seed: {seed}")
    docs = markov_documents(np.random.default_rng(seed), 64, 80, 500)
    return make_dataset(tmp_path_factory.mktemp("slurm") / "markov", docs, 64).path


# What every job gets on top of the submitting environment. No persistent compilation cache:
# with one, a process that loads an executable and a peer that compiles it may disagree on the
# gloo context (seen: "Gloo context initialization failed: ... GetKeyValue() timed out").
JOB_ENV = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    "PYTHONUNBUFFERED": "1",
}


def train_args(dataset, run_dir) -> list[str]:
    return ["train", "tiny", *tiny_overrides(dataset, run_dir, STEPS, **CONFIG)]


@pytest.fixture(scope="module")
def uninterrupted(cluster, dataset, tmp_path_factory):
    """A 2-node job trained from start to end: the run the interrupted ones must equal."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    job = SlurmJob.submit(
        cluster, train_args(dataset, run), run.with_suffix(".out"), JOB_ENV, "--nodes=2"
    )
    assert job.wait_done() == "COMPLETED", job.text()[-3000:]
    assert job.field("NodeList") == ",".join(cluster.names)
    return run


def saved_steps(run_dir) -> list[int]:
    return committed_steps(checkpoints_dir(run_dir))


def assert_stopped_by_sigterm(job: SlurmJob, run_dir, since: int) -> int:
    """Every task saved the same step, the last one logged, and exited 143; no traceback, no
    kill. Returns the step."""
    text = job.text(since)
    exits = sorted(re.findall(r"srun: error: \S+: task (\d+): Exited with exit code (\d+)", text))
    assert exits == [("0", "143"), ("1", "143")], text[-3000:]
    assert not re.search(r"task \d+: (Killed|Terminated)|Traceback", text), text[-3000:]
    assert job.field("ExitCode") == "143:0"
    saved = re.findall(r"^(?:process (\d) of 2: )?SIGTERM: saved step (\d+)", text, re.M)
    assert sorted(p or "0" for p, _ in saved) == ["0", "1"], text[-3000:]
    assert len({s for _, s in saved}) == 1, f"processes saved different steps: {saved}"
    step = int(saved[0][1])
    assert saved_steps(run_dir)[-1] == step == read_metrics(run_dir)[-1]["step"]
    assert step < STEPS
    return step


def final_params(run_dir) -> list[np.ndarray]:
    mesh = make_mesh(CONFIG["mesh.data"], CONFIG["mesh.fsdp"], 1, jax.devices()[:4])
    return jax.tree.leaves(jax.device_get(load_run_params(run_dir, mesh=mesh).params))


def assert_equals_uninterrupted(run_dir, uninterrupted) -> None:
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(1, STEPS + 1)), f"steps missing or repeated: {steps}"
    assert losses(run_dir) == losses(uninterrupted)
    for a, b in zip(final_params(run_dir), final_params(uninterrupted), strict=True):
        np.testing.assert_array_equal(a, b)


def seconds(slurm_time: str) -> int:
    """SLURM's [D-]HH:MM:SS (or MM:SS) in seconds."""
    days, _, hms = slurm_time.rpartition("-")
    parts = [int(x) for x in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def test_two_nodes_train_like_one_process(uninterrupted, dataset, tmp_path):
    single = tmp_path / "single"
    res = cli_run(train_args(dataset, single), devices=4)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = losses(single), losses(uninterrupted)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=2e-5)


def test_time_limit_and_preemption_save_then_requeue_resumes_bitwise(
    cluster, dataset, uninterrupted, tmp_path
):
    run = tmp_path / "run"
    job = SlurmJob.submit(
        cluster,
        train_args(dataset, run),
        tmp_path / "job.out",
        {**JOB_ENV, "SCONE_PEER_TIMEOUT": "90"},  # outlasts the pause below
        "--nodes=2",
        "--time=10",
        "--requeue",
        "--sbatch-arg=--signal=B:USR1@100",
    )
    # 1. The time limit. slurmctld sends the warning on its 30-second tick: the tasks are paused
    # until it comes, so that it finds the run mid-training however fast this machine is.
    job.wait_for_step(run, 3)
    pids = job.task_pids()
    assert sorted(pids) == [0, 1], pids
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    try:
        cluster.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=2")  # warning due now
        job.wait_for_output(r"^slurm\.sbatch: got SIGUSR1", timeout=60)
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)
    assert job.wait_done() == "FAILED"  # the script's status, 143: ended by itself, not TIMEOUT
    ran, limit = seconds(job.field("RunTime")), seconds(job.field("TimeLimit"))
    assert ran < limit, f"ran {ran}s, past its time limit {limit}s"
    first = assert_stopped_by_sigterm(job, run, 0)

    # 2. Requeued, it resumes; then a preemption-style signal to the whole batch job.
    since = len(job.text())
    cluster.run("scontrol", "requeue", job.id)
    # pending for cred_expire (10 s) now: time to lift the time limit before it starts again
    cluster.run("scontrol", "update", f"JobId={job.id}", "TimeLimit=10")
    job.wait_for_output(rf"^run .*resuming at step {first}$", since)
    job.wait_for_step(run, first + 2)
    signalled = time.monotonic()
    cluster.run("scancel", "--signal=TERM", "--full", job.id)
    assert job.wait_done() == "FAILED"
    took = time.monotonic() - signalled
    assert took < KILL_WAIT_S, f"the job took {took:.1f}s to stop; KillWait is {KILL_WAIT_S}s"
    second = assert_stopped_by_sigterm(job, run, since)
    assert second >= first + 2

    # 3. Requeued again, it finishes: as if never interrupted.
    since = len(job.text())
    cluster.run("scontrol", "requeue", job.id)
    assert job.wait_done() == "COMPLETED", job.text(since)[-3000:]
    assert re.search(rf"^run .*resuming at step {second}$", job.text(since), re.M)
    assert job.field("Restarts") == "2"
    assert_equals_uninterrupted(run, uninterrupted)


def test_a_hung_process_ends_the_job_within_the_peer_timeout_then_resubmit_resumes(
    cluster, dataset, uninterrupted, tmp_path
):
    run = tmp_path / "run"
    env = {**JOB_ENV, "SCONE_PEER_TIMEOUT": str(LOST_PEER_TIMEOUT_S)}
    one_node = ["--nodes=1", "--tasks-per-node=2", f"--sbatch-arg=--nodelist={cluster.names[0]}"]
    job = SlurmJob.submit(cluster, train_args(dataset, run), tmp_path / "job.out", env, *one_node)
    job.wait_for_step(run, 12)
    pids = job.task_pids()
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGSTOP)  # srun sees nothing: the task is alive, only silent
    hung = time.monotonic()
    job.wait_done()
    took = time.monotonic() - hung
    # the watchdog's bound: the peer timeout, plus its heartbeat interval and the exit
    bound = LOST_PEER_TIMEOUT_S + 5
    assert took <= bound, f"the job took {took:.1f}s to end after the hang; bound {bound}s"
    lost = re.findall(r"^scone-jax: process 1 of 2 is lost .*$", job.text(), re.M)
    assert len(lost) == 1, job.text()[-3000:]
    checkpoint = saved_steps(run)[-1]

    again = SlurmJob.submit(
        cluster, train_args(dataset, run), tmp_path / "again.out", env, *one_node
    )
    assert again.wait_done() == "COMPLETED", again.text()[-3000:]
    assert re.search(rf"^run .*resuming at step {checkpoint}$", again.text(), re.M)
    assert_equals_uninterrupted(run, uninterrupted)
