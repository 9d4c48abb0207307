"""Start `jax.distributed` for one process of a multi-process job, and stop promptly when a peer is lost.

`initialize()` is the one entry point; the CLI calls it before anything touches devices. Where
the job comes from, first match wins: explicit arguments (CLI flags), `SCONE_*` environment
variables, a SLURM step (`srun`), a Kubernetes indexed Job / JobSet (`JOB_COMPLETION_INDEX` plus
`SCONE_COORDINATOR`/`SCONE_NUM_PROCESSES`), or jax's own detection (Cloud TPU, GKE TPU, Open MPI)
when `SCONE_DISTRIBUTED=auto` or those environments are seen. A single process starts nothing.

Why a watchdog on top of jax's runtime: the runtime aborts every process when one stops sending
heartbeats, but only after `heartbeat_timeout` and with a C++ stack trace; and a process that
fails with a Python exception keeps heartbeating while it waits in jax's shutdown barrier, so
its peers sit in their next collective until `shutdown_timeout`. The watchdog (a daemon thread)
publishes this process's heartbeat and failure in the coordination service's key-value store
and ends the process with one line naming the peer when a peer fails or falls silent.
"""

from __future__ import annotations

import atexit
import inspect
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from scone_jax.errors import UserError

ENV_COORDINATOR = "SCONE_COORDINATOR"
ENV_NUM_PROCESSES = "SCONE_NUM_PROCESSES"
ENV_PROCESS_ID = "SCONE_PROCESS_ID"
ENV_MODE = "SCONE_DISTRIBUTED"  # auto | off; unset = detect
ENV_PORT = "SCONE_COORDINATOR_PORT"  # port of a coordinator derived from the cluster (SLURM)
ENV_TIMEOUTS = {"init_s": "SCONE_INIT_TIMEOUT", "heartbeat_s": "SCONE_HEARTBEAT_TIMEOUT",
                "shutdown_s": "SCONE_SHUTDOWN_TIMEOUT", "peer_s": "SCONE_PEER_TIMEOUT"}

PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL: rerun the job to resume from the last checkpoint
KV_PREFIX = "scone_jax/watchdog"


class DistributedError(UserError):
    """The job could not be joined, or was described inconsistently."""


