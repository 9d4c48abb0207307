"""The fixed 64-bit key of an f-gram: a hash of (length, tokens), the same in every process.

Serving looks f-grams up by this key, so it must never depend on Python's salted `hash`,
the platform or the numpy version. Definition (all arithmetic modulo 2**64):

    fmix64(x) = x ^= x >> 33; x *= 0xFF51AFD7ED558CCD; x ^= x >> 33;
                x *= 0xC4CEB9FE1A85EC53; x ^= x >> 33          (MurmurHash3's finaliser)
    h = fmix64(seed * 0x9E3779B97F4A7C15 + n)                 n = length, seed from meta
    for each token t_0 .. t_{n-1}:  h = fmix64(h ^ t_j)
    key = h

`fmix64` is a bijection, so two different f-grams collide only by accident (~S^2 / 2^65);
`store.FgramSet.create` checks the sorted keys for duplicates and re-hashes with the next
seed if it ever happens. `fgram_key` is the scalar reference; the rest are vectorised.
"""

from __future__ import annotations

import numpy as np

KEY_HASH = "fmix64-chain-v1"
_M64 = (1 << 64) - 1
_C1, _C2, _GOLD = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x9E3779B97F4A7C15
_S33 = np.uint64(33)


def _fmix64_int(x: int) -> int:
    x ^= x >> 33
    x = (x * _C1) & _M64
    x ^= x >> 33
    x = (x * _C2) & _M64
    return x ^ (x >> 33)


def fgram_key(tokens, seed: int = 0) -> int:
    """The key of one f-gram (a sequence of token ids), in plain Python: the reference."""
    toks = [int(t) for t in tokens]
    h = _fmix64_int((seed * _GOLD + len(toks)) & _M64)
    for t in toks:
        h = _fmix64_int(h ^ (t & _M64))
    return h


def fmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised fmix64 on a uint64 array (modified in place and returned)."""
    x ^= x >> _S33
    x *= np.uint64(_C1)
    x ^= x >> _S33
    x *= np.uint64(_C2)
    x ^= x >> _S33
    return x


def _start(lengths: np.ndarray, seed: int) -> np.ndarray:
    base = np.uint64((seed * _GOLD) & _M64)
    return fmix64(np.asarray(lengths, dtype=np.uint64) + base)


def fgram_keys(tokens: np.ndarray, lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """Keys of f-grams given as a right-padded [N, K] matrix and their lengths [N]."""
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    h = _start(lengths, seed)
    shortest = int(lengths.min()) if len(lengths) else 0
    for j in range(tokens.shape[1] if tokens.ndim == 2 else 0):
        nxt = fmix64(h ^ tokens[:, j].astype(np.int64).astype(np.uint64))
        h = nxt if j < shortest else np.where(lengths > j, nxt, h)  # every row is this long
    return h


def suffix_keys(tokens: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Key of the n-gram ending at each position i >= n-1 of a 1-D token array (length len-n+1).

    Element j is the key of tokens[j : j+n]; callers mask n-grams that cross documents.
    """
    tokens = np.asarray(tokens)
    m = len(tokens) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    h = _start(np.full(m, n), seed)
    t64 = tokens.astype(np.int64).astype(np.uint64)
    for j in range(n):
        h ^= t64[j : j + m]
        fmix64(h)
    return h
