"""Checksum manifests: a file another user's umask or mode keeps from this user is one line
naming it, not a traceback (root reads everything, so the refusal is simulated)."""

import errno
import os

import pytest

import scone_jax.checksums as checksums
from scone_jax.checksums import verify_manifest, write_manifest
from scone_jax.errors import UserError


def test_an_unreadable_file_is_one_line_naming_it(tmp_path, monkeypatch, rng):
    (tmp_path / "tokens.bin").write_bytes(rng.bytes(int(rng.integers(1, 4096))))
    write_manifest(tmp_path)
    assert verify_manifest(tmp_path)

    def refused(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(checksums, "file_crc32", refused)
    with pytest.raises(UserError) as e:
        verify_manifest(tmp_path)
    assert str(e.value) == f"cannot read {tmp_path / 'tokens.bin'}: Permission denied"
