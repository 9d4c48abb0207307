"""Start `jax.distributed` for one process of a multi-process job; barriers between processes.

`initialize()` is the one entry point; the CLI calls it before anything touches devices. Where
the job comes from: `runtime/cluster.py`; what stops the job when a peer is lost:
`runtime/watchdog.py`. A single process starts nothing.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from scone_jax.runtime.cluster import Cluster, DistributedError, Timeouts, detect, timeouts_from_env
from scone_jax.runtime.watchdog import Watchdog


@dataclass(frozen=True)
class Topology:
    process_id: int
    num_processes: int
    local_devices: int
    global_devices: int
    device_kinds: tuple[str, ...]
    cluster: Cluster
    timeouts: Timeouts

    def describe(self) -> str:
        t = self.timeouts
        watchdog = f"peer timeout {t.peer_s:g}s" if t.peer_s else "no watchdog"
        return (
            f"distributed: {self.num_processes} processes ({self.cluster.source}; coordinator "
            f"{self.cluster.coordinator}), {self.global_devices} devices ({self.local_devices} on "
            f"process {self.process_id}; {', '.join(self.device_kinds)}); {watchdog}, heartbeat "
            f"timeout {t.heartbeat_s:g}s, shutdown timeout {t.shutdown_s:g}s"
        )


_state: dict[str, object] = {}


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    init_timeout_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    shutdown_timeout_s: float | None = None,
    peer_timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Topology | None:
    """Join the multi-process job (if this is one); returns its topology, or None for one process.

    Call before anything touches devices. Idempotent. Process 0 prints the topology once.
    """
    if "topology" in _state:
        return _state["topology"]  # type: ignore[return-value]
    cluster = detect(coordinator, num_processes, process_id, env)
    if cluster is None:
        return None
    timeouts = timeouts_from_env(
        env,
        init_s=init_timeout_s,
        heartbeat_s=heartbeat_timeout_s,
        shutdown_s=shutdown_timeout_s,
        peer_s=peer_timeout_s,
    )
    import jax
    from jax._src import distributed as jax_distributed

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {
        "initialization_timeout": int(timeouts.init_s),
        "heartbeat_timeout_seconds": int(timeouts.heartbeat_s),
        "shutdown_timeout_seconds": int(timeouts.shutdown_s),
    }
    accepted = inspect.signature(jax.distributed.initialize).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if cluster.explicit:
        kwargs["cluster_detection_method"] = "deactivate"  # and keep every local device visible
    # jax aborts the process (a C++ fatal error) when the job cannot be joined in time: say first
    # what it tried
    who = (
        f"process {cluster.process_id} of {cluster.num_processes}"
        if cluster.explicit
        else "this process"
    )
    print(
        f"scone-jax: {who} joining {cluster.coordinator or 'the detected coordinator'} "
        f"({cluster.source}; init timeout {timeouts.init_s:g}s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        jax.distributed.initialize(
            cluster.coordinator, cluster.num_processes, cluster.process_id, **kwargs
        )
    except RuntimeError as e:
        if "must be called before" in str(e):
            raise RuntimeError(
                "scone_jax.runtime.distributed.initialize() must run before anything touches "
                "devices (jax.devices(), a computation)"
            ) from e
        raise
    except ValueError as e:  # jax's cluster detection found no complete description
        raise DistributedError(f"could not work out the job from {cluster.source}: {e}") from None
    pid, nproc = jax.process_index(), jax.process_count()
    cluster = replace(
        cluster,
        coordinator=jax_distributed.global_state.coordinator_address,
        num_processes=nproc,
        process_id=pid,
    )
    devices = jax.devices()
    topology = Topology(
        pid,
        nproc,
        jax.local_device_count(),
        len(devices),
        tuple(sorted({d.device_kind for d in devices})),
        cluster,
        timeouts,
    )
    _state["topology"] = topology
    if pid == 0:
        print(f"scone-jax: {topology.describe()}", file=sys.stderr, flush=True)
    if nproc > 1 and timeouts.peer_s:
        # the coordination service's key-value store has no public handle; orbax uses this one too
        watchdog = Watchdog(
            jax_distributed.global_state.client, pid, nproc, timeouts.peer_s, cluster.coordinator
        )
        try:
            watchdog.start()
        except (
            AttributeError,
            TypeError,
        ) as e:  # a jaxlib whose client lacks the key-value calls used here
            print(
                f"scone-jax: no watchdog on process {pid} ({e}); a lost peer is found by jax's "
                f"heartbeat timeout ({timeouts.heartbeat_s:g}s)",
                file=sys.stderr,
                flush=True,
            )
        else:
            _state["watchdog"] = watchdog
    return topology


def joined() -> bool:
    """Whether this process joined a multi-process job."""
    return _state.get("topology") is not None


def process_index() -> int:
    """This process's index in the job joined by `initialize()`, 0 for a single process; without
    importing jax, so commands that never touch devices can ask."""
    topology = _state.get("topology")
    return topology.process_id if topology is not None else 0  # type: ignore[attr-defined]


def report_failure(exc: BaseException) -> None:
    """Tell the peers this process is failing with `exc` (a no-op without a watchdog)."""
    watchdog = _state.get("watchdog")
    if watchdog is not None:
        watchdog.report_failure(exc)  # type: ignore[attr-defined]


@contextmanager
def failures_reported(run_dir: str | os.PathLike | None = None):
    """Report any exception escaping the block to the peers, then re-raise it; a runtime error is
    held until the watchdog knows whether a lost peer caused it, which ends the process with one
    line (and the traceback in RUN_DIR/logs/, not on the terminal)."""
    watchdog = _state.get("watchdog")
    if watchdog is not None and run_dir is not None:
        watchdog.log_dir = Path(run_dir) / "logs"  # type: ignore[attr-defined]
    try:
        yield
    except BaseException as e:
        report_failure(e)
        if watchdog is not None:
            watchdog.await_verdict()  # type: ignore[attr-defined]
        raise


_barriers: dict[str, int] = {}


def barrier(name: str, timeout_s: float = 24 * 3600) -> None:
    """Wait until every process reaches this point (no-op for one process); all call it in the same
    order.

    A coordination-service barrier, not a device collective, so a long wait (process 0
    tokenizing a corpus) hits no collective timeout; a failed peer is handled by the watchdog.
    """
    import jax
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if jax.process_count() == 1:
        return
    if client is None:  # a multi-process backend started without jax.distributed (legacy TPU)
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
        return
    _barriers[name] = _barriers.get(name, 0) + 1
    client.wait_at_barrier(f"scone_jax/{name}/{_barriers[name]}", int(timeout_s * 1000))
