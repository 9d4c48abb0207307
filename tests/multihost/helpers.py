"""Start real multi-process jobs on localhost through launch/local.py and watch their output."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.train.helpers import wait_for_step

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "launch" / "local.py"
WORKER = Path(__file__).resolve().with_name("worker.py")


class Job:
    """A launch/local.py run whose merged output is collected line by line as it comes."""

    def __init__(self, launcher_args: list[str], env: dict[str, str] | None = None):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(LOCAL), *launcher_args],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.output[-4000:]}")

    def pid(self, process: int) -> int:
        return int(self.wait_for(rf"^\[p{process}\] PID (\d+) PROCESS {process}$").group(1))

    def finish(self, timeout: float = 300) -> int:
        """The launcher's exit status; a job still running after `timeout` is stopped (SIGTERM,
        which the launcher forwards, then SIGKILL) and fails the test with its output."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
            raise AssertionError(
                f"job still running after {timeout:g}s; its output:\n{self.output[-4000:]}"
            ) from None
        self._reader.join(10)
        return code

    def status(self, process: int) -> int | None:
        """The exit status local.py reported for `process`, minus the signal's number when it
        says a signal killed it (as Popen.returncode; None: it exited with 0)."""
        for line in self.lines:
            if m := re.fullmatch(rf"local\.py: process {process} exited with status (\d+)", line):
                return int(m.group(1))
            if m := re.fullmatch(rf"local\.py: process {process} was killed by (SIG\w+)", line):
                return -signal.Signals[m.group(1)]
        return None


def worker_job(
    n: int, *worker_args: str, devices: int = 4, env: dict[str, str] | None = None
) -> Job:
    return Job(
        [
            f"--devices-per-process={devices}",
            "--command",
            str(n),
            sys.executable,
            str(WORKER),
            *worker_args,
        ],
        env,
    )


def scone_job(n: int, *scone_args: str, devices: int = 4, env: dict[str, str] | None = None) -> Job:
    return Job([f"--devices-per-process={devices}", str(n), *scone_args], env)


def process_environ(proc_dir: Path) -> dict[str, str]:
    """The environment a running process started with, from /proc/PID/environ."""
    raw = (proc_dir / "environ").read_bytes().decode()
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def scone_process_pids(launcher_pid: int) -> dict[int, int]:
    """{SCONE_PROCESS_ID: pid} of the launcher's children (Linux /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if (
                not entry.name.isdigit()
                or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher_pid
            ):
                continue
            env = process_environ(entry)
        except (OSError, ValueError):
            continue
        if "SCONE_PROCESS_ID" in env:
            found[int(env["SCONE_PROCESS_ID"])] = int(entry.name)
    return found


def wait_for_job_step(run_dir: Path, step: int, job, timeout: float = 240) -> None:
    """`wait_for_step` for a launcher job (its output is both processes')."""
    wait_for_step(run_dir, step, job.proc, timeout, lambda: job.output)
