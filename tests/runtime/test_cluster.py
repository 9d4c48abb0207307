"""Where a process finds its job (flags, env, SLURM, indexed Job, jax detection), timeouts, the peer
monitor."""

import pytest

from scone_jax.runtime.cluster import (
    Cluster,
    DistributedError,
    Timeouts,
    detect,
    slurm_first_host,
    timeouts_from_env,
)
from scone_jax.runtime.distributed import initialize
from scone_jax.runtime.watchdog import KV_PREFIX, PeerMonitor

SCONE = {"SCONE_COORDINATOR": "10.0.0.1:1234", "SCONE_NUM_PROCESSES": "4", "SCONE_PROCESS_ID": "2"}
SLURM_STEP = {
    "SLURM_JOB_ID": "81920",
    "SLURM_STEP_NODELIST": "gpu[007-010]",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "0",
}


def test_a_plain_process_is_single():
    assert detect(env={}) is None
    assert initialize(env={}) is None  # nothing started, nothing touched


def test_scone_environment_and_flags():
    assert detect(env=SCONE) == Cluster("10.0.0.1:1234", 4, 2, "SCONE_* environment")
    assert detect(process_id=0, env=SCONE) == Cluster("10.0.0.1:1234", 4, 0, "flags")  # a flag wins
    assert detect("h:1", 2, 1, env={}) == Cluster("h:1", 2, 1, "flags")
    assert detect("h:1", 1, 0, env={}) is None  # one process: nothing to start


@pytest.mark.parametrize(
    "env, match",
    [
        (
            {"SCONE_COORDINATOR": "h:1", "SCONE_NUM_PROCESSES": "2"},
            "missing --process-id / SCONE_PROCESS_ID",
        ),
        ({**SCONE, "SCONE_PROCESS_ID": "4"}, r"process id 4 is not in \[0, 4\)"),
        ({**SCONE, "SCONE_COORDINATOR": "10.0.0.1"}, "is not HOST:PORT"),
        ({**SCONE, "SCONE_NUM_PROCESSES": "four"}, "SCONE_NUM_PROCESSES='four' is not an integer"),
        ({"SCONE_DISTRIBUTED": "yes"}, "expected 'auto', 'off' or unset"),
    ],
)
def test_inconsistent_descriptions_are_one_line_errors(env, match):
    with pytest.raises(DistributedError, match=match):
        detect(env=env)


def test_kubernetes_indexed_job_takes_the_process_id_from_the_completion_index():
    env = {
        "SCONE_COORDINATOR": "run-workers-0-0.run:8476",
        "SCONE_NUM_PROCESSES": "4",
        "JOB_COMPLETION_INDEX": "3",
    }
    assert detect(env=env) == Cluster("run-workers-0-0.run:8476", 4, 3, "Kubernetes indexed Job")
    assert detect(env={"JOB_COMPLETION_INDEX": "3"}) is None  # independent pods of an indexed Job


def test_slurm_step():
    port = 61440 + 81920 % 4096
    assert detect(env=SLURM_STEP) == Cluster(f"gpu007:{port}", 4, 3, "SLURM")
    assert detect(env={**SLURM_STEP, "SCONE_COORDINATOR_PORT": "5000"}).coordinator == "gpu007:5000"
    assert detect(env={**SLURM_STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    batch_script = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}
    assert detect(env=batch_script) is None  # outside srun: not a step of the job
    assert detect(env={**SLURM_STEP, "SCONE_DISTRIBUTED": "off"}) is None


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node1", "node1"),
        ("node1,node2", "node1"),
        ("n[001-004],m7", "n001"),
        ("gpu-[3,5-9]", "gpu-3"),
        ("a[12]", "a12"),
    ],
)
def test_slurm_first_host(nodelist, first):
    assert slurm_first_host(nodelist) == first


@pytest.mark.parametrize(
    "env, source",
    [
        ({"SCONE_DISTRIBUTED": "auto"}, "SCONE_DISTRIBUTED=auto"),
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "1"}, "Open MPI"),
        ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3", "TPU_WORKER_ID": "1"}, "GKE TPU"),
    ],
)
def test_cluster_environments_left_to_jax_detection(env, source):
    cluster = detect(env=env)
    assert (cluster.coordinator, cluster.num_processes, cluster.process_id) == (None, None, None)
    assert source in cluster.source and not cluster.explicit
    assert detect(env={"OMPI_COMM_WORLD_SIZE": "1"}) is None
    assert detect(env={"TPU_WORKER_HOSTNAMES": "t0"}) is None  # a single-host slice


