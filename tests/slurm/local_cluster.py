"""A real SLURM cluster on 127.0.0.1 for the tests: munged, slurmctld and one or two slurmd.

Everything lives in one temporary directory (config, munge key, state, spool, logs); the
daemons run in the foreground as this process's children and are stopped by pid. The first
node is named after this host, so a job's first node, where scone-jax puts the coordinator of
a SLURM job, resolves here; a second node (`HOST-b`, another slurmd on its own port, both at
127.0.0.1) lets a job span two nodes. Clients find the cluster through `SLURM_CONF`
(`LocalCluster.env`).

    python -m tests.slurm.local_cluster [--nodes 2]   # start one by hand; Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue", "setsid")
PARTITION = "debug"


class ClusterError(RuntimeError):
    """The cluster could not be started; the message names the daemon and its log."""


def missing_programs() -> list[str]:
    return [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p) is None]


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_names(nodes: int) -> list[str]:
    """This host's name (it must resolve here, as a real node's does), then HOST-b, which SLURM
    sorts after it.

    Not `localhost`: SLURM maps any name to a node of that name when it is the only one."""
    first = socket.gethostname()
    try:
        address = socket.gethostbyname(first)
    except OSError as e:
        raise ClusterError(
            f"this host's name {first!r} does not resolve ({e}); expected an /etc/hosts entry"
        ) from None
    if first == "localhost" or not address.startswith("127."):
        raise ClusterError(
            f"this host's name {first!r} resolves to {address}; expected a name other than "
            "localhost that resolves to 127.x"
        )
    return [first, f"{first}-b"][:nodes]


def slurm_conf(root: Path, names: list[str], cpus: int, ports: list[int]) -> str:
    """slurm.conf for `nodes` nodes on 127.0.0.1: root everywhere, no cgroups, short waits.

    KillWait (SIGTERM to SIGKILL when a job or step is ended) is 15 s: long enough for a
    watchdog with a short peer timeout to speak before srun's --kill-on-bad-exit kills the
    survivors, short enough for quick tests. cred_expire=10 is also how long a requeued job
    waits before it may start again (SLURM's default: 2 minutes)."""
    lines = [
        "ClusterName=scone-test",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge.socket'},cred_expire=10",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "KillWait=15",
        "MinJobAge=3600",
        "InactiveLimit=0",
        "MessageTimeout=20",
        "JobRequeue=1",
    ]
    for name, port in zip(names, ports[1:], strict=True):
        lines.append(
            f"NodeName={name} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


class LocalCluster:
    """Start with `with LocalCluster(nodes=2) as cluster:`; `cluster.env` reaches it."""

    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2):
        if nodes not in (1, 2):
            raise ValueError(f"nodes={nodes}; expected 1 or 2")
        self.nodes, self.cpus = nodes, cpus
        self.root = Path(root)  # kept afterwards: the daemons' logs
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[tuple[str, subprocess.Popen]] = []

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = 60) -> None:
        if os.geteuid() != 0:
            raise ClusterError(
                f"running as uid {os.geteuid()}; expected root (slurmd starts jobs as any user)"
            )
        missing = missing_programs()
        if missing:
            raise ClusterError(
                f"SLURM programs not found: {', '.join(missing)}; expected Debian's slurm-wlm "
                "and munge (tests/slurm/install_slurm.sh installs them)"
            )
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged refuses a key or socket in a group/world-writable dir
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.names = node_names(self.nodes)
        self.conf.write_text(
            slurm_conf(self.root, self.names, self.cpus, free_ports(self.nodes + 1))
        )
        r = self.root
        self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--key-file={key}"]
            + [f"--socket={r / 'munge.socket'}", f"--pid-file={r / 'munged.pid'}"]
            + [f"--log-file={r / 'munged.log'}", f"--seed-file={r / 'munged.seed'}"],
        )
        self._wait(lambda: (r / "munge.socket").exists(), "munged", r / "munged.log", timeout_s)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(self._controller_up, "slurmctld", r / "slurmctld.log", timeout_s)
        for name in self.names:
            self._spawn(f"slurmd {name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._partition_up, "slurmd", r / f"slurmd-{self.names[0]}.log", timeout_s)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name.replace(' ', '-')}.out", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        self._procs.append((name, proc))

    def _wait(self, ready, daemon: str, log: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with status {proc.returncode} while starting; see "
                        f"{self.root / (name.replace(' ', '-') + '.out')} and {log}"
                    )
            if ready():
                return
            time.sleep(0.3)
        raise ClusterError(f"{daemon} not ready within {timeout_s:g}s; see {log}")

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> str:
        """A SLURM client command against this cluster; its stdout."""
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode:
            raise ClusterError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
        return out.stdout

    def _controller_up(self) -> bool:
        return (
            subprocess.run(["scontrol", "ping"], env=self.env, capture_output=True).returncode == 0
        )

    def _partition_up(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return len(states) == self.nodes and all(s == "idle" for s in states.values())

    def stop(self) -> None:
        """End the jobs still queued or running, then stop every daemon this object started,
        newest first: SIGTERM, then SIGKILL."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self._procs):
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                self.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + 40
            while jobs and time.monotonic() < deadline:
                time.sleep(0.5)
                jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
        for _name, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, choices=(1, 2))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scone-slurm-") as root:
        with LocalCluster(Path(root), args.nodes) as cluster:
            print(f"SLURM cluster up: export SLURM_CONF={cluster.conf}   (Ctrl-C stops it)")
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it too
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass


if __name__ == "__main__":
    main()