@dataclass(frozen=True)
class Cluster:
    """How this process joins the job. `None` fields are left to jax's cluster detection."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    source: str  # where the values came from, for the topology line and error messages

    @property
    def explicit(self) -> bool:
        return None not in (self.coordinator, self.num_processes, self.process_id)


@dataclass(frozen=True)
class Timeouts:
    """Seconds. `peer_s` is the watchdog's (0 = no watchdog); `heartbeat_s` is jax's, a backstop."""

    init_s: float = 300
    heartbeat_s: float = 0  # 0 = peer_s + 30 (or jax's 100 without a watchdog)
    shutdown_s: float = 120
    peer_s: float = 60

    def resolved(self) -> Timeouts:
        if self.heartbeat_s:
            return self
        return replace(self, heartbeat_s=self.peer_s + 30 if self.peer_s else 100)


# ---------------------------------------------------------------------------------------------
# Where the job description comes from


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def slurm_first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'n1', 'n1,n2', 'n[001-004],m7', 'gpu-[3,5-9]'."""
    m = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist.strip())
    if not m or not (m.group(1) or m.group(2)):
        raise DistributedError(f"cannot read the first host of SLURM node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    return prefix + (re.split(r"[,-]", ranges)[0] if ranges else "")


def detect(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
           env: Mapping[str, str] | None = None) -> Cluster | None:
    """The job this process belongs to, or None for a single process (nothing to initialize)."""
    env = os.environ if env is None else env
    mode = env.get(ENV_MODE, "").strip().lower()
    if mode not in ("", "auto", "off"):
        raise DistributedError(f"{ENV_MODE}={mode!r}; expected 'auto', 'off' or unset")
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    from_env = {"coordinator": env.get(ENV_COORDINATOR, "").strip() or None,
                "num_processes": _env_int(env, ENV_NUM_PROCESSES), "process_id": _env_int(env, ENV_PROCESS_ID)}
    if mode == "off" and not any(v is not None for v in given.values()):
        return None
    if any(v is not None for v in (*given.values(), *from_env.values())):
        merged = {k: given[k] if given[k] is not None else from_env[k] for k in given}
        source = "flags" if any(v is not None for v in given.values()) else "SCONE_* environment"
        if merged["process_id"] is None and _env_int(env, "JOB_COMPLETION_INDEX") is not None:
            merged["process_id"], source = _env_int(env, "JOB_COMPLETION_INDEX"), "Kubernetes indexed Job"
        return _checked(Cluster(**merged, source=source))
    if mode == "auto":
        return Cluster(None, None, None, source=f"jax cluster detection ({ENV_MODE}=auto)")
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID")
    if all(k in env for k in slurm) and (_env_int(env, "SLURM_NTASKS") or 1) > 1:
        port = _env_int(env, ENV_PORT) or _env_int(env, "JAX_COORDINATOR_PORT") or \
            61440 + int(env["SLURM_JOB_ID"]) % 4096  # jax's choice: the ephemeral range, by job id
        return _checked(Cluster(f"{slurm_first_host(env['SLURM_STEP_NODELIST'])}:{port}",
                                _env_int(env, "SLURM_NTASKS"), _env_int(env, "SLURM_PROCID"), source="SLURM"))
    if (_env_int(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
        return Cluster(None, None, None, source="Open MPI (jax cluster detection)")
    if "," in env.get("TPU_WORKER_HOSTNAMES", "") or "," in env.get("TPU_PROCESS_ADDRESSES", ""):
        return Cluster(None, None, None, source="GKE TPU (jax cluster detection)")
    return None


def _checked(cluster: Cluster) -> Cluster | None:
    missing = [flag for flag, value in (("--coordinator / " + ENV_COORDINATOR, cluster.coordinator),
                                        ("--num-processes / " + ENV_NUM_PROCESSES, cluster.num_processes),
                                        ("--process-id / " + ENV_PROCESS_ID, cluster.process_id))
               if value is None]
    if cluster.num_processes == 1 and cluster.process_id in (None, 0):
        return None
    if missing:
        raise DistributedError(f"a multi-process job needs a coordinator, a process count and a process id; "
                               f"missing {', '.join(missing)} (from {cluster.source})")
    if cluster.num_processes < 1 or not 0 <= cluster.process_id < cluster.num_processes:
        raise DistributedError(f"process id {cluster.process_id} is not in [0, {cluster.num_processes}) "
                               f"(from {cluster.source})")
    if not re.fullmatch(r"\S+:\d+", cluster.coordinator):
        raise DistributedError(f"coordinator {cluster.coordinator!r} is not HOST:PORT (from {cluster.source})")
    return cluster


def timeouts_from_env(env: Mapping[str, str] | None = None, **given: float | None) -> Timeouts:
    """Explicit values, else SCONE_*_TIMEOUT variables, else the defaults."""
    env = os.environ if env is None else env
    values = {}
    for field, name in ENV_TIMEOUTS.items():
        value = given.get(field)
        if value is None and env.get(name, "").strip():
            try:
                value = float(env[name])
            except ValueError:
                raise DistributedError(f"{name}={env[name]!r} is not a number of seconds") from None
        if value is not None:
            if value < 0:
                raise DistributedError(f"{name} must be >= 0 seconds, got {value}")
            values[field] = value
    return Timeouts(**values).resolved()


# ---------------------------------------------------------------------------------------------
# The watchdog


class PeerMonitor:
    """Decides, from snapshots of the watchdog's key-value directory, whether a peer is lost.

    A peer is lost when it reported a failure, or when its heartbeat counter has not changed
    for `timeout_s` of this process's own clock (no clock is compared across hosts). A peer
    that announced a normal exit is no longer watched.
    """

    def __init__(self, process_id: int, num_processes: int, timeout_s: float, now: float):
        self.process_id, self.num_processes, self.timeout_s = process_id, num_processes, timeout_s
        self.peers = [p for p in range(num_processes) if p != process_id]
        self._last: dict[int, tuple[str | None, float]] = {p: (None, now) for p in self.peers}

    def all_alive_since(self, moment: float, entries: Mapping[str, str]) -> bool:
        """Whether every peer has beaten (or announced its exit) after `moment`: none is lost then."""
        return all(self._last[p][1] > moment or f"{KV_PREFIX}/exiting/{p}" in entries for p in self.peers)

    def observe(self, entries: Mapping[str, str], now: float) -> str | None:
        """One line naming the lost peer, or None while every peer is fine."""
        for p in self.peers:
            failed = entries.get(f"{KV_PREFIX}/failed/{p}")
            if failed is not None:
                return f"process {p} of {self.num_processes} failed ({failed})"
        for p in self.peers:
            if f"{KV_PREFIX}/exiting/{p}" in entries:
                continue
            beat = entries.get(f"{KV_PREFIX}/beat/{p}")
            last_beat, since = self._last[p]
            if beat != last_beat:
                self._last[p] = (beat, now)
            elif now - since > self.timeout_s:
                return (f"process {p} of {self.num_processes} is lost (no heartbeat for "
                        f"{now - since:.0f}s, limit {self.timeout_s:g}s)")
        return None


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return getattr(exc, "exit_code", 1) if isinstance(exc, UserError) else 1


class Watchdog:
    """A daemon thread: heartbeat into the key-value store, watch the peers, end this process if one is lost."""

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, coordinator: str):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout_s, self.coordinator = timeout_s, coordinator
        self.interval_s = min(1.0, timeout_s / 10)
        self.monitor = PeerMonitor(process_id, num_processes, timeout_s, time.monotonic())
        self._stop = threading.Event()
        self._failed_code: int | None = None  # set once this process's failure is published
        self._pending: tuple[int, str, float] | None = None  # a runtime error, not yet published
        self._thread = threading.Thread(target=self._run, name="scone-jax-watchdog", daemon=True)

    def start(self) -> None:
        self._set("beat", "0")
        self._thread.start()
        atexit.register(self._at_exit)  # runs before jax's own atexit shutdown (registered at import)

    def _set(self, kind: str, value: str) -> None:
        self.client.key_value_set(f"{KV_PREFIX}/{kind}/{self.process_id}", value, allow_overwrite=True)

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(self.interval_s):
            beat += 1
            try:
                self._set("beat", str(beat))
                entries = dict(self.client.key_value_dir_get(f"{KV_PREFIX}/"))
            except Exception as e:  # noqa: BLE001 - any failure here means the coordinator is gone
                if self._stop.is_set():
                    return
                self._die(f"lost the coordinator (process 0 at {self.coordinator}): {str(e).splitlines()[0]}")
                return
            if self._failed_code is not None:
                continue  # this process is already on its way out; it only keeps the heartbeat
            verdict = self.monitor.observe(entries, time.monotonic())
            if verdict:
                self._die(verdict)
            pending = self._pending
            if pending is not None and self.monitor.all_alive_since(pending[2] + self.interval_s, entries):
                self._publish(pending[0], pending[1])  # every peer is alive: the error was this process's own

    def _die(self, verdict: str) -> None:
        try:
            self._set("acked", "1")  # lets a failed coordinator know its message was read
        except Exception:  # noqa: BLE001
            pass
        print(f"scone-jax: {verdict}; stopping process {self.process_id}. Rerun the job to resume "
              f"(training from its last checkpoint, an export from its finished rows).", file=sys.stderr, flush=True)
        os._exit(PEER_LOST_EXIT_CODE)

    def report_failure(self, exc: BaseException) -> None:
        """Tell the peers this process failed, so they stop now instead of in a collective's timeout.

        A runtime (XLA) error is usually a collective broken by a peer that died: it is published
        only once every peer has shown a heartbeat since, so that when a peer is lost, the line
        that ends the job names that peer (the watchdog finds it within the peer timeout).
        """
        if self._failed_code is not None or self._pending is not None:
            return
        code = _exit_code(exc)
        line = (f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__)[:300]
        if type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
            self._pending = (code, line, time.monotonic())
        else:
            self._publish(code, line)

    def _publish(self, code: int, line: str) -> None:
        self._failed_code = code
        try:
            self._set("failed", line)
        except Exception:  # noqa: BLE001 - the coordinator is gone: the runtime stops the peers
            pass

    def _at_exit(self) -> None:
        if self._pending is not None and self._failed_code is None:
            # the watchdog decides: it ends the process naming a lost peer, or publishes the error
            deadline = time.monotonic() + self.timeout_s + 3 * self.interval_s
            while self._failed_code is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._failed_code is None:
                self._publish(*self._pending[:2])
        if self._failed_code is None:
            try:
                self._set("exiting", "1")
            except Exception:  # noqa: BLE001
                pass
            self._stop.set()
            return
        # Failed: skip jax's shutdown barrier (the peers are stopping, not coming to it). The
        # coordinator hosts the key-value store, so it waits until the peers have read the failure.
        if self.process_id == 0:
            deadline = time.monotonic() + min(self.timeout_s, 3 * self.interval_s + 5)
            while time.monotonic() < deadline and not self._peers_gone():
                time.sleep(0.1)
        self._stop.set()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self._failed_code)

    def _peers_gone(self) -> bool:
        try:
            entries = dict(self.client.key_value_dir_get(f"{KV_PREFIX}/"))
        except Exception:  # noqa: BLE001
            return True
        return all(any(f"{KV_PREFIX}/{k}/{p}" in entries for k in ("acked", "failed", "exiting"))
                   for p in self.monitor.peers)


# ---------------------------------------------------------------------------------------------
# The entry point


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
        return (f"distributed: {self.num_processes} processes ({self.cluster.source}; coordinator "
                f"{self.cluster.coordinator}), {self.global_devices} devices ({self.local_devices} on process "
                f"{self.process_id}; {', '.join(self.device_kinds)}); {watchdog}, heartbeat timeout "
                f"{t.heartbeat_s:g}s, shutdown timeout {t.shutdown_s:g}s")


_state: dict[str, object] = {}


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, init_timeout_s: float | None = None, heartbeat_timeout_s: float | None = None,
               shutdown_timeout_s: float | None = None, peer_timeout_s: float | None = None,
               env: Mapping[str, str] | None = None) -> Topology | None:
    """Join the multi-process job (if this is one); returns its topology, or None for one process.

    Call before anything touches devices. Idempotent. Process 0 prints the topology once.
    """
    if "topology" in _state:
        return _state["topology"]  # type: ignore[return-value]
    cluster = detect(coordinator, num_processes, process_id, env)
    if cluster is None:
        return None
    timeouts = timeouts_from_env(env, init_s=init_timeout_s, heartbeat_s=heartbeat_timeout_s,
                                 shutdown_s=shutdown_timeout_s, peer_s=peer_timeout_s)
    import jax
    from jax._src import distributed as jax_distributed

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {"initialization_timeout": int(timeouts.init_s), "heartbeat_timeout_seconds": int(timeouts.heartbeat_s),
              "shutdown_timeout_seconds": int(timeouts.shutdown_s)}
    accepted = inspect.signature(jax.distributed.initialize).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if cluster.explicit:
        kwargs["cluster_detection_method"] = "deactivate"  # and keep every local device visible
    # jax aborts the process (a C++ fatal error) when the job cannot be joined in time: say first what it tried
    who = f"process {cluster.process_id} of {cluster.num_processes}" if cluster.explicit else "this process"
    print(f"scone-jax: {who} joining {cluster.coordinator or 'the detected coordinator'} ({cluster.source}; "
          f"init timeout {timeouts.init_s:g}s)", file=sys.stderr, flush=True)
    try:
        jax.distributed.initialize(cluster.coordinator, cluster.num_processes, cluster.process_id, **kwargs)
    except RuntimeError as e:
        if "must be called before" in str(e):
            raise RuntimeError("scone_jax.dist.distributed.initialize() must run before anything touches "
                               "devices (jax.devices(), a computation)") from e
        raise
    except ValueError as e:  # jax's cluster detection found no complete description
        raise DistributedError(f"could not work out the job from {cluster.source}: {e}") from None
    pid, nproc = jax.process_index(), jax.process_count()
    cluster = replace(cluster, coordinator=jax_distributed.global_state.coordinator_address,
                      num_processes=nproc, process_id=pid)
    devices = jax.devices()
    topology = Topology(pid, nproc, jax.local_device_count(), len(devices),
                        tuple(sorted({d.device_kind for d in devices})), cluster, timeouts)
    _state["topology"] = topology
    if pid == 0:
        print(f"scone-jax: {topology.describe()}", file=sys.stderr, flush=True)
    if nproc > 1 and timeouts.peer_s:
        # the coordination service's key-value store has no public handle; orbax uses this one too
        watchdog = Watchdog(jax_distributed.global_state.client, pid, nproc, timeouts.peer_s, cluster.coordinator)
        try:
            watchdog.start()
        except (AttributeError, TypeError) as e:  # a jaxlib whose client lacks the key-value calls used here
            print(f"scone-jax: no watchdog on process {pid} ({e}); a lost peer is found by jax's heartbeat "
                  f"timeout ({timeouts.heartbeat_s:g}s)", file=sys.stderr, flush=True)
        else:
            _state["watchdog"] = watchdog
    return topology


