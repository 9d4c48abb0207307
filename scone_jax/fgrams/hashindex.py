"""A vectorised open-addressing hash map from unique uint64 keys to small non-negative ints.

Counting and tagging both map millions of exact n-gram codes to ids per pass. A sorted array
plus `np.searchsorted` costs ~log2(n) dependent cache misses per query; this table costs
about one (load factor <= 1/2, linear probing, Fibonacci hashing), and both the build and
the lookups are whole-array numpy operations (no Python loop per key; a few rounds of
probing, each on the shrinking set of queries still unresolved).
"""

from __future__ import annotations

import numpy as np

_FIB_INT = 0x9E3779B97F4A7C15
_FIB = np.uint64(_FIB_INT)
_M64 = (1 << 64) - 1


class HashIndex:
    """`index.get(queries)` returns the value stored for each query key, or -1.

    The keys must be unique (callers pass sorted unique arrays); values default to the
    position of each key.
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray | None = None, load: float = 0.5):
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        n = len(keys)
        if values is None:
            values = np.arange(n, dtype=np.int64)
        values = np.asarray(values)
        if values.shape != (n,) or (n and values.min() < 0):
            raise ValueError("HashIndex values must be non-negative, one per key")
        self.bits = max(4, int(np.ceil(np.log2(max(n, 1) / load))))
        size = 1 << self.bits
        self._shift = np.uint64(64 - self.bits)
        self._mask = size - 1
        vdtype = np.int32 if max(n, int(values.max()) if n else 0) < 2**31 - 1 else np.int64
        self.keys = np.zeros(size, np.uint64)
        self.vals = np.full(size, -1, vdtype)
        self.size = n
        # Insert: every round, pending keys whose current slot is free try to claim it
        # (last writer wins); the winners stay, everyone else probes the next slot.
        idx = np.arange(n, dtype=np.int64)
        slot = self._slot(keys)
        while idx.size:
            free = self.vals[slot] < 0
            fidx, fslot = idx[free], slot[free]
            self.vals[fslot] = fidx
            won = self.vals[fslot] == fidx
            self.keys[fslot[won]] = keys[fidx[won]]
            stay = np.ones(len(idx), bool)
            stay[np.flatnonzero(free)[won]] = False
            idx = idx[stay]
            slot = (slot[stay] + 1) & self._mask
        occupied = self.vals >= 0
        self.vals[occupied] = values[self.vals[occupied]]

    def _slot(self, q: np.ndarray) -> np.ndarray:
        return ((q * _FIB) >> self._shift).astype(np.int64)

    def get(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.uint64)
        slot = self._slot(q)
        v = self.vals[slot]
        hit = v >= 0
        miss_or_probe = hit.copy()
        hit &= self.keys[slot] == q
        out = np.where(hit, v, -1).astype(self.vals.dtype, copy=False)
        miss_or_probe &= ~hit  # occupied by another key: keep probing
        idx = np.flatnonzero(miss_or_probe)
        slot = slot[idx]
        while idx.size:
            slot = (slot + 1) & self._mask
            v = self.vals[slot]
            occ = v >= 0
            hit = occ & (self.keys[slot] == q[idx])
            out[idx[hit]] = v[hit]
            more = occ & ~hit
            idx, slot = idx[more], slot[more]
        return out

    def get_one(self, key: int) -> int:
        """Scalar lookup (streaming tagging): a few item reads, no array allocation."""
        slot = ((key * _FIB_INT) & _M64) >> (64 - self.bits)
        while True:
            v = int(self.vals[slot])
            if v < 0:
                return -1
            if int(self.keys[slot]) == key:
                return v
            slot = (slot + 1) & self._mask

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes
