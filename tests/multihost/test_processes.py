"""Real 2-process jobs on localhost (gloo): healthy runs, per-process data, and what happens when a
peer dies.

The watchdog's limit is set low here (SCONE_PEER_TIMEOUT) so a lost peer is found in seconds.
What stopped a job is read from its messages, never from how long it took (timings belong in
benchmarks/): a failure report names the failure, a lost peer its silence, a dead one its
liveness port.
"""

import os
import signal
import time

from scone_jax.artifacts.run_dir import CONFIG_FILE, checkpoints_dir
from tests.conftest import make_dataset, markov_documents
from tests.multihost.helpers import worker_job

PEER_TIMEOUT = 5.0
FAST = {"SCONE_PEER_TIMEOUT": str(PEER_TIMEOUT)}


def test_two_processes_run_collectives_and_shut_down_cleanly():
    job = worker_job(2, "steps", "30", env=FAST)
    assert job.finish(120) == 0, job.output[-3000:]
    topology = [line for line in job.lines if "scone-jax: distributed:" in line]
    assert len(topology) == 1 and topology[0].startswith("[p0] ")  # logged once, by process 0
    assert (
        "2 processes (SCONE_* environment" in topology[0]
        and "8 devices (4 on process 0; cpu)" in topology[0]
    )
    assert "[p0] DONE" in job.lines and "[p1] DONE" in job.lines
    assert "lost" not in job.output and "failed" not in job.output  # a normal exit alarms nobody


def test_each_process_reads_its_own_rows_of_the_global_batch(tmp_path, rng):
    make_dataset(tmp_path / "ds", markov_documents(rng, 50, 30, 200), 50)
    job = worker_job(2, "data", str(tmp_path / "ds"), env=FAST)
    assert job.finish(120) == 0, job.output[-3000:]
    assert "[p0] DATA OK" in job.lines and "[p1] DATA OK" in job.lines


GONE = (
    r"^\[p0\] scone-jax: process 1 of 2 is gone \(no heartbeat for \d+s and its liveness port "
    r"refuses connections\){after}; stopping process 0\. Rerun"
)


def kill_once_trusted(job, ready: str) -> None:
    """SIGKILL process 1 once `ready` is printed and its port has had time to be trusted (it is
    once it answered while its process beat: the first beats)."""
    victim = job.pid(1)
    job.wait_for(ready)
    time.sleep(5)
    os.kill(victim, signal.SIGKILL)
    job.finish(60)


def test_a_killed_peer_is_found_dead_by_its_port():
    job = worker_job(2, "hang", env=FAST)
    kill_once_trusted(job, r"^\[p0\] STEP 10$")
    job.wait_for(GONE.format(after="(, after a collective failed)?"))
    assert job.status(0) == 75 and job.status(1) == -signal.SIGKILL


def test_a_stopped_peer_is_lost_after_the_peer_timeout():
    # SIGSTOP: silent, but alive (its port still answers), so only the timeout can decide
    job = worker_job(2, "hang", env=FAST)
    victim = job.pid(1)
    job.wait_for(r"^\[p0\] STEP 10$")
    os.kill(victim, signal.SIGSTOP)
    try:
        lost = job.wait_for(
            r"^\[p0\] scone-jax: process 1 of 2 is lost \(no heartbeat for (\d+)s, limit 5s\)"
            r"(, after a collective failed)?; stopping process 0\. Rerun the job",
            timeout=60,
        )
    finally:
        os.kill(victim, signal.SIGKILL)
    job.finish(60)
    assert job.status(0) == 75
    assert int(lost.group(1)) >= PEER_TIMEOUT  # found by the heartbeat going silent
    assert "is gone" not in job.output


def test_a_peer_killed_while_the_others_wait_at_a_barrier_is_found_dead():
    # no collective fails at a coordination barrier (orbax waits at one around each checkpoint
    # save); the peer timeout is long here, so the port is what finds the dead peer
    job = worker_job(2, "barrier-hang", "1", env={"SCONE_PEER_TIMEOUT": "60"})
    kill_once_trusted(job, r"^\[p1\] HANGING$")
    job.wait_for(GONE.format(after=""))
    assert job.status(0) == 75 and job.status(1) == -signal.SIGKILL


def test_every_survivor_of_three_names_the_dead_peer():
    # whichever survivor finds process 2 dead first stops; the other must not name the stopping
    # process (nor, when process 0 stops first, the coordination service it hosted)
    job = worker_job(3, "barrier-hang", "2", devices=2, env={"SCONE_PEER_TIMEOUT": "60"})
    victim = job.pid(2)
    job.wait_for(r"^\[p2\] HANGING$")
    time.sleep(5)  # long enough for both survivors to trust its port
    os.kill(victim, signal.SIGKILL)
    job.finish(60)
    for survivor in (0, 1):
        job.wait_for(
            rf"^\[p{survivor}\] scone-jax: process 2 of 3 is gone \(no heartbeat for \d+s and its "
            rf"liveness port refuses connections\)( \(found by process [01]\))?; stopping "
            rf"process {survivor}\. Rerun"
        )
        assert job.status(survivor) == 75
    assert "coordination service" not in job.output and "lost the coordinator" not in job.output


def test_a_failing_peer_stops_the_others_at_once():
    # without the failure report, process 0 would wait in its collective until jax's shutdown
    # timeout (SCONE_SHUTDOWN_TIMEOUT, 120 s); the peer timeout is long here, so it is not what
    # stops it
    job = worker_job(2, "fail-at", "10", "1", env={"SCONE_PEER_TIMEOUT": "60"})
    assert job.finish(60) in (1, 75), job.output[-3000:]  # whichever local.py saw first
    assert "is lost" not in job.output  # stopped by the report, not by a timeout
    job.wait_for(
        r"^\[p0\] scone-jax: process 1 of 2 failed \(RuntimeError: injected failure at step 10\); "
        r"stopping process 0"
    )
    assert job.status(1) == 1 and job.status(0) == 75


def test_a_lost_coordinator_stops_the_others_through_the_runtime():
    # process 0 hosts jax's coordination service: when it dies the runtime itself aborts the
    # others at once (its own message; the watchdog gets no say)
    job = worker_job(2, "hang", env=FAST)
    victim = job.pid(0)
    job.wait_for(r"^\[p1\] STEP 10$")
    os.kill(victim, signal.SIGKILL)
    job.finish(60)
    assert job.status(1) not in (None, 0)
    assert "coordination service" in job.output


def test_a_coordinator_failing_while_the_others_wait_at_a_barrier_stops_them():
    # the shape of data preparation: process 0 tokenizes while the others wait (train/session.py)
    job = worker_job(2, "barrier-fail", "0", env={"SCONE_PEER_TIMEOUT": "60"})
    assert job.finish(60) in (1, 75), job.output[-3000:]
    assert "is lost" not in job.output
    job.wait_for(
        r"^\[p1\] scone-jax: process 0 of 2 failed \(RuntimeError: injected failure before the "
        r"barrier\)"
    )
    assert job.status(0) == 1 and job.status(1) == 75


def test_a_runtime_error_caused_by_a_dead_peer_names_the_peer():
    # a collective broken by a dying peer surfaces as a runtime error (gloo: "Connection reset by
    # peer"); the watchdog holds that error back until it knows whether a peer is lost
    job = worker_job(2, "runtime-error", "others-die", env=FAST)
    job.finish(60)
    job.wait_for(r"^\[p0\] scone-jax: process 1 of 2 is (lost|gone) \(no heartbeat")
    assert job.status(0) == 75 and job.status(1) == 9


def test_a_runtime_error_of_its_own_is_published_once_the_peers_are_seen_alive():
    job = worker_job(2, "runtime-error", "alone", env={"SCONE_PEER_TIMEOUT": "60"})
    job.finish(60)
    assert (
        "is lost" not in job.output
    )  # published once the peer was seen alive, not after its timeout
    job.wait_for(
        r"^\[p1\] scone-jax: process 0 of 2 failed \(JaxRuntimeError: injected failure at step 10\)"
    )
    assert job.status(0) == 1 and job.status(1) == 75


def test_every_process_reads_the_step_process_0_resolved(tmp_path):
    """A run still training may commit a step between two processes' looks at it; a collective
    restore of two different steps would hang or mix them."""
    (tmp_path / CONFIG_FILE).write_text("{}")
    (checkpoints_dir(tmp_path) / "2").mkdir(parents=True)
    job = worker_job(2, "agreed-checkpoint", str(tmp_path), env=FAST)
    assert job.finish(120) == 0, job.output[-3000:]
    # the job's output on failure: pytest's repr of `job.lines` cuts the middle of the list
    assert "[p0] AGREED STEP 2" in job.lines and "[p1] AGREED STEP 2" in job.lines, job.output


def test_processes_run_in_the_callers_working_directory(tmp_path):
    """Relative paths given to `launch/local.py` mean what they mean where it was started."""
    import subprocess
    import sys

    from tests.multihost.helpers import LOCAL

    show_cwd = [sys.executable, "-c", "import os; print(os.getcwd())"]
    done = subprocess.run(
        [sys.executable, str(LOCAL), "--command", "2", *show_cwd],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[p0] {tmp_path}", f"[p1] {tmp_path}"]
