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
