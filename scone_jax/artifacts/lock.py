"""One writer per artifact: an exclusive lock that a second job finds held, naming its holder.

The lock of an artifact at PATH is the file PARENT/.NAME.lock, beside the artifact rather than
inside it, because artifacts are written into a temporary sibling and swapped into place
(atomic.py): a lock inside would be swapped away with the old directory. Holding it is an OS
lock (`fcntl.flock`) on that file, which the kernel drops when the process dies, however it
dies: a job killed with SIGKILL never blocks the next attempt. On NFS, Linux carries flock as a
POSIX lock to the server, which drops it once the client's lease lapses (a machine that
vanished). The file holds the holder's host, pid, command and start time, for the refusal.

Released cleanly, the lock file is removed, while still held: a job that opened the old file
before the removal finds, once it gets the lock, that the path no longer names its file, and
tries again on the new one, so two jobs never hold two files of one path.

Only local and network filesystems have such locks: an artifact on an object store (gs://,
s3://, memory://) is claimed with a lease instead (lease.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from scone_jax.artifacts.holder import ArtifactInUse, Holder
from scone_jax.artifacts.lease import ObjectStoreLease
from scone_jax.artifacts.table_store import Location
from scone_jax.atomic import check_output_path, remove_path, stale_temporaries
from scone_jax.errors import UserError
from scone_jax.runtime.distributed import process_index

HOLDER_READ_TRIES = 20  # a holder that has just taken the lock writes its details a moment later


def lock_file(path: str | os.PathLike) -> Path:
    """PARENT/.NAME.lock of the artifact at `path` (symbolic links and `..` resolved, so every
    spelling of one path shares one lock)."""
    path = Path(path).resolve()
    return path.parent / f".{path.name}.lock"


def _read_holder(fd: int) -> Holder | None:
    """The holder's details, or None while a new holder has not written them yet."""
    for _ in range(HOLDER_READ_TRIES):
        try:
            return Holder(**json.loads(os.pread(fd, 1 << 16, 0)))
        except (ValueError, TypeError):
            time.sleep(0.05)
    return None


class ArtifactLock:
    """The exclusive lock of the artifact at `path`; `what` names it in the refusal."""

    def __init__(self, path: str | os.PathLike, what: str, command: str):
        self.path, self.what, self.command = Path(path), what, command
        self.file = lock_file(path)
        self._fd: int | None = None
        self._made_dirs: list[Path] = []  # parents created for the lock, removed if left empty

    def acquire(self) -> None:
        """Take the lock, or raise ArtifactInUse naming the holder; changes nothing then."""
        check_output_path(self.path, self.what)
        try:
            self._make_parents()
            fd = self._lock_the_current_file()
        except BaseException:
            self._remove_made_dirs()
            raise
        self._fd = fd
        holder = Holder(socket.gethostname(), os.getpid(), self.command[:500], time.time())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder.__dict__).encode(), 0)
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """What a writer of this artifact killed outright (SIGKILL, a lost machine) left beside
        it: temporaries whose writer's own lock is free (atomic.hold_temporary), so a live
        writer, even one holding another lock (a run dir's set-up), keeps its temporary."""
        for stale in stale_temporaries(self.path):
            if remove_path(stale):  # else not ours to clean (another user's, read-only)
                print(
                    f"scone-jax: removed {stale}, which an interrupted write of {self.path} left",
                    file=sys.stderr,
                    flush=True,
                )

    def _lock_the_current_file(self) -> int:
        while True:
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise UserError(f"cannot lock {self.what} {self.path}: {e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                held = e.errno in (errno.EAGAIN, errno.EACCES)
                holder = _read_holder(fd) if held else None
                os.close(fd)
                if not held:
                    raise UserError(f"cannot lock {self.what} {self.path}: {e}") from None
                raise ArtifactInUse(
                    f"{self.what} {self.path} is being written by another job ("
                    + (holder.describe() if holder else "its holder has not said who it is")
                    + f"; lock {self.file}); wait for it to end, or stop it and rerun"
                ) from None
            try:
                if os.path.samestat(os.stat(self.file), os.fstat(fd)):
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # released and removed while we opened it: try the new file

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.file)  # before the unlock: see the module docstring
        os.close(self._fd)
        self._fd = None
        self._remove_made_dirs()

    def _make_parents(self) -> None:
        missing = []
        parent = self.file.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                continue  # made by another job meanwhile: not ours to remove
            except OSError as e:
                raise UserError(
                    f"cannot create {directory} for {self.what} {self.path}: {e}"
                ) from None
            self._made_dirs.append(directory)

    def _remove_made_dirs(self) -> None:
        for directory in reversed(self._made_dirs):
            with contextlib.suppress(OSError):  # not empty: the job wrote its artifact there
                directory.rmdir()
        self._made_dirs = []


@contextlib.contextmanager
def writing(
    targets: Sequence[tuple[str, str | os.PathLike | Location | None]], command: str
) -> Iterator[None]:
    """Hold the lock of every (what, path) target for the block: the one way a command claims
    what it writes. In a multi-process job process 0 holds them, for the whole job. A target on
    an object store (a Location without a local path) holds a lease instead; None is skipped."""
    locks: dict = {}
    if process_index() == 0:
        for what, path in targets:
            if isinstance(path, Location):
                if path.local_path is None:
                    locks[path.url] = ObjectStoreLease(path, what, command)
                    continue
                path = path.local_path
            if path is not None and lock_file(path) not in locks:
                locks[lock_file(path)] = ArtifactLock(path, what, command)
    with contextlib.ExitStack() as held:
        for lock in locks.values():
            lock.acquire()
            held.callback(lock.release)
        yield