def report_failure(exc: BaseException) -> None:
    """Tell the peers this process is failing with `exc` (a no-op without a watchdog)."""
    watchdog = _state.get("watchdog")
    if watchdog is not None:
        watchdog.report_failure(exc)  # type: ignore[attr-defined]


@contextmanager
def failures_reported():
    """Report any exception escaping the block to the peers, then re-raise it."""
    try:
        yield
    except BaseException as e:
        report_failure(e)
        raise


_barriers: dict[str, int] = {}


def barrier(name: str, timeout_s: float = 24 * 3600) -> None:
    """Wait until every process reaches this point (no-op for one process); all call it in the same order.

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


# ---------------------------------------------------------------------------------------------
# CLI glue


def add_cli_arguments(parser) -> None:
    """--coordinator/--num-processes/--process-id/--peer-timeout; absent flags fall back to the environment."""
    from argparse import SUPPRESS

    g = parser.add_argument_group("multi-process jobs (docs/launch.md); default: from the environment")
    g.add_argument("--coordinator", metavar="HOST:PORT", default=SUPPRESS,
                   help=f"process 0's address and a free port (env {ENV_COORDINATOR})")
    g.add_argument("--num-processes", type=int, default=SUPPRESS, metavar="N",
                   help=f"process count (env {ENV_NUM_PROCESSES})")
    g.add_argument("--process-id", type=int, default=SUPPRESS, metavar="I",
                   help=f"this process, 0..N-1 (env {ENV_PROCESS_ID})")
    g.add_argument("--peer-timeout", type=float, default=SUPPRESS, metavar="S",
                   help=f"stop when a peer is silent this long; 0 = no watchdog (env {ENV_TIMEOUTS['peer_s']}, "
                   "default 60)")


def initialize_from_args(args) -> Topology | None:
    return initialize(getattr(args, "coordinator", None), getattr(args, "num_processes", None),
                      getattr(args, "process_id", None), peer_timeout_s=getattr(args, "peer_timeout", None))
