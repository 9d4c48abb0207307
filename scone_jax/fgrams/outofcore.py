"""Where counting keeps its per-pass state: in RAM, or spilled to disk when it would not fit.

Two kinds of state grow with the corpus: the survivor id of every position (read and
written once per pass) and the candidate keys of one pass, partitioned so that each
partition is counted on its own. `plan()` picks RAM or disk from the memory budget; the
counting code is the same either way, so both paths give identical output.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scone_jax.errors import UserError

# Bytes of working memory per token of a chunk in flight (token copies, codes, masks, ids,
# the partition shuffle), measured on the chunk job with some margin.
CHUNK_BYTES_PER_TOKEN = 96
# In RAM: the tokens (up to 4 bytes), two id arrays (int32) and one pass of candidate keys
# (uint64) per token, plus the sort of one partition at a time per worker.
RAM_BYTES_PER_TOKEN = 24
# A chunk is at most a worker's share of the corpus (one chunk per worker when it is small:
# fewer, larger partition pieces and no copies to join them) and at most 4M tokens.
MIN_CHUNK, MAX_CHUNK = 1 << 12, 1 << 22
# survivor tables this small are always allowed, however tiny the budget (tests force it)
MIN_SURVIVOR_BYTES = 64 << 20
# open partition files at once; beyond this, partitions are counted in pieces and merged
MAX_PARTITIONS = 256
# Bytes per key while one partition is counted (uint64 keys): a piece's keys, sorted in place,
# and its distinct keys and int64 counts (count._counted: 24 at most), or, for a partition
# counted in pieces, the running counts merged with the next piece's (count.merge_counts:
# the joined keys and counts, their sort order and the reordered copies, ~40).
SORT_BYTES_PER_KEY = 40
# Partitions of about this many keys count fastest: their sorts stay in cache, and
# there are few enough that the per-partition Python work stays small. On disk, where every
# chunk writes a piece to each partition's file, they are 4x bigger (fewer, larger writes).
PARTITION_KEYS = 1 << 17


def parse_size(text: str | int) -> int:
    """'512M', '4G', '1.5g', '1000000' -> bytes."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        value = float(s[:-1] if scale > 1 else s)
    except ValueError:
        raise UserError(
            f"memory budget {text!r} is not a size (expected e.g. 512M, 4G or a byte count)"
        ) from None
    if not math.isfinite(value * scale) or value * scale < 1:
        raise UserError(
            f"memory budget {text!r} is not a size (expected a finite size of at least 1 byte, "
            "e.g. 512M or 4G)"
        )
    return int(value * scale)


def default_budget() -> int:
    """Half of the machine's physical memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 4 << 30


@dataclass(frozen=True)
class Plan:
    mode: str  # "memory" or "disk"
    workers: int
    chunk: int  # tokens per chunk job
    partitions: int  # power of two
    budget: int

    @property
    def partition_limit(self) -> int:
        """Keys one worker may hold while counting a partition (a quarter of its share of the
        budget)."""
        return max(1 << 12, self.budget // (4 * self.workers * SORT_BYTES_PER_KEY))


def plan(num_tokens: int, budget: int, workers: int, force_disk: bool = False) -> Plan:
    workers = max(1, workers)
    share = -(-num_tokens // workers)
    cap = budget // (4 * workers * CHUNK_BYTES_PER_TOKEN)
    chunk = int(np.clip(min(share, cap), MIN_CHUNK, MAX_CHUNK))
    in_ram = RAM_BYTES_PER_TOKEN * num_tokens + workers * chunk * CHUNK_BYTES_PER_TOKEN
    if not force_disk and in_ram <= budget * 0.6:
        parts = _pow2(max(2 * workers, num_tokens // PARTITION_KEYS))
        return Plan("memory", workers, chunk, min(parts, MAX_PARTITIONS), budget)
    # each partition's keys plus sort scratch must fit a quarter of the budget per worker
    per_partition = max(1, budget // (4 * workers * SORT_BYTES_PER_KEY))
    parts = _pow2(
        max(2 * workers, -(-num_tokens // per_partition), num_tokens // (4 * PARTITION_KEYS))
    )
    return Plan("disk", workers, chunk, min(parts, MAX_PARTITIONS), budget)


def _pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


# -- the tokens each pass reads -----------------------------------------------------------------


class MemoryTokens:
    """The corpus read once, padded with `pad` zeros: every pass reads the same tokens, so
    in RAM mode a chunk's window is a view, not a fresh copy (and its page faults) per pass."""

    def __init__(self, corpus, pad: int):
        self.corpus = corpus
        t = corpus.read(0, corpus.num_tokens)
        self.arr = np.concatenate([t, np.zeros(pad, t.dtype)])

    def window(self, a: int, width: int) -> np.ndarray:
        return self.arr[a : a + width]


