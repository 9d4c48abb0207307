"""A vectorised open-addressing hash map from unique uint64 keys to non-negative ints.

Counting and tagging map millions of exact n-gram codes to ids per pass. A sorted array
plus `np.searchsorted` costs ~log2(n) dependent cache misses per query; this table costs
about one (load factor <= 1/2, linear probing, Fibonacci hashing). Build and lookups are whole-array numpy
operations (a few probing rounds, each on the shrinking set of queries still unresolved),
never a Python loop per key.
"""

from __future__ import annotations

import numpy as np

_FIB_INT = 0x9E3779B97F4A7C15
_FIB = np.uint64(_FIB_INT)
_M64 = (1 << 64) - 1
EMPTY = np.uint64(_M64)  # the one key value that cannot be stored


class HashIndex:
    """`index.get(queries)`: the value stored for each query key, or -1.
    `index.slots(queries)`: the slot holding each query key, or -1 (one gather per query:
    callers that can use the slot itself as a dense id skip the value table).

    Keys must be unique and differ from 2**64 - 1; values default to each key's position.
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray | None = None, load: float = 0.25):
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        n = len(keys)
        values = np.arange(n, dtype=np.int64) if values is None else np.asarray(values, np.int64)
        if values.shape != (n,) or (n and values.min() < 0):
            raise ValueError("HashIndex values must be non-negative, one per key")
        if n and np.any(keys == EMPTY):
            raise ValueError("HashIndex cannot store the key 2**64 - 1")
        self.bits = max(4, int(np.ceil(np.log2(max(n, 1) / load))))
        size = 1 << self.bits
        self._shift = np.uint64(64 - self.bits)
        self._mask = size - 1
        self.keys = np.full(size, EMPTY, np.uint64)
        self.vals = np.full(size, -1, np.int64)
        self.size = n
        # Every round, pending keys whose current slot is free claim it (last writer wins);
        # the winners stay, everyone else probes the next slot.
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
        if n == 0 or values.max() < 2**31 - 1:
            self.vals = self.vals.astype(np.int32)

    def _slot(self, q: np.ndarray) -> np.ndarray:
        s = q * _FIB
        s >>= self._shift
        return s.view(np.int64)

    def slots(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.uint64)
        slot = self._slot(q)
        tk = self.keys[slot]
        eq = tk == q
        out = np.where(eq, slot, -1)
        probe = np.flatnonzero((tk != EMPTY) & ~eq)  # occupied by another key: keep probing
        while probe.size:
            s = (slot[probe] + 1) & self._mask
            slot[probe] = s
            tk = self.keys[s]
            eq = tk == q[probe]
            out[probe[eq]] = s[eq]
            probe = probe[(tk != EMPTY) & ~eq]
        return out

    def get(self, queries: np.ndarray) -> np.ndarray:
        s = self.slots(queries)
        out = np.full(len(s), -1, self.vals.dtype)
        hit = s >= 0
        out[hit] = self.vals[s[hit]]
        return out

    def slot_one(self, key: int) -> int:
        """Scalar `slots` (streaming tagging): a few item reads, no array allocation."""
        slot = ((key * _FIB_INT) & _M64) >> (64 - self.bits)
        while True:
            k = int(self.keys[slot])
            if k == key:
                return slot
            if k == _M64:
                return -1
            slot = (slot + 1) & self._mask

    def get_one(self, key: int) -> int:
        slot = self.slot_one(key)
        return int(self.vals[slot]) if slot >= 0 else -1

    @property
    def capacity(self) -> int:
        return self._mask + 1

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes
