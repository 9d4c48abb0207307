"""The f-gram set on disk: what counting produces and tagging, training and export read.

Layout of an f-gram set directory (written once, atomically):

    tokens.npy    int32 [S, K]  token ids of f-gram `id` in row `id`, right-padded with -1
    lengths.npy   int8  [S]     number of real tokens (2..K)
    counts.npy    int64 [S]     occurrences in the counted corpus
    keys.npy      uint64 [S]    the 64-bit keys (`keys.fgram_keys`), sorted ascending
    key_ids.npy   int32 [S]     key_ids[j] = id of the f-gram whose key is keys[j]
    meta.json     K, S, min count, cutoff count, key hash and seed, tokenizer and corpus
                  fingerprints, per-array sha256, the set's own fingerprint
    checksums.json  size and crc32 of the files above, written last, checked on load
    stats.json, stats.png       coverage statistics (written by the builder; optional)

Ids are the rank order (count desc, shorter first, tokens ascending). Keys are unique: a
collision between two f-grams is detected here and resolved by re-hashing with the next
seed (recorded in meta), or refused loudly.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scone_jax.atomic import atomic_dir
from scone_jax.checksums import MANIFEST, verify_manifest, write_manifest
from scone_jax.errors import UserError
from scone_jax.fgrams import keys as keymod

FORMAT_VERSION = 1
ARRAYS = ("tokens", "lengths", "counts", "keys", "key_ids")
FILES = tuple(f"{name}.npy" for name in ARRAYS) + (
    "meta.json",
    MANIFEST,
)  # what a copy of a set must carry
SET_MARKER = "keys.npy"  # a file every f-gram set holds and no other artifact does
SET_KIND = "an f-gram set"
MAX_SEEDS = 8


class KeyCollisionError(RuntimeError):
    """Two distinct f-grams share a 64-bit key under every seed tried: the hash is broken."""


def array_sha256(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


@dataclass
class FgramSet:
    tokens: np.ndarray
    lengths: np.ndarray
    counts: np.ndarray
    keys: np.ndarray
    key_ids: np.ndarray
    meta: dict[str, Any]
    path: Path | None = None
    stats: dict | None = field(default=None, repr=False)  # set by the builder, not stored here
    _tagger: Any = field(default=None, repr=False)

    # creation -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        tokens: np.ndarray,
        lengths: np.ndarray,
        counts: np.ndarray,
        *,
        max_n: int,
        min_count: int,
        key_vocab: int,
        requested: int | None = None,
        **meta: Any,
    ) -> FgramSet:
        """Arrays in id order -> a set with keys (collision-checked) and complete meta."""
        s = len(lengths)
        tok_dtype = np.int32 if key_vocab <= 2**31 - 1 else np.int64
        tokens = np.asarray(tokens).astype(tok_dtype)
        lengths = np.asarray(lengths).astype(np.int8)
        counts = np.asarray(counts).astype(np.int64)
        if tokens.shape != (s, max_n):
            raise ValueError(f"tokens must be [{s}, {max_n}], got {tokens.shape}")
        for seed in range(MAX_SEEDS):
            keys = keymod.fgram_keys(tokens, lengths, seed)
            order = np.argsort(keys)  # unique keys (else re-seeded): any sort gives one order
            sorted_keys = keys[order]
            dup = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
            if not dup.size:
                break
            a, b = order[dup[0]], order[dup[0] + 1]
            print(
                f"warning: f-grams {a} and {b} share the 64-bit key {int(sorted_keys[dup[0]]):#x} "
                f"under seed {seed} ({dup.size} collisions); re-hashing with seed {seed + 1}",
                file=sys.stderr,
            )
        else:
            raise KeyCollisionError(
                f"f-gram keys still collide after {MAX_SEEDS} seeds ({dup.size} duplicate keys); "
                f"the key hash {keymod.KEY_HASH} is broken"
            )
        full = {
            "format_version": FORMAT_VERSION,
            "max_n": int(max_n),
            "num_fgrams": int(s),
            "requested_num_fgrams": int(requested if requested is not None else s),
            "min_count": int(min_count),
            "cutoff_count": int(counts[-1]) if s else None,
            "key_hash": keymod.KEY_HASH,
            "key_seed": int(seed),
            "key_vocab": int(key_vocab),
            "fgrams_per_length": {str(n): int(np.sum(lengths == n)) for n in range(2, max_n + 1)},
            **meta,
        }
        fs = cls(tokens, lengths, counts, sorted_keys, order.astype(np.int32), full)
        fs._finish_meta()
        return fs

    def _finish_meta(self) -> None:
        sums = {name: array_sha256(getattr(self, name)) for name in ARRAYS}
        self.meta["sha256"] = sums
        ident = json.dumps(
            {"sha256": sums, "max_n": self.max_n, "key_seed": self.key_seed}, sort_keys=True
        )
        self.meta["fingerprint"] = hashlib.sha256(ident.encode()).hexdigest()

    # io -----------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        with atomic_dir(directory, overwrite, marker=SET_MARKER, kind=SET_KIND) as tmp:
            self.write_into(tmp)
        self.path = Path(directory)
        return self.path

    def write_into(self, directory: Path) -> None:
        """Write the arrays and meta into an existing (temporary) directory."""
        for name in ARRAYS:
            np.save(directory / f"{name}.npy", getattr(self, name))
        (directory / "meta.json").write_text(
            json.dumps(self.meta, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        write_manifest(directory, FILES[:-1])

    @classmethod
    def load(cls, directory: str | os.PathLike, verify: bool = True) -> FgramSet:
        """Open a set directory; every inconsistency is a one-line UserError."""
        path = Path(directory)
        meta_path = path / "meta.json"
        for required in ("meta.json", SET_MARKER):
            if not (path / required).is_file():
                raise UserError(
                    f"{path} is not an f-gram set (no {required}; expected the output of "
                    "`scone-jax fgrams build`)"
                )
        checked = verify and verify_manifest(path, required=FILES[:-1])
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{meta_path} is unreadable or corrupt: {e}") from None
        if meta.get("format_version") != FORMAT_VERSION:
            raise UserError(
                f"{meta_path}: format_version={meta.get('format_version')!r} (expected "
                f"{FORMAT_VERSION})"
            )
        arrays = {}
        for name in ARRAYS:
            try:
                arrays[name] = np.load(path / f"{name}.npy", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise UserError(f"{path / (name + '.npy')} is missing or unreadable: {e}") from None
        s, k = meta["num_fgrams"], meta["max_n"]
        want = {"tokens": (s, k), "lengths": (s,), "counts": (s,), "keys": (s,), "key_ids": (s,)}
        for name, shape in want.items():
            if arrays[name].shape != shape:
                raise UserError(
                    f"{path / (name + '.npy')} has shape {arrays[name].shape} (expected {shape}); "
                    "the set is corrupt"
                )
        if (
            verify and not checked
        ):  # a set written before manifests: its arrays' sha256 in meta.json
            for name in ARRAYS:
                if array_sha256(arrays[name]) != meta["sha256"][name]:
                    raise UserError(
                        f"{path / (name + '.npy')} fails its checksum; the set is corrupt"
                    )
        return cls(meta=meta, path=path, **arrays)

    # accessors ----------------------------------------------------------------------------

    @property
    def max_n(self) -> int:
        return int(self.meta["max_n"])

    @property
    def num_fgrams(self) -> int:
        return int(self.meta["num_fgrams"])

    @property
    def key_seed(self) -> int:
        return int(self.meta["key_seed"])

    @property
    def key_vocab(self) -> int:
        return int(self.meta["key_vocab"])

    @property
    def vocab_size(self) -> int | None:
        return self.meta.get("vocab_size")

    @property
    def tokenizer_sha256(self) -> str | None:
        return self.meta.get("tokenizer_sha256")

    @property
    def fingerprint(self) -> str:
        return str(self.meta["fingerprint"])

    @property
    def cutoff_count(self) -> int | None:
        return self.meta.get("cutoff_count")

    def fgram(self, i: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokens[i, : self.lengths[i]])

    def lookup_keys(self, keys: np.ndarray) -> np.ndarray:
        """Ids of the f-grams with these 64-bit keys (-1 where absent): the serving lookup."""
        keys = np.asarray(keys, np.uint64)
        pos = np.searchsorted(self.keys, keys)
        pos_c = np.minimum(pos, max(len(self.keys) - 1, 0))
        hit = (
            (pos < len(self.keys)) & (self.keys[pos_c] == keys)
            if len(self.keys)
            else np.zeros(len(keys), bool)
        )
        return np.where(hit, self.key_ids[pos_c] if len(self.keys) else -1, -1)

    def backoff_ids(self) -> np.ndarray:
        """[S] the id of each f-gram's longest proper suffix in the set (length >= 2), -1 where
        none: the row f-gram backoff dropout (fgrams.drop_to=suffix) feeds instead. Hits are
        checked token by token, so a key collision cannot pick a wrong suffix."""
        tokens = np.asarray(self.tokens)  # [S, K], padded with -1
        lengths = np.asarray(self.lengths, np.int64)
        out = np.full(len(lengths), -1, np.int64)
        for cut in range(1, self.max_n - 1):  # shortest cut first: the longest suffix wins
            todo = np.flatnonzero((out < 0) & (lengths - cut >= 2))
            suffix = np.full((len(todo), self.max_n), -1, tokens.dtype)
            suffix[:, : self.max_n - cut] = tokens[todo, cut:]
            ids = self.lookup_keys(keymod.fgram_keys(suffix, lengths[todo] - cut, self.key_seed))
            same = (ids >= 0) & np.all(tokens[np.maximum(ids, 0)] == suffix, axis=1)
            out[todo[same]] = ids[same]
        return out

    def tagger(self):
        """The exact longest-match tagger for this set (built once, cached)."""
        if self._tagger is None:
            from scone_jax.fgrams.tag import Tagger

            self._tagger = Tagger(self)
        return self._tagger

    def check_tokenizer(self, tokenizer_sha256: str | None, what: str) -> None:
        """Refuse data tokenized differently from the counted corpus (unknown on either side
        passes)."""
        mine = self.tokenizer_sha256
        if mine and tokenizer_sha256 and mine != tokenizer_sha256:
            raise UserError(
                f"{what} was tokenized with tokenizer {tokenizer_sha256[:12]}... but the f-gram "
                f"set {self.path or ''} was counted with {mine[:12]}...; rebuild the set or "
                "retokenize"
            )
