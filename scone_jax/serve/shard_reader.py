"""Direct reads of a local table's rows: `pread` of one inner chunk, its crc32c checked.

Exported tables are zarr3 arrays in shard files (`artifacts/table_store.py`): each shard file
holds its inner chunks (raw little-endian rows, then a crc32c) and ends with an index of
(offset, nbytes) per chunk, itself followed by a crc32c. Reading a row through tensorstore
costs ~0.2 ms of per-call machinery on a 2-core host, more than a whole decode step's lookup
budget; reading its chunk straight from the file costs a `pread` and a checksum. This reader
is used only for local tables whose layout is exactly that one (else `for_array` returns None
and the disk tier reads through tensorstore); every chunk and index is checked as it is read.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path

import crc32c
import numpy as np
import tensorstore as ts

from scone_jax.errors import UserError

_MISSING = 2**64 - 1  # an index entry of a chunk never written


class ShardReader:
    def __init__(
        self,
        directory: Path,
        shape: tuple[int, int],
        shard_rows: int,
        chunk_rows: int,
        dtype: np.dtype,
    ):
        self.directory, self.shape, self.dtype = directory, shape, dtype
        self.shard_rows, self.chunk_rows = shard_rows, chunk_rows
        self.chunks_per_shard = shard_rows // chunk_rows
        self.row_bytes = shape[1] * dtype.itemsize
        self.chunk_bytes = chunk_rows * self.row_bytes
        self._indexes: dict[int, np.ndarray] = {}  # shard -> [chunks, 2] (offset, nbytes)
        self._files: dict[int, int] = {}  # shard -> open file descriptor
        self._lock = threading.Lock()
        weakref.finalize(self, _close_files, self._files)

    @classmethod
    def for_array(cls, array: ts.TensorStore, directory: Path | None) -> ShardReader | None:
        """A reader for a 2-D zarr3 array at local `directory`, or None when its layout is not
        the export's (sharded, uncompressed little-endian chunks with crc32c, index at the end)."""
        if directory is None or array.rank != 2:
            return None
        meta = array.spec().to_json().get("metadata", {})
        codecs = meta.get("codecs", [])
        if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
            return None
        inner = codecs[0].get("configuration", {})
        if (
            not _raw_with_crc(inner.get("codecs"))
            or not _raw_with_crc(inner.get("index_codecs"))
            or inner.get("index_location", "end") != "end"
            or meta.get("chunk_key_encoding", {}).get("name") != "default"
        ):
            return None
        outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
        chunk = inner["chunk_shape"]
        if outer[1] != array.shape[1] or chunk[1] != array.shape[1] or outer[0] % chunk[0]:
            return None
        return cls(directory, tuple(array.shape), outer[0], chunk[0], array.dtype.numpy_dtype)

    def read(self, ids: np.ndarray) -> np.ndarray:
        """The stored rows [n, d] of sorted unique row ids, each chunk read once."""
        out = np.empty((len(ids), self.shape[1]), self.dtype)
        chunk_of = ids // self.chunk_rows
        starts = np.flatnonzero(np.r_[True, chunk_of[1:] != chunk_of[:-1]])
        for a, b in zip(starts, np.r_[starts[1:], len(ids)], strict=True):
            rows = np.frombuffer(
                self._chunk(int(chunk_of[a])), self.dtype, count=self.chunk_rows * self.shape[1]
            )
            out[a:b] = rows.reshape(self.chunk_rows, -1)[ids[a:b] - chunk_of[a] * self.chunk_rows]
        return out

    def read_row(self, row: int) -> np.ndarray:
        """One stored row [d]: the fewest calls, for a decode step's few rows."""
        chunk, within = divmod(row, self.chunk_rows)
        return np.frombuffer(
            self._chunk(chunk), self.dtype, count=self.shape[1], offset=within * self.row_bytes
        )

    def _chunk(self, chunk: int) -> bytes:
        """A chunk's bytes, its crc32c checked (the 4 checksum bytes left at the end)."""
        shard, within = divmod(chunk, self.chunks_per_shard)
        fd, index = self._shard(shard)
        offset, nbytes = index[within].tolist()
        if offset == _MISSING or nbytes != self.chunk_bytes + 4:
            raise UserError(
                f"table rows file {self._path(shard)}: chunk {within} is missing or has {nbytes} "
                f"bytes (expected {self.chunk_bytes + 4}); the table is damaged, export it again"
            )
        data = os.pread(fd, nbytes, offset)
        if not _intact(data):
            raise _damaged(self._path(shard), f"chunk {within}")
        return data

    def _shard(self, shard: int) -> tuple[int, np.ndarray]:
        with self._lock:
            if shard not in self._indexes:
                path = self._path(shard)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError as e:
                    raise UserError(
                        f"table rows file {path} cannot be read: {e.strerror}"
                    ) from None
                size = self.chunks_per_shard * 16 + 4
                end = os.fstat(fd).st_size
                data = os.pread(fd, size, end - size) if end >= size else b""
                if not _intact(data):
                    raise _damaged(path, "index")
                self._indexes[shard] = np.frombuffer(
                    data, "<u8", count=2 * self.chunks_per_shard
                ).reshape(-1, 2)
                self._files[shard] = fd
            return self._files[shard], self._indexes[shard]

    def _path(self, shard: int) -> Path:
        return self.directory / "c" / str(shard) / "0"


def _raw_with_crc(codecs) -> bool:
    """Whether chunks are stored as raw little-endian bytes followed by a crc32c (1-byte types
    record no endianness)."""
    return (
        isinstance(codecs, list)
        and len(codecs) == 2
        and codecs[0].get("name") == "bytes"
        and codecs[0].get("configuration", {}).get("endian", "little") == "little"
        and codecs[1] == {"name": "crc32c"}
    )


def _close_files(files: dict[int, int]) -> None:
    for fd in files.values():
        os.close(fd)


def _intact(data: bytes) -> bool:
    """Whether data = payload + its little-endian crc32c."""
    return len(data) >= 4 and crc32c.crc32c(memoryview(data)[:-4]) == int.from_bytes(
        data[-4:], "little"
    )


def _damaged(path: Path, what: str) -> UserError:
    return UserError(
        f"table rows file {path}: {what} fails its crc32c check (or is truncated); "
        "the table is damaged, export it again"
    )
