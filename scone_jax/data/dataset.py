"""A tokenized dataset on disk: token ids plus document boundaries, memory-mapped.

Layout of a dataset directory (written once, atomically, by `scone-jax tokenize`):

    tokens.bin        raw little-endian token ids, dtype from meta (uint16 or uint32)
    doc_offsets.npy   int64 [num_docs + 1]; document d is tokens[offsets[d]:offsets[d+1]]
    token_bytes.npy   int32 [vocab_size]; UTF-8 bytes each token stands for (bits per byte)
    meta.json         counts, dtype, vocab size, tokenizer and corpus fingerprints, checksums
    tokenizer.model   the sentencepiece model the ids came from (its sha256 is in meta.json),
    or tokenizer.json a Hugging Face tokenizer instead
    checksums.json    size and crc32 of every file above, written last, checked on open

Everything downstream (f-gram counting, tagging, the grain pipeline) reads this format.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scone_jax.checksums import verify_manifest, write_manifest
from scone_jax.errors import UserError

FORMAT_VERSION = 1
META_FILE = "meta.json"
TOKENS_FILE = "tokens.bin"
OFFSETS_FILE = "doc_offsets.npy"
TOKEN_BYTES_FILE = "token_bytes.npy"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass
class TokenizedDataset:
    """Read-only view of a dataset directory. `tokens` is a memmap: opening costs no RAM."""

    path: Path
    meta: dict[str, Any]
    tokens: np.ndarray
    doc_offsets: np.ndarray
    token_bytes: np.ndarray

    @classmethod
    def open(cls, path: str | os.PathLike) -> TokenizedDataset:
        """Open a dataset directory, checking its files against checksums.json (one read of
        each)."""
        path = Path(path)
        meta_path = path / META_FILE
        for required in (META_FILE, TOKENS_FILE):
            if not (path / required).is_file():
                raise UserError(
                    f"{path} is not a tokenized dataset (no {required}; expected the output of "
                    "`scone-jax tokenize`)"
                )
        verify_manifest(path, required=(META_FILE, TOKENS_FILE, OFFSETS_FILE, TOKEN_BYTES_FILE))
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{meta_path} is unreadable or corrupt: {e}") from None
        if meta.get("format_version") != FORMAT_VERSION:
            raise UserError(
                f"{meta_path}: format_version={meta.get('format_version')!r} (expected "
                f"{FORMAT_VERSION})"
            )
        dtype = np.dtype(meta["dtype"])
        tokens_path = path / TOKENS_FILE
        expected = meta["num_tokens"] * dtype.itemsize
        size = tokens_path.stat().st_size if tokens_path.is_file() else -1
        if size != expected:
            raise UserError(
                f"{tokens_path} has {size} bytes (expected {expected}); the dataset is truncated "
                "or corrupt"
            )
        tokens = (
            np.memmap(tokens_path, dtype=dtype, mode="r", shape=(meta["num_tokens"],))
            if meta["num_tokens"]
            else np.zeros((0,), dtype)
        )
        try:
            offsets = np.load(path / OFFSETS_FILE)
            token_bytes = np.load(path / TOKEN_BYTES_FILE)
        except (OSError, ValueError) as e:
            raise UserError(
                f"{path}: cannot read document offsets or token byte lengths: {e}"
            ) from None
        if (
            offsets.ndim != 1
            or len(offsets) != meta["num_docs"] + 1
            or offsets[0] != 0
            or offsets[-1] != meta["num_tokens"]
            or np.any(np.diff(offsets) < 0)
        ):
            raise UserError(
                f"{path / OFFSETS_FILE} does not match {META_FILE}; the dataset is corrupt"
            )
        return cls(
            path=path, meta=meta, tokens=tokens, doc_offsets=offsets, token_bytes=token_bytes
        )

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def num_docs(self) -> int:
        return int(self.meta["num_docs"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def tokenizer_sha256(self) -> str:
        return str(self.meta["tokenizer_sha256"])

    @property
    def doc_lengths(self) -> np.ndarray:
        return np.diff(self.doc_offsets)

    def doc(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.doc_offsets[i] : self.doc_offsets[i + 1]])


class DatasetWriter:
    """Append documents' token ids to `dir`, then `finish()` writes offsets and meta.

    Use inside `atomic_dir` so an interrupted write never leaves a readable dataset.
    """

    def __init__(self, directory: str | os.PathLike, vocab_size: int):
        self.dir = Path(directory)
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self._file = open(self.dir / TOKENS_FILE, "wb")
        self._hash = hashlib.sha256()
        self._offsets = [0]

    def add(self, ids) -> None:
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise UserError(
                f"token id out of range [0, {self.vocab_size}) in document {len(self._offsets) - 1}"
            )
        data = arr.astype(self.dtype, copy=False).tobytes()
        self._file.write(data)
        self._hash.update(data)
        self._offsets.append(self._offsets[-1] + int(arr.size))

    @property
    def num_tokens(self) -> int:
        return self._offsets[-1]

    def finish(self, token_bytes: np.ndarray, **meta: Any) -> dict[str, Any]:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        np.save(self.dir / OFFSETS_FILE, np.asarray(self._offsets, dtype=np.int64))
        np.save(self.dir / TOKEN_BYTES_FILE, np.asarray(token_bytes, dtype=np.int32))
        full = {
            "format_version": FORMAT_VERSION,
            "num_tokens": self.num_tokens,
            "num_docs": len(self._offsets) - 1,
            "dtype": self.dtype.str,
            "vocab_size": self.vocab_size,
            "tokens_sha256": self._hash.hexdigest(),
            **meta,
        }
        (self.dir / META_FILE).write_text(
            json.dumps(full, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        write_manifest(self.dir)
        return full


def write_dataset(
    directory: str | os.PathLike, docs, vocab_size: int, token_bytes: np.ndarray, **meta: Any
) -> dict[str, Any]:
    """Write an in-memory list of token-id documents (tests, small tools) as a dataset."""
    writer = DatasetWriter(directory, vocab_size)
    for doc in docs:
        writer.add(doc)
    return writer.finish(token_bytes, **meta)