class FileTokens:
    """Tokens read from the corpus per chunk, zero-padded past its end."""

    def __init__(self, corpus):
        self.corpus = corpus

    def window(self, a: int, width: int) -> np.ndarray:
        t = self.corpus.read(a, a + width)
        if len(t) < width:  # the corpus ends: pad (those positions are masked)
            t = np.concatenate([t, np.zeros(width - len(t), t.dtype)])
        return t


# -- per-position survivor ids -----------------------------------------------------------------


class MemoryIds:
    """Ids in one array, left uninitialised: each pass writes every position before the next
    reads any, so the page faults of first touching it (up to ~1 ns/byte on a VM) fall in
    the chunk jobs, spread over the workers, instead of in one serial fill here."""

    def __init__(self, n: int, dtype=np.int32):
        self.arr = np.empty(n, dtype)

    def window(self, a: int, size: int) -> np.ndarray:
        """Where a chunk writes the ids of positions a .. a + size - 1: the array itself."""
        return self.arr[a : a + size]

    def read(self, a: int, b: int) -> np.ndarray:
        """ids[a:b], -1 past the end (a view where it is all inside: callers only read it)."""
        if b <= len(self.arr):
            return self.arr[a:b]
        out = np.full(b - a, -1, self.arr.dtype)
        part = self.arr[a:b]
        out[: len(part)] = part
        return out

    def close(self) -> None:
        self.arr = None


class DiskIds:
    """The same as MemoryIds, in a file written and read with pwrite/pread."""

    def __init__(self, n: int, directory: Path, dtype=np.int32):
        self.n, self.dtype = n, np.dtype(dtype)
        fd, self.path = tempfile.mkstemp(prefix="ids-", suffix=".bin", dir=directory)
        self.fd = fd
        os.ftruncate(fd, n * self.dtype.itemsize)

    def window(self, a: int, size: int) -> None:
        """None: a chunk computes its ids in a buffer of its own, then `write`s them."""
        return None

    def write(self, a: int, ids: np.ndarray) -> None:
        data = np.ascontiguousarray(ids, self.dtype).tobytes()
        off, done = a * self.dtype.itemsize, 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], off + done)

    def read(self, a: int, b: int) -> np.ndarray:
        out = np.full(b - a, -1, self.dtype)
        hi = min(b, self.n)
        if hi > a:
            want = (hi - a) * self.dtype.itemsize
            buf = bytearray(want)
            view, got = memoryview(buf), 0
            while got < want:
                got += os.preadv(self.fd, [view[got:]], a * self.dtype.itemsize + got)
            out[: hi - a] = np.frombuffer(buf, self.dtype)
        return out

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


# -- one pass of candidate keys, hash-partitioned ------------------------------------------------


class MemoryPartitions:
    def __init__(self, parts: int, dtype):
        self.dtype = dtype
        self.pieces: list[list[np.ndarray]] = [[] for _ in range(parts)]

    def add(self, p: int, keys: np.ndarray) -> None:
        if len(keys):
            self.pieces[p].append(keys)

    def size(self, p: int) -> int:
        return sum(len(x) for x in self.pieces[p])

    def take(self, p: int, limit: int):
        """Yield the partition's keys in arrays of at most ~`limit` keys (one array in RAM mode)."""
        pieces, self.pieces[p] = self.pieces[p], []
        if pieces:
            yield np.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    def close(self) -> None:
        self.pieces = []


class DiskPartitions:
    """One append-only file of raw keys per partition, under a temporary directory."""

    def __init__(self, parts: int, dtype, directory: Path):
        self.dtype = np.dtype(dtype)
        self.dir = Path(tempfile.mkdtemp(prefix="parts-", dir=directory))
        self.files = [open(self.dir / f"{p:05d}.bin", "wb") for p in range(parts)]
        self.locks = [threading.Lock() for _ in range(parts)]

    def add(self, p: int, keys: np.ndarray) -> None:
        if len(keys):
            data = np.ascontiguousarray(keys, self.dtype).tobytes()
            with self.locks[p]:
                self.files[p].write(data)

    def size(self, p: int) -> int:
        return os.path.getsize(self.dir / f"{p:05d}.bin") // self.dtype.itemsize

    def take(self, p: int, limit: int):
        self.files[p].close()
        path = self.dir / f"{p:05d}.bin"
        total = self.size(p)
        step = max(limit, 1)
        with open(path, "rb") as f:
            for a in range(0, total, step):
                yield np.fromfile(f, dtype=self.dtype, count=min(step, total - a))
        path.unlink()

    def close(self) -> None:
        for f in self.files:
            f.close()
        for path in self.dir.glob("*.bin"):
            path.unlink()
        self.dir.rmdir()


def scratch_dir(tmp_dir: str | os.PathLike | None) -> tempfile.TemporaryDirectory:
    try:
        if tmp_dir is not None:
            Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix="scone-fgrams-", dir=tmp_dir)
    except OSError as e:
        raise UserError(
            f"cannot create a scratch directory under {tmp_dir or tempfile.gettempdir()}: {e}"
        ) from None
