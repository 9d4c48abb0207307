"""Where a multi-process job's description comes from, first match wins: explicit arguments
(CLI flags), `SCONE_*` environment variables, a SLURM step (`srun`), a Kubernetes indexed Job /
JobSet (`JOB_COMPLETION_INDEX` plus `SCONE_COORDINATOR`/`SCONE_NUM_PROCESSES`), or jax's own
detection (Cloud TPU, GKE TPU, Open MPI) when `SCONE_DISTRIBUTED=auto` or those environments are
seen. A single process needs nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from scone_jax.errors import UserError

ENV_COORDINATOR = "SCONE_COORDINATOR"
ENV_NUM_PROCESSES = "SCONE_NUM_PROCESSES"
ENV_PROCESS_ID = "SCONE_PROCESS_ID"
ENV_MODE = "SCONE_DISTRIBUTED"  # auto | off; unset = detect
ENV_PORT = "SCONE_COORDINATOR_PORT"  # port of a coordinator derived from the cluster (SLURM)
ENV_TIMEOUTS = {
    "init_s": "SCONE_INIT_TIMEOUT",
    "heartbeat_s": "SCONE_HEARTBEAT_TIMEOUT",
    "shutdown_s": "SCONE_SHUTDOWN_TIMEOUT",
    "peer_s": "SCONE_PEER_TIMEOUT",
}


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


def detect(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Cluster | None:
    """The job this process belongs to, or None for a single process (nothing to initialize)."""
    env = os.environ if env is None else env
    mode = env.get(ENV_MODE, "").strip().lower()
    if mode not in ("", "auto", "off"):
        raise DistributedError(f"{ENV_MODE}={mode!r}; expected 'auto', 'off' or unset")
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    from_env = {
        "coordinator": env.get(ENV_COORDINATOR, "").strip() or None,
        "num_processes": _env_int(env, ENV_NUM_PROCESSES),
        "process_id": _env_int(env, ENV_PROCESS_ID),
    }
    if mode == "off" and not any(v is not None for v in given.values()):
        return None
    if any(v is not None for v in (*given.values(), *from_env.values())):
        merged = {k: given[k] if given[k] is not None else from_env[k] for k in given}
        source = "flags" if any(v is not None for v in given.values()) else "SCONE_* environment"
        if merged["process_id"] is None and _env_int(env, "JOB_COMPLETION_INDEX") is not None:
            merged["process_id"], source = (
                _env_int(env, "JOB_COMPLETION_INDEX"),
                "Kubernetes indexed Job",
            )
        return _checked(Cluster(**merged, source=source))
    if mode == "auto":
        return Cluster(None, None, None, source=f"jax cluster detection ({ENV_MODE}=auto)")
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID")
    if all(k in env for k in slurm) and (_env_int(env, "SLURM_NTASKS") or 1) > 1:
        port = (
            _env_int(env, ENV_PORT)
            or _env_int(env, "JAX_COORDINATOR_PORT")
            or 61440 + int(env["SLURM_JOB_ID"]) % 4096
        )  # jax's choice: the ephemeral range, by job id
        return _checked(
            Cluster(
                f"{slurm_first_host(env['SLURM_STEP_NODELIST'])}:{port}",
                _env_int(env, "SLURM_NTASKS"),
                _env_int(env, "SLURM_PROCID"),
                source="SLURM",
            )
        )
    if (_env_int(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
        return Cluster(None, None, None, source="Open MPI (jax cluster detection)")
    if "," in env.get("TPU_WORKER_HOSTNAMES", "") or "," in env.get("TPU_PROCESS_ADDRESSES", ""):
        return Cluster(None, None, None, source="GKE TPU (jax cluster detection)")
    return None


def _checked(cluster: Cluster) -> Cluster | None:
    missing = [
        flag
        for flag, value in (
            ("--coordinator / " + ENV_COORDINATOR, cluster.coordinator),
            ("--num-processes / " + ENV_NUM_PROCESSES, cluster.num_processes),
            ("--process-id / " + ENV_PROCESS_ID, cluster.process_id),
        )
        if value is None
    ]
    if cluster.num_processes == 1 and cluster.process_id in (None, 0):
        return None
    if missing:
        raise DistributedError(
            f"a multi-process job needs a coordinator, a process count and a process id; "
            f"missing {', '.join(missing)} (from {cluster.source})"
        )
    if cluster.num_processes < 1 or not 0 <= cluster.process_id < cluster.num_processes:
        raise DistributedError(
            f"process id {cluster.process_id} is not in [0, {cluster.num_processes}) "
            f"(from {cluster.source})"
        )
    if not re.fullmatch(r"\S+:\d+", cluster.coordinator):
        raise DistributedError(
            f"coordinator {cluster.coordinator!r} is not HOST:PORT (from {cluster.source})"
        )
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
