"""How a multi-process job exchanges its per-step values (stop signal, f-gram counts): by
`multihost_utils.process_allgather` after queuing each step, as the loop did, or by votes that
ride into the jitted step and come back with its metrics (train/votes.py), as it does now.

A real 2-process job on this machine (gloo collectives, one CPU device per process, one XLA
thread each) runs the loop's pattern with a stand-in step: a jitted matmul chain with an
all-reduce (the device's work) and a host pause before each step (the host building the next
batch, e.g. the SCONE forest; a pause, so that it does not compete with the device for the
cores). Both ways run in turns in the same job. The gather waits for the queued step to
finish before the host may start on the next batch, so a step costs about device + host; with
votes the host builds while the device computes, about max(device, host).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(process_id: int, port: int, steps: int, rounds: int, host_s: float) -> None:
    os.environ.update(
        SCONE_COORDINATOR=f"localhost:{port}",
        SCONE_NUM_PROCESSES="2",
        SCONE_PROCESS_ID=str(process_id),
    )
    from scone_jax.runtime import distributed
    from scone_jax.runtime.distributed import barrier

    distributed.initialize()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from scone_jax.train.votes import process_votes, read_votes, reduce_votes, votes_sharding

    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rows = NamedSharding(mesh, P("data"))
    n = 384
    local = np.random.default_rng(process_id).normal(size=(1, n, n)).astype(np.float32) / n**0.5
    x = jax.make_array_from_process_local_data(rows, local)

    def work(x):
        y = x[0]
        for _ in range(24):
            y = jnp.tanh(y @ y)
        return jnp.sum(y)  # over both processes' rows: an all-reduce, like a train step's

    plain = jax.jit(work)
    with_votes = jax.jit(
        lambda x, votes: {"loss": work(x), **reduce_votes(votes)},
        in_shardings=(rows, votes_sharding(mesh)),
    )

    def gathered() -> float:
        start, before = time.perf_counter(), None
        for _ in range(steps):
            time.sleep(host_s)  # the next batch
            out = plain(x)
            if before is not None:
                float(before)  # the step before: its metrics
            before = out
            np.ravel(multihost_utils.process_allgather(np.int32(0)))  # the stop signal
        float(before)
        return (time.perf_counter() - start) / steps

    def voted() -> float:
        start, before = time.perf_counter(), None
        for _ in range(steps):
            time.sleep(host_s)
            out = with_votes(x, process_votes(mesh, np.array([0, 1, 2])))
            if before is not None:
                metrics = dict(jax.device_get(before))
                stop, counts = read_votes(metrics)
                assert stop == 0 and counts.tolist() == [2, 4]
            before = out
        jax.device_get(before)
        return (time.perf_counter() - start) / steps

    float(plain(x))  # compile both, and time the device's step alone
    jax.device_get(with_votes(x, process_votes(mesh, np.array([0, 1, 2]))))
    start = time.perf_counter()
    for _ in range(5):
        float(plain(x))
    device_s = (time.perf_counter() - start) / 5
    times = {"gather": [], "votes": []}
    for r in range(rounds):
        for name in ("gather", "votes") if r % 2 == 0 else ("votes", "gather"):
            times[name].append(gathered() if name == "gather" else voted())
    if process_id == 0:
        print("RESULT " + json.dumps({"device_s": device_s, "host_s": host_s, **times}), flush=True)
    barrier("bench_votes done")  # neither leaves while the other still needs the job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def measure(steps: int, rounds: int, host_s: float) -> dict:
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_votes",
                str(p),
                str(port),
                str(steps),
                str(rounds),
                str(host_s),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    outputs = [p.communicate(timeout=1200) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        if proc.returncode:
            raise RuntimeError(f"bench_votes worker exited {proc.returncode}: {err[-2000:]}")
    line = next(x for x in outputs[0][0].splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def run(quick: bool = False) -> str:
    import statistics

    steps, rounds = (10, 2) if quick else (30, 4)
    rows = []
    for host_fraction in (0.5, 1.0):
        probe = measure(3, 1, 0.0)
        host_s = round(probe["device_s"] * host_fraction, 3)
        r = measure(steps, rounds, host_s)
        gather, votes = statistics.median(r["gather"]), statistics.median(r["votes"])
        rows.append(
            f"| {r['device_s'] * 1e3:.0f} ms | {host_s * 1e3:.0f} ms | {gather * 1e3:.0f} ms | "
            f"{votes * 1e3:.0f} ms | {gather / votes:.2f}x |"
        )
    load = os.getloadavg()[0]
    return "\n".join(
        [
            "## Per-step agreement in a multi-process job: a gather after each step, or votes",
            "",
            f"`python -m benchmarks.run_all --only votes` on {time.strftime('%Y-%m-%d')}: "
            "a real 2-process job on this machine (gloo, one CPU device and one XLA thread per "
            "process). Each step: a host pause standing in for building the next batch, then a "
            "jitted matmul chain with an all-reduce standing in for the train step. *Gather*: "
            "the loop as it was, a `multihost_utils.process_allgather` of the stop signal after "
            "queuing each step (a jitted all-gather, queued behind the step). *Votes*: the "
            "values ride into the step and come back with its metrics, read one step late "
            f"(`train/votes.py`). Median of {rounds} rounds of {steps} steps, the two in turns; "
            f"load average {load:.1f} at the end.",
            "",
            "| device step | host work | per step, gather | per step, votes | gather / votes |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "The gather makes every step cost about device + host, since the host starts the next "
            "batch only after the queued step has finished; with votes the two overlap and a step "
            "costs about the larger of them. The forest buffers' shape agreement before each "
            "step is still a gather, but it waits only for the step before, which the host's "
            "batch building has overlapped already.",
        ]
    )


if __name__ == "__main__":
    worker(*map(int, sys.argv[1:3]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
