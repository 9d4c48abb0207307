"""`scone-jax` with a fault armed: `python -m tests.reliability.faulty_cli [FAULT...] -- ARGS`.

    --kill-at-write PREFIX N   SIGKILL this process just before its N-th filesystem write under
                               PREFIX (a file opened for writing, a rename, an unlink, an rmtree)
    --count-writes PREFIX      print `fault: write #k PATH` for each such write, and run normally
    --file-size-limit BYTES    RLIMIT_FSIZE: the kernel refuses any write that would grow a file
                               past BYTES (EFBIG), in Python and in native code (tensorstore)
    --hang-after-call FUNC N   stop for good after the N-th call of FUNC (`module.attribute`, as
                               the caller looks it up) returns, printing `fault: hanging ...`: the
                               test then kills the process at a known point, however fast it runs
    --stop-after-call FUNC N   SIGSTOP this process after the N-th call of FUNC returns, printing
                               `fault: stopped ...` first: it is frozen at a known point, holding
                               whatever it holds, until the test sends SIGCONT

Writes are printed to stderr as they happen, so a failing test shows where it killed.
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import io
import os
import resource
import shutil
import signal
import sys

HANG_MESSAGE = "fault: hanging"
STOP_MESSAGE = "fault: stopped"


def _path_of(target) -> str:
    if isinstance(target, int):  # os.fdopen(fd): the file the descriptor refers to
        return os.readlink(f"/proc/self/fd/{target}")
    return os.path.abspath(os.fsdecode(target))


def arm_write_hooks(prefix: str, kill_at: int | None) -> None:
    """Count (and print) filesystem writes under `prefix`; SIGKILL before the `kill_at`-th."""
    prefix = os.path.abspath(prefix)
    count = 0

    def event(kind: str, target) -> None:
        nonlocal count
        path = _path_of(target)
        if not path.startswith(prefix):
            return
        count += 1
        print(f"fault: write #{count} {kind} {path}", file=sys.stderr, flush=True)
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    real_open, real_replace, real_rename = io.open, os.replace, os.rename
    real_unlink, real_rmtree = os.unlink, shutil.rmtree

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            event("open", file)
        return real_open(file, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        event("replace", dst)
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        event("rename", dst)
        return real_rename(src, dst, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        event("unlink", path)
        return real_unlink(path, *args, **kwargs)

    def rmtree(path, *args, **kwargs):
        event("rmtree", path)
        return real_rmtree(path, *args, **kwargs)

    builtins.open = io.open = open_
    os.replace, os.rename, os.unlink, os.remove, shutil.rmtree = (
        replace,
        rename,
        unlink,
        unlink,
        rmtree,
    )


def arm_after_call(function: str, after: int, fault) -> None:
    """Replace `module.attribute` with a wrapper that calls `fault(calls)` once its `after`-th call
    has returned."""
    module_name, name = function.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real, calls = getattr(module, name), 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        result = real(*args, **kwargs)
        calls += 1
        if calls == after:
            fault(calls)
        return result

    setattr(module, name, wrapper)


def arm_hang(function: str, after: int) -> None:
    """Never return from the `after`-th call of `function`."""

    def hang(calls: int) -> None:
        print(f"{HANG_MESSAGE} after call #{calls} of {function}", file=sys.stderr, flush=True)
        while True:
            signal.pause()

    arm_after_call(function, after, hang)


def arm_stop(function: str, after: int) -> None:
    """SIGSTOP this process after the `after`-th call of `function`; it goes on at SIGCONT."""

    def stop(calls: int) -> None:
        print(f"{STOP_MESSAGE} after call #{calls} of {function}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    arm_after_call(function, after, stop)


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="faulty_cli")
    parser.add_argument("--kill-at-write", nargs=2, metavar=("PREFIX", "N"))
    parser.add_argument("--count-writes", metavar="PREFIX")
    parser.add_argument("--file-size-limit", type=int, metavar="BYTES")
    parser.add_argument("--hang-after-call", nargs=2, metavar=("FUNC", "N"))
    parser.add_argument("--stop-after-call", nargs=2, metavar=("FUNC", "N"))
    faults = parser.parse_args(argv[:split])
    if faults.file_size_limit is not None:  # Python ignores SIGXFSZ, so the write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (faults.file_size_limit, resource.RLIM_INFINITY))
    if faults.kill_at_write:
        arm_write_hooks(faults.kill_at_write[0], int(faults.kill_at_write[1]))
    elif faults.count_writes:
        arm_write_hooks(faults.count_writes, None)
    if faults.hang_after_call:
        arm_hang(faults.hang_after_call[0], int(faults.hang_after_call[1]))
    if faults.stop_after_call:
        arm_stop(faults.stop_after_call[0], int(faults.stop_after_call[1]))
    from scone_jax.cli.main import main as scone_jax_main

    return scone_jax_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