def test_timeouts():
    assert timeouts_from_env({}) == Timeouts(init_s=300, heartbeat_s=90, shutdown_s=120, peer_s=60)
    t = timeouts_from_env({"SCONE_PEER_TIMEOUT": "10", "SCONE_SHUTDOWN_TIMEOUT": "30"})
    assert (t.peer_s, t.heartbeat_s, t.shutdown_s) == (
        10,
        40,
        30,
    )  # jax's heartbeat stays a backstop
    assert timeouts_from_env({"SCONE_PEER_TIMEOUT": "10"}, peer_s=5).peer_s == 5  # explicit wins
    assert (
        timeouts_from_env({"SCONE_PEER_TIMEOUT": "0"}).heartbeat_s == 100
    )  # no watchdog: jax's default
    assert timeouts_from_env({"SCONE_HEARTBEAT_TIMEOUT": "500"}).heartbeat_s == 500
    with pytest.raises(DistributedError, match="SCONE_INIT_TIMEOUT='soon' is not a number"):
        timeouts_from_env({"SCONE_INIT_TIMEOUT": "soon"})


def _entries(**beats):
    return {f"{KV_PREFIX}/beat/{p[1:]}": str(v) for p, v in beats.items()}


def test_peer_monitor_names_a_silent_peer_after_the_timeout():
    m = PeerMonitor(process_id=0, num_processes=3, timeout_s=10, now=0.0)
    assert m.observe(_entries(p0=1, p1=1, p2=1), now=1.0) is None
    for t in range(2, 11):  # process 1 keeps beating, process 2 stops at beat 1
        assert m.observe(_entries(p0=t, p1=t, p2=1), now=float(t)) is None
    verdict = m.observe(_entries(p0=12, p1=12, p2=1), now=12.0)
    assert verdict.startswith("process 2 of 3 is lost (no heartbeat for 11s, limit 10s)")


def test_peer_monitor_reports_failures_and_ignores_peers_that_exit_normally():
    m = PeerMonitor(process_id=1, num_processes=3, timeout_s=5, now=0.0)
    exiting = {**_entries(p0=1, p2=1), f"{KV_PREFIX}/exiting/2": "1"}
    assert m.observe(exiting, now=1.0) is None
    assert (
        m.observe({**exiting, f"{KV_PREFIX}/beat/0": "2"}, now=100.0) is None
    )  # 2 is done, 0 is alive
    failed = {**exiting, f"{KV_PREFIX}/failed/0": "OSError: disk full"}
    assert m.observe(failed, now=101.0) == "process 0 of 3 failed (OSError: disk full)"
    never_started = PeerMonitor(process_id=0, num_processes=2, timeout_s=5, now=0.0)
    assert "process 1 of 2 is lost" in never_started.observe({}, now=6.0)


def test_peer_monitor_knows_when_every_peer_has_beaten_since_a_moment():
    m = PeerMonitor(process_id=0, num_processes=3, timeout_s=10, now=0.0)
    m.observe(_entries(p1=1, p2=1), now=1.0)
    m.observe(_entries(p1=1, p2=1), now=4.0)
    m.observe(_entries(p1=2, p2=1), now=5.0)  # process 1 beat after t=4; process 2 before t=1
    assert not m.all_alive_since(3.0, {})
    assert m.all_alive_since(3.0, {f"{KV_PREFIX}/exiting/2": "1"})
    m.observe(_entries(p1=3, p2=2), now=6.0)
    assert m.all_alive_since(3.0, {})


def test_a_beat_first_seen_just_after_a_moment_may_predate_it():
    # the beat seen at t=3.5 may have come at any time after the look at t=1
    m = PeerMonitor(process_id=0, num_processes=2, timeout_s=10, now=0.0)
    m.observe(_entries(p1=1), now=1.0)
    m.observe(_entries(p1=2), now=3.5)
    assert not m.all_alive_since(3.0, {})
    m.observe(_entries(p1=3), now=4.5)
    assert m.all_alive_since(3.0, {})
