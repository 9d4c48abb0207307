"""Write-then-rename helpers, so no reader ever sees a half-written artifact."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scone_jax.errors import UserError


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to `final` only if the block succeeds.

    An existing `final` is refused unless `overwrite`; on failure the temporary directory is
    removed and `final` is untouched.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        raise UserError(f"output directory {final} already exists (expected a new path; remove it first)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the result should look like a mkdir
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
