"""Fault injection for the reliability suite: kills, flipped bytes, a full disk, and a tally.

In-process faults patch Python's file writes; faults in another process go through
`faulty_cli` (kill at the N-th write under a path; RLIMIT_FSIZE, which also stops native
writers such as tensorstore; or a hang or a stop after the N-th call of a function, for a kill,
or a second job, at a known point of a job whose speed the test must not depend on).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import io
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from scone_jax.config import load_config, save_config
from tests.reliability.faulty_cli import HANG_MESSAGE, STOP_MESSAGE
from tests.train.helpers import REPO

TALLY = (
    Counter()
)  # faults injected, restarts survived, artifacts checked intact, ... (see conftest)
COMPILE_CACHE: list[Path] = []  # set by conftest


def fault_env(devices: int, compile_cache: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    if compile_cache:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(COMPILE_CACHE[0]),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


def faulty_cli(
    args: list[str],
    *,
    devices: int = 8,
    compile_cache: bool = False,
    kill_at_write: tuple[Path, int] | None = None,
    count_writes: Path | None = None,
    file_size_limit: int | None = None,
    hang_after_call: tuple[str, int] | None = None,
    stop_after_call: tuple[str, int] | None = None,
) -> subprocess.Popen:
    """Start `scone-jax ARGS` in a fresh process on `devices` fake CPU devices, with the faults
    given armed (see faulty_cli.py).

    `compile_cache`: share the session's JAX compilation cache, so a restart costs seconds. Only
    when an uninterrupted run has filled it: jax writes entries in place, and a process killed
    while writing one would leave it torn for the next."""
    faults = []
    if kill_at_write:
        faults += ["--kill-at-write", str(kill_at_write[0]), str(kill_at_write[1])]
    if count_writes:
        faults += ["--count-writes", str(count_writes)]
    if file_size_limit is not None:
        faults += ["--file-size-limit", str(file_size_limit)]
    if hang_after_call:
        faults += ["--hang-after-call", hang_after_call[0], str(hang_after_call[1])]
    if stop_after_call:
        faults += ["--stop-after-call", stop_after_call[0], str(stop_after_call[1])]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.faulty_cli", *faults, "--", *args],
        cwd=REPO,
        env=fault_env(devices, compile_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for_hang(proc: subprocess.Popen) -> None:
    """Read the process's stderr until `faulty_cli --hang-after-call` says it has stopped."""
    for line in proc.stderr:
        if line.startswith(HANG_MESSAGE):
            return
    raise AssertionError(f"the process ended ({proc.wait()}) before its armed hang")


def wait_for_stop(proc: subprocess.Popen) -> None:
    """Read the process's stderr until `faulty_cli --stop-after-call` says it stops, then until
    the kernel shows it stopped."""
    for line in proc.stderr:
        if line.startswith(STOP_MESSAGE):
            while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.01)
            return
    raise AssertionError(f"the process ended ({proc.wait()}) before its armed stop")


def writes_seen(stderr: str) -> list[str]:
    """The writes `faulty_cli --count-writes` reported, in order."""
    return [
        line.split(" ", 3)[3] for line in stderr.splitlines() if line.startswith("fault: write #")
    ]


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


def error_line(result: subprocess.CompletedProcess, command: str) -> str:
    """The one-line error of a command that failed cleanly: exit 2, no traceback through scone_jax.

    (Orbax's own background threads may log their failures of a refused save, with tracebacks,
    around that line: those are not crashes of the command.)"""
    assert result.returncode == 2, result.stderr[-2000:]
    assert f'File "{REPO / "scone_jax"}' not in result.stderr, result.stderr[-3000:]
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.startswith(f"scone-jax {command}: error: ")
    ]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def flip_byte(path: Path, rng: np.random.Generator) -> int:
    """Invert one random byte of `path` (XOR 0xFF: never a no-op, and never valid UTF-8 in text)."""
    data = bytearray(path.read_bytes())
    offset = int(rng.integers(len(data)))
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    TALLY["faults injected"] += 1
    return offset


def copy_run(source: Path, run: Path) -> Path:
    """A copy of run directory `source` at `run` that trains there (its config names its
    run_dir)."""
    shutil.copytree(source, run)
    save_config(load_config(run / "config.yaml", [f"run_dir={run}"]), run / "config.yaml")
    return run


def files_below(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file below `roots`: what "byte-identical afterwards" is checked against."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for root in roots
        for p in files_below(root)
    }


def assert_intact(before: dict[str, str]) -> None:
    """Every file of `before` still exists with the same bytes; counts them, and any lost."""
    after = {
        path: hashlib.sha256(Path(path).read_bytes()).hexdigest() if Path(path).is_file() else None
        for path in before
    }
    lost = sorted(path for path in before if after[path] != before[path])
    TALLY["artifact files checked intact"] += len(before) - len(lost)
    TALLY["artifact files lost"] += len(lost)
    assert not lost, f"{len(lost)} previous artifact files changed or vanished: {lost[:5]}"


class _FullFile:
    """A file whose writes fail with ENOSPC once the disk's shared budget of bytes is spent."""

    def __init__(self, file, disk: _FullDisk, name: str):
        self._file, self._disk, self._name = file, disk, name

    def write(self, data):
        if len(data) > self._disk.free:
            self._disk.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)
        self._disk.free -= len(data)
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __iter__(self):
        return iter(self._file)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)


class _FullDisk:
    def __init__(self, under: Path, free: int):
        self.under, self.free, self.refused = str(Path(under).absolute()), free, 0


@contextlib.contextmanager
def disk_full(under: Path, free: int = 0) -> Iterator[_FullDisk]:
    """Files opened for writing below `under` share `free` bytes; the write that needs more
    fails with OSError(ENOSPC), like a full disk. Python-level writes only (native writers
    need `faulty_cli(file_size_limit=...)`)."""
    disk = _FullDisk(under, free)
    real_open = io.open

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if not any(c in mode for c in "wax+"):
            return handle
        name = (
            os.readlink(f"/proc/self/fd/{file}")
            if isinstance(file, int)
            else os.path.abspath(os.fsdecode(file))
        )
        return _FullFile(handle, disk, name) if name.startswith(disk.under) else handle

    builtins.open = io.open = open_
    try:
        yield disk
    finally:
        builtins.open = io.open = real_open
        TALLY["faults injected"] += disk.refused > 0
