"""Write-then-rename helpers, so no reader ever sees a half-written artifact, and the one-line
error for a write that the storage refuses (full disk, quota, file size limit, I/O error)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scone_jax.errors import UserError

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
# tensorstore (tables, orbax checkpoints) reports the OS error inside its status text
_TENSORSTORE_OS_ERROR = re.compile(r"os_error_code='?(\d+)")


def storage_error(error: BaseException, what: str) -> UserError | None:
    """`cannot write WHAT: ...` when `error` (or an error it was raised from) is the storage
    refusing a write; None for any other error, which keeps its traceback."""
    seen = error
    while seen is not None:
        if isinstance(seen, UserError):  # already explained: look at what it was raised from
            seen = seen.__cause__ or seen.__context__
            continue
        code = seen.errno if isinstance(seen, OSError) else None
        if code is None and (match := _TENSORSTORE_OS_ERROR.search(str(seen))):
            code = int(match.group(1))
        if code in STORAGE_ERRNOS:
            first_line = (str(seen).splitlines() or [""])[0]
            return UserError(f"cannot write {what}: {first_line}")
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Re-raise a write the storage refuses inside the block as `storage_error`'s UserError."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        refused = storage_error(e, what)
        if refused is None:
            raise
        raise refused from e


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_dir(src: Path, final: Path) -> None:
    """Rename directory `src` to `final`, replacing an existing `final` without ever leaving it
    half-deleted: the two are swapped in one step, then the old one is deleted. Where the
    swap is unsupported (not Linux), the old one is renamed aside first: a crash between the
    two renames leaves no `final`, and the old one complete beside it."""
    if not final.exists():
        os.replace(src, final)
        return
    if _exchange(src, final):
        shutil.rmtree(src)  # now the old one
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    os.replace(final, old)
    os.replace(src, final)
    shutil.rmtree(old, ignore_errors=True)


def check_output_path(path: str | os.PathLike, what: str, is_file: bool = False) -> None:
    """Refuse, before any work is done, an output path that can never be written: one below an
    existing file, a directory where a file goes, or a file where a directory goes."""
    path = Path(path)
    if is_file and path.is_dir():
        raise UserError(f"{what} {path} is a directory (expected a file path)")
    if not is_file and path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} exists and is not a directory (expected a directory path)")
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{what} {path} cannot be created: {ancestor} is not a directory")


def check_replaceable(
    final: str | os.PathLike, overwrite: bool, marker: str | None, kind: str
) -> None:
    """Refuse an existing output directory unless `overwrite` may replace it: never one that
    holds the current directory, and, where `marker` names the file every `kind` holds, only an
    empty directory or one holding it, so an --overwrite given a dataset, a run or a home
    directory by mistake deletes nothing. `marker` None is for paths the code names itself."""
    final = Path(final)
    if not final.exists():
        return
    if not overwrite:
        raise UserError(
            f"output directory {final} already exists (expected a new path; remove it first)"
        )
    if Path.cwd().resolve().is_relative_to(final.resolve()):
        raise UserError(
            f"output directory {final} holds the current directory (expected a path elsewhere)"
        )
    if (
        marker is not None
        and final.is_dir()
        and any(final.iterdir())
        and not (final / marker).is_file()
    ):
        raise UserError(
            f"output directory {final} exists and is not {kind} (expected a new path, or {kind} "
            "to replace)"
        )


def current_umask() -> int:
    """The process's umask, read without setting it: `os.umask` can only be read by setting it,
    and a file another thread created meanwhile would get umask 0 (world-writable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:  # Linux >= 4.7
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return _UMASK_AT_IMPORT


def plain_permissions(path: str | os.PathLike) -> None:
    """Give a file a library created 0600 (as safetensors does) the mode `open()` would give it,
    so that others may read an output shared with them, as every other file of it."""
    os.chmod(path, 0o666 & ~current_umask())


_UMASK_AT_IMPORT = os.umask(0)  # where /proc cannot say: read at import, before any thread
os.umask(_UMASK_AT_IMPORT)


def temporary_sibling(path: Path, suffix: str = "") -> Path:
    """An empty temporary file beside `path`, for a writer that renames it over `path`, with the
    permissions a plain open() would give (mkstemp's 0600 would hide a shared file from other
    users)."""
    fd, name = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return Path(name)


def temporary_prefix(final: Path) -> str:
    """The name prefix of `final`'s temporaries: mkstemp/mkdtemp append 8 random characters."""
    return f".{final.name}.tmp-"


def stale_temporaries(final: str | os.PathLike) -> list[Path]:
    """The temporaries of `final` whose writer is gone (`abandoned`). Another artifact's
    temporary never matches (`.a.tmp-x.tmp-...` has more than the 8 random characters after
    `.a.tmp-`)."""
    final = Path(final)
    pattern = re.compile(re.escape(temporary_prefix(final)) + r"[a-z0-9_]{8}(\.[A-Za-z0-9]+)?")
    try:
        found = sorted(p for p in final.parent.iterdir() if pattern.fullmatch(p.name))
    except OSError:  # no parent yet, or unreadable: nothing to clean
        return []
    return [p for p in found if abandoned(p)]


def _try_lock(fd: int) -> bool:
    """An exclusive flock on `fd` if free now (False where the filesystem has no such locks)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def hold_temporary(path: str | os.PathLike) -> int | None:
    """Lock a temporary this process is writing (a directory or a file), so that a cleanup by
    any other process or job sees its writer alive; the kernel drops the lock when the writer
    dies, however it dies. The fd to close when done, or None where the filesystem has no such
    locks (the temporary then never looks abandoned)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if _try_lock(fd):
        return fd
    os.close(fd)
    return None


def abandoned(path: str | os.PathLike) -> bool:
    """Whether a temporary's writer is gone: its lock is free (`hold_temporary`). A temporary
    whose lock cannot be tried (no locks on this filesystem) is never called abandoned."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)


def remove_path(path: Path) -> bool:
    """Remove a file, link or directory tree, as far as permissions allow; whether it is gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
    return not os.path.lexists(path)


@contextlib.contextmanager
def atomic_dir(
    final: str | os.PathLike,
    overwrite: bool = False,
    *,
    marker: str | None = None,
    kind: str = "an artifact of this kind",
) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to `final` only if the block succeeds.

    An existing `final` is refused unless `overwrite` and `check_replaceable` allow it; on
    failure the temporary directory is removed and `final` is untouched. A write the storage
    refuses is a one-line UserError.
    """
    final = Path(final)
    check_replaceable(final, overwrite, marker, kind)
    check_output_path(final, "output directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(final), dir=final.parent))
    held = hold_temporary(tmp)
    # mkdtemp makes it 0700; the result should look like a mkdir
    tmp.chmod(0o777 & ~current_umask())
    try:
        with storage_errors(str(final)):
            yield tmp
        replace_dir(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if held is not None:
            os.close(held)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and a rename."""
    path = Path(path)
    check_output_path(path, "output file", is_file=True)
    with storage_errors(str(path)):  # a read-only or full file system refuses it here already
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it 0600; it should look like open()'s
    _try_lock(fd)  # held while fd is open: a cleanup sees a live writer
    try:
        with storage_errors(str(path)), os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # while the lock is held
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
