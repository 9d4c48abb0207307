"""Counting's per-position loops, compiled with numba.

numpy needs a whole-array pass (and a fresh array) for every step of a pass: code, mask,
probe, mix, partition id, shuffle. Here each loop does all of a position's steps at once, so
a token is read once and nothing between the steps touches memory. `nogil=True` keeps the
thread pool parallel; `cache=True` keeps the compiled code on disk (beside this file, or in
numba's user cache directory when that is read-only), so only the first run on a machine
compiles. The arithmetic is `count.py`'s: the same codes, ids, partitions and counts.
"""

from __future__ import annotations

import numba
import numpy as np

MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing; odd, so a bijection mod 2**b
EMPTY = np.uint64(2**64 - 1)
_jit = numba.njit(cache=True, nogil=True)


@numba.njit(cache=True, nogil=True, inline="always")
def _ok(prefix, starts, i):
    """Position i is a candidate: no document starts at i + 1 (`starts` None: not checked),
    and the ids of its prefix (prefix[i]) and suffix (prefix[i + 1]) both exist (>= 0).
    Bitwise, not `and`: no branch to mispredict."""
    both = (prefix[i] >= 0) & (prefix[i + 1] >= 0)
    if starts is None:  # decided when numba compiles, not per position
        return both
    return both & ~starts[i]


@_jit
def ids(keys, spill, bits, prefix, last, starts, v, out, follow, hmask, shift_next, sizes):
    """out[i] = the slot of code prefix[i] * v + last[i] in a `HashIndex` (keys, spill, bits),
    -1 where position i is no candidate (`_ok`) or the code is not in the table.

    In blocks: first every candidate's home slot, then the key there, with no branch on
    what was loaded, so that the cache misses of a block overlap; then the comparisons, the
    spill flag read only on a miss. (One loop that branches on each loaded key waits for
    each miss in turn, as a mispredicted branch discards the loads issued after it.)

    With `sizes` (zeros, one per partition; empty: skipped), each block also does the first
    loop of `scatter` for the next length's codes out[i] * v + follow[i] (i < len(out) - 1),
    while the block's ids are still in cache: `place` then needs only its second loop."""
    shift = np.uint64(64 - bits)
    mask = np.int64((1 << bits) - 1)
    block = 256
    qs = np.empty(block, np.uint64)
    slots = np.empty(block, np.int64)
    at = np.empty(block, np.int64)
    found = np.empty(block, np.uint64)
    _fill(out, -1)
    for a in range(0, len(out), block):
        b = min(a + block, len(out))
        m = _home_slots(prefix, last, starts, v, shift, a, b, qs, slots, at)
        _load(keys, slots, m, found)
        _resolve(keys, spill, mask, qs, slots, at, found, m, out)
        if len(sizes):  # position i needs out[i + 1]: those of this block but its last
            _partition_sizes(out, follow, None, v, hmask, shift_next, max(a - 1, 0), b - 1, sizes)


# Each loop is a function of its own, and none stores into an array of the dtype it reads
# positions from: either made loops 5-20x slower here (numba 0.68, LLVM 22, AMD EPYC).


@_jit
def _fill(out, value):
    for i in range(len(out)):
        out[i] = value


@_jit
def _home_slots(prefix, last, starts, v, shift, a, b, qs, slots, at):
    """The codes and home slots of the candidates among positions a..b-1, compacted without
    branches (a non-candidate is written and then overwritten). Returns how many."""
    m = 0
    for i in range(a, b):
        q = np.uint64(prefix[i]) * v + np.uint64(last[i])
        qs[m] = q
        slots[m] = np.int64((q * MIX) >> shift)
        at[m] = i
        m += _ok(prefix, starts, i)
    return m


@_jit
def _load(keys, slots, m, found):
    for j in range(m):
        found[j] = keys[slots[j]]


@_jit
def _resolve(keys, spill, mask, qs, slots, at, found, m, out):
    for j in range(m):
        q, s = qs[j], slots[j]
        hit = found[j] == q
        out[at[j]] = s if hit else -1
        if not hit and spill[s]:  # a key whose home is s lives further on: probe on
            k = found[j]
            while k != EMPTY:
                s = (s + 1) & mask
                k = keys[s]
                if k == q:
                    out[at[j]] = s
                    break


@_jit
def scatter(prefix, last, starts, v, hmask, shift, out, sizes):
    """The candidate codes c = prefix[i] * v + last[i] of positions 0..len(out)-2, mixed
    (h = c * MIX & hmask) and written to `out` grouped by partition h >> shift (ascending;
    positions in order inside each), stored as out's dtype (uint32: h's low half); out's
    last element is scratch. `sizes` (zeros, one per partition) gets each partition's
    count. Returns the number of codes. Two loops: count, then place (a counting sort)."""
    _partition_sizes(prefix, last, starts, v, hmask, shift, 0, len(out) - 1, sizes)
    return place(prefix, last, starts, v, hmask, shift, out, sizes)


@_jit
def place(prefix, last, starts, v, hmask, shift, out, sizes):
    """`scatter`'s second loop, given each partition's size (from `ids`)."""
    n = len(out) - 1
    pos = np.empty(len(sizes) + 1, np.int64)
    total = 0
    for q in range(len(sizes)):
        pos[q] = total
        total += sizes[q]
    pos[len(sizes)] = n  # where non-candidates are written, branch-free
    _place(prefix, last, starts, v, hmask, shift, n, out, pos)
    return total


@_jit
def _partition_sizes(prefix, last, starts, v, hmask, shift, lo, hi, sizes):
    for i in range(lo, hi):
        sizes[_part(_mixed(prefix[i], last[i], v, hmask), shift)] += _ok(prefix, starts, i)


@_jit
def _place(prefix, last, starts, v, hmask, shift, n, out, pos):
    dump = len(pos) - 1
    for i in range(n):
        h = _mixed(prefix[i], last[i], v, hmask)
        ok = _ok(prefix, starts, i)
        q = _part(h, shift) if ok else dump
        out[pos[q]] = h
        pos[q] += ok


@numba.njit(cache=True, nogil=True, inline="always")
def _mixed(prefix, last, v, hmask):
    return ((np.uint64(prefix) * v + np.uint64(last)) * MIX) & hmask


@numba.njit(cache=True, nogil=True, inline="always")
def _part(h, shift):
    """The partition of mixed code h (shift >= 64: the only one)."""
    return 0 if shift >= 64 else np.int64(h >> shift)


@_jit
def runs(k, weights, min_count, out_keys, counts):
    """Run-length count sorted keys: the distinct keys of `k` whose count (their number, or
    the sum of their `weights` when weights are given) is >= min_count go to out_keys, their
    counts to `counts`. Returns how many. Branch-free: every run end is written, and kept
    by advancing the output index (so the outputs need one slot more than are kept).

    With empty outputs it only counts them, so that callers can allocate them at their exact
    size: a second read of keys still in cache costs less than first-touching outputs as
    long as `k` (the test is the same every iteration, so the compiled loop is split on it)."""
    n = len(k)
    if n == 0:
        return 0
    store = len(out_keys) > 0
    weighted = len(weights) > 0
    m = 0
    c = weights[0] if weighted else 1
    for i in range(1, n):
        end = k[i] != k[i - 1]
        if store:
            out_keys[m] = k[i - 1]
            counts[m] = c
        m += end & (c >= min_count)
        c = (0 if end else c) + (weights[i] if weighted else 1)
    if store:
        out_keys[m] = k[n - 1]
        counts[m] = c
    return m + (c >= min_count)
