"""A vectorised open-addressing hash map from unique uint64 keys to non-negative ints.

Counting and tagging map millions of exact n-gram codes to ids per pass. A sorted array plus
`np.searchsorted` costs ~log2(n) dependent cache misses per query; this table costs about one (load
factor <= 1/2, linear probing, Fibonacci hashing). Build and lookups are whole-array numpy
operations (a few probing rounds, each on the shrinking set of queries still unresolved), never a
Python loop per key. Queries follow a Zipf law, so keys are placed in the order given: callers pass
the most frequent first, and those sit in their home slot, where a query costs one gather and no
probing round; a per-slot spill flag stops most queries for absent keys there too.
"""

from __future__ import annotations

import numpy as np

FIB_INT = 0x9E3779B97F4A7C15
_FIB = np.uint64(FIB_INT)
M64 = (1 << 64) - 1
EMPTY = np.uint64(M64)  # the one key value that cannot be stored


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
        self.size = n
        # Keys go in by home slot (a stable radix sort on its top 16 bits, which keeps the
        # given order among keys that share a home), so the table is written nearly in order.
        slot = self._slot(keys)
        by_home = np.argsort((slot >> max(0, self.bits - 16)).astype(np.uint16), kind="stable")
        keys, values, slot = keys[by_home], values[by_home], slot[by_home]
        # Every round, pending keys whose current slot is free claim it; the winners stay,
        # everyone else probes the next slot. Claims are written in reverse so that the
        # earliest key wins (numpy applies repeated indices in order; correctness does not
        # depend on it, as winners are read back).
        claim = np.full(size, -1, np.int32 if n < 2**31 else np.int64)
        idx = np.arange(n, dtype=claim.dtype)
        while idx.size:
            free = claim[slot] < 0
            fidx, fslot = idx[free], slot[free]
            claim[fslot[::-1]] = fidx[::-1]
            won = claim[fslot] == fidx
            self.keys[fslot[won]] = keys[fidx[won]]
            stay = np.ones(len(idx), bool)
            stay[np.flatnonzero(free)[won]] = False
            idx = idx[stay]
            slot = (slot[stay] + 1) & self._mask
        occupied = np.flatnonzero(claim >= 0)
        # spill[s]: a key whose home slot is s lives further on, so a lookup that misses at s
        # must keep probing; without it, a query whose home holds another key (as many as
        # the load factor of the absent ones) would walk to the end of the cluster.
        home = self._slot(self.keys[occupied])
        self.spill = np.zeros(size, bool)
        self.spill[home[home != occupied]] = True
        self.vals = claim.astype(
            np.int32 if n == 0 or values.max() < 2**31 - 1 else np.int64, copy=False
        )
        self.vals[occupied] = values[claim[occupied]]

    def _slot(self, q: np.ndarray) -> np.ndarray:
        s = q * _FIB
        s >>= self._shift
        return s.view(np.int64)

    def slots(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.uint64)
        out = self._slot(q)
        tk = self.keys.take(out)
        miss = np.flatnonzero(tk != q)  # few: most queries hit their home slot
        slot = out[miss]
        out[miss] = -1
        go = self.spill.take(slot)
        probe, slot = miss[go], slot[go]
        while probe.size:
            slot = (slot + 1) & self._mask
            tk = self.keys.take(slot)
            hit = tk == q[probe]
            out[probe[hit]] = slot[hit]
            busy = ~hit & (tk != EMPTY)
            probe, slot = probe[busy], slot[busy]
        return out

    def get(self, queries: np.ndarray) -> np.ndarray:
        s = self.slots(queries)
        out = np.full(len(s), -1, self.vals.dtype)
        hit = s >= 0
        out[hit] = self.vals[s[hit]]
        return out

    def slot_one(self, key: int) -> int:
        """Scalar `slots` (streaming tagging): a few item reads, no array allocation."""
        slot = ((key * FIB_INT) & M64) >> (64 - self.bits)
        while True:
            k = int(self.keys[slot])
            if k == key:
                return slot
            if k == M64:
                return -1
            slot = (slot + 1) & self._mask

    @property
    def capacity(self) -> int:
        return self._mask + 1

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes + self.spill.nbytes
