#!/usr/bin/env python3
"""Run a real N-process scone-jax job on this machine: CPU devices, gloo collectives, one port.

    launch/local.py --devices-per-process 4 2 train tiny mesh.data=2 mesh.fsdp=2 mesh.tensor=2
    launch/local.py --dry-run 2 train tiny          # print the N commands, run nothing

Each process gets SCONE_COORDINATOR / SCONE_NUM_PROCESSES / SCONE_PROCESS_ID (read by
`scone_jax.runtime.distributed.initialize`), JAX_PLATFORMS=cpu and its own fake CPU devices. Output
lines are prefixed `[pI]`. The exit status is the first failing process's (0 when all succeed);
once one fails, the rest get `--grace` seconds to stop by themselves (their watchdog names the
lost peer) before they are killed. Options go before N; everything after N is passed on.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_env(
    base: dict[str, str], index: int, count: int, coordinator: str, devices: int
) -> dict[str, str]:
    """The environment of process `index`: the job description plus its fake CPU devices."""
    xla_flags = re.sub(
        r"--xla_force_host_platform_device_count=\S+", "", base.get("XLA_FLAGS", "")
    ).strip()
    return {
        "SCONE_COORDINATOR": coordinator,
        "SCONE_NUM_PROCESSES": str(count),
        "SCONE_PROCESS_ID": str(index),
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
        "XLA_FLAGS": f"{xla_flags} --xla_force_host_platform_device_count={devices}".strip(),
    }


def build_commands(args) -> list[tuple[dict[str, str], list[str]]]:
    coordinator = f"{args.host}:{args.port or free_port(args.host)}"
    command = (
        list(args.args) if args.command else [args.python, "-m", "scone_jax.cli.main", *args.args]
    )
    return [
        (
            process_env(
                dict(os.environ), i, args.num_processes, coordinator, args.devices_per_process
            ),
            command,
        )
        for i in range(args.num_processes)
    ]


# one writer at a time: every process's two pumps and the main thread share stdout and stderr,
# and a text stream written from several threads at once can run two lines into one
_OUTPUT = threading.Lock()


def _write(out, text: str) -> None:
    with _OUTPUT:
        out.write(text)
        out.flush()


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, ""):
        _write(out, f"{prefix}{line}")
    stream.close()


def _python_path() -> str:
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(REPO), inherited] if inherited else [str(REPO)])


def run(commands: list[tuple[dict[str, str], list[str]]], grace_s: float) -> int:
    procs, pumps = [], []
    for i, (env, command) in enumerate(commands):
        p = subprocess.Popen(
            command,
            # the caller's working directory, so relative paths mean what they meant to the
            # caller; the repository on the path, so `-m scone_jax...` runs from a checkout too
            env={**os.environ, **env, "PYTHONPATH": _python_path()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        procs.append(p)
        for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=_pump, args=(stream, f"[p{i}] ", out), daemon=True)
            t.start()
            pumps.append(t)

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    status, failed_at, reported, killed = 0, None, set(), set()
    while any([p.poll() is None for p in procs]):  # a list: poll every process each time
        for i, p in enumerate(procs):
            if p.returncode not in (None, 0) and i not in reported:
                reported.add(i)
                _write(sys.stderr, f"local.py: process {i} {_ended(p.returncode)}\n")
                if failed_at is None:
                    status, failed_at = p.returncode, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for i, p in enumerate(procs):
                if p.poll() is None and i not in killed:
                    _write(
                        sys.stderr,
                        f"local.py: killing process {i} ({grace_s:g}s after the first failure)\n",
                    )
                    p.kill()
                    killed.add(i)
        time.sleep(0.05)
    for t in pumps:
        t.join()
    for i, p in enumerate(procs):
        if p.returncode and i not in reported:
            _write(sys.stderr, f"local.py: process {i} {_ended(p.returncode)}\n")
            status = status or p.returncode
    return status if status >= 0 else 128 - status  # killed by signal N -> 128 + N, like a shell


def _ended(returncode: int) -> str:
    """How a process ended, in words: its exit status, or the signal that killed it."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="launch/local.py",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [options] N [scone-jax args ...]",
    )
    parser.add_argument("num_processes", type=int, metavar="N", help="number of processes")
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="scone-jax arguments (e.g. train CONFIG key=value)"
    )
    parser.add_argument(
        "--devices-per-process",
        type=int,
        default=4,
        metavar="D",
        help="fake CPU devices in each process (default 4)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="coordinator host (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=0, help="coordinator port (default: a free one)"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=90.0,
        metavar="S",
        help="seconds the others get to stop after one fails, before they are killed (default "
        "90: past the watchdog's 60 s peer timeout, so a process waiting on a lost peer ends "
        "with its own message first)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for scone-jax (default: this one)"
    )
    parser.add_argument(
        "--command",
        action="store_true",
        help="the arguments are a whole command (e.g. python script.py), not scone-jax arguments",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print each process's command and run nothing"
    )
    args = parser.parse_args(argv)
    if args.num_processes < 1 or args.devices_per_process < 1:
        parser.error("N and --devices-per-process must be >= 1")
    if not args.args:
        parser.error("nothing to run: give scone-jax arguments after N (e.g. train tiny)")
    commands = build_commands(args)
    if args.dry_run:
        for env, command in commands:
            print(shlex.join([f"{k}={v}" for k, v in env.items()] + command))
        return 0
    return run(commands, args.grace)


if __name__ == "__main__":
    sys.exit(main())
