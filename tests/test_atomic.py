"""Atomic outputs look like plain ones: files and directories written through a temporary get
the permissions the umask gives open() and mkdir(), not mkstemp's private 0600/0700, so an
artifact shared with other users is readable by them."""

import os
import stat

import pytest

from scone_jax.atomic import atomic_dir, atomic_write_json, temporary_sibling


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_outputs_get_the_umasks_permissions(tmp_path, umask):
    atomic_write_json(tmp_path / "meta.json", {"a": 1})
    assert mode(tmp_path / "meta.json") == 0o666 & ~umask
    sibling = temporary_sibling(tmp_path / "ids.npy", ".npy")
    assert mode(sibling) == 0o666 & ~umask and sibling.name.startswith(".ids.npy.tmp-")
    with atomic_dir(tmp_path / "out") as out:
        atomic_write_json(out / "checksums.json", {})
    assert mode(tmp_path / "out") == 0o777 & ~umask
    assert mode(tmp_path / "out" / "checksums.json") == 0o666 & ~umask


def test_the_umask_is_read_without_setting_it(umask, monkeypatch):
    """Setting the umask to read it would give a file another thread makes meanwhile umask 0."""
    from scone_jax import atomic

    def never(mask):
        raise AssertionError(f"os.umask({mask:o}) called while other threads may create files")

    monkeypatch.setattr(atomic.os, "umask", never)
    assert atomic.current_umask() == umask


def test_a_read_only_file_system_refusing_the_temporary_is_one_line(tmp_path, monkeypatch):
    """A run directory on a read-only mount: its lock (beside it) is taken, then the first
    small write fails at the temporary file, before any data is written."""
    import errno
    import tempfile

    from scone_jax.atomic import atomic_write_bytes
    from scone_jax.errors import UserError

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(UserError, match=r"cannot write .*config.yaml: \[Errno 30\] Read-only"):
        atomic_write_bytes(tmp_path / "config.yaml", b"x")
