"""The token stream f-grams are counted over: validated token ids plus document boundaries.

A `Corpus` is either a tokenized dataset directory (tokens stay on disk and are read in
chunks with `pread`, so a corpus larger than RAM costs no resident memory beyond the chunk)
or in-memory arrays (`--token-ids` / `--doc-lengths`, tests). Every bad input becomes a
one-line `UserError` here, before any output is written.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scone_jax.errors import UserError

_SCAN_CHUNK = 1 << 24


@dataclass
class Corpus:
    tokens: np.ndarray  # 1-D unsigned ids (a np.memmap for datasets)
    doc_offsets: np.ndarray  # int64 [num_docs + 1], 0 .. num_tokens
    vocab_size: int | None  # declared vocabulary size; None when unknown
    tokenizer_sha256: str | None = None
    tokenizer_path: str | None = None
    corpus_sha256: str | None = None  # of the raw text, when the dataset records it
    tokens_sha256: str | None = None
    source: str = "arrays"
    # which documents of which dataset, for a training split (`train_split_corpus`): recorded in
    # the set's meta so that training can tell whether its held-out documents chose f-grams
    split: dict | None = None
    # and for Beam workers that read the whole dataset's copy: its document offsets, and which
    # of its documents this split holds
    split_parent_offsets: np.ndarray | None = field(default=None, repr=False)
    split_doc_ids: np.ndarray | None = field(default=None, repr=False)
    _key_vocab: int | None = field(default=None, repr=False)
    _fd: int | None = field(default=None, repr=False)
    _file_offset: int = field(default=0, repr=False)

    # construction -------------------------------------------------------------------------

    @classmethod
    def from_dataset(cls, dataset) -> Corpus:
        """Wrap a `scone_jax.data.dataset.TokenizedDataset` (or a path to one)."""
        from scone_jax.data.tokenize import dataset_tokenizer_path

        if isinstance(dataset, str | os.PathLike):
            from scone_jax.data.dataset import TokenizedDataset

            dataset = TokenizedDataset.open(dataset)
        meta = dataset.meta
        corpus = cls(
            tokens=dataset.tokens,
            doc_offsets=np.asarray(dataset.doc_offsets, np.int64),
            vocab_size=dataset.vocab_size,
            tokenizer_sha256=meta.get("tokenizer_sha256"),
            # its own copy: the path recorded at tokenizing is stale once the dataset moves
            tokenizer_path=str(dataset_tokenizer_path(dataset)),
            corpus_sha256=meta.get("corpus_sha256"),
            tokens_sha256=meta.get("tokens_sha256"),
            source=str(dataset.path),
        )
        if isinstance(dataset.tokens, np.memmap) and dataset.tokens.filename:
            corpus._fd = os.open(dataset.tokens.filename, os.O_RDONLY)
            corpus._file_offset = int(dataset.tokens.offset)
        return corpus

    @classmethod
    def from_arrays(
        cls,
        token_ids,
        doc_lengths=None,
        vocab_size: int | None = None,
        source: str = "arrays",
        tokenizer_sha256: str | None = None,
        tokenizer_path: str | None = None,
    ) -> Corpus:
        """Validate a 1-D integer array (and optional document lengths summing to its size)."""
        tokens = np.asarray(token_ids)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise UserError(
                f"{source}: token ids must be a 1-D integer array (got shape {tokens.shape}, dtype "
                f"{tokens.dtype})"
            )
        if vocab_size is not None and vocab_size < 1:
            raise UserError(f"vocab size {vocab_size} must be >= 1")
        if tokens.size:
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0:
                pos = int(np.argmax(tokens < 0))
                raise UserError(
                    f"{source}: negative token id {int(tokens[pos])} at position {pos} (expected "
                    "ids >= 0)"
                )
            if vocab_size is not None and hi >= vocab_size:
                pos = int(np.argmax(tokens >= vocab_size))
                raise UserError(
                    f"{source}: token id {int(tokens[pos])} at position {pos} is out of vocabulary "
                    f"(expected < vocab size {vocab_size})"
                )
            if hi >= 2**32 - 1:
                raise UserError(f"{source}: token id {hi} does not fit in 32 bits")
        dtype = np.uint16 if (tokens.size == 0 or hi < 2**16) else np.uint32
        tokens = np.ascontiguousarray(tokens, dtype=dtype)
        if doc_lengths is None:
            offsets = np.array([0, tokens.size], np.int64)
        else:
            lengths = np.asarray(doc_lengths)
            if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
                raise UserError(
                    f"document lengths must be a 1-D integer array (got shape {lengths.shape}, "
                    f"dtype {lengths.dtype})"
                )
            if lengths.size and lengths.min() < 0:
                raise UserError(f"document lengths must be >= 0 (found {int(lengths.min())})")
            total = int(lengths.sum())
            if total != tokens.size:
                raise UserError(
                    f"document lengths sum to {total} but there are {tokens.size} token ids"
                )
            offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        sha = hashlib.sha256(tokens.astype("<u4").tobytes()).hexdigest()
        return cls(
            tokens=tokens,
            doc_offsets=offsets,
            vocab_size=vocab_size,
            source=source,
            tokens_sha256=sha,
            tokenizer_sha256=tokenizer_sha256,
            tokenizer_path=tokenizer_path,
        )

    # properties ---------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def fingerprint(self) -> str:
        """sha256 of the token ids and the document boundaries: what was counted."""
        h = hashlib.sha256()
        h.update((self.tokens_sha256 or "").encode())
        h.update(np.ascontiguousarray(self.doc_offsets, dtype="<i8").tobytes())
        return h.hexdigest()

    def check_nonempty(self) -> None:
        if self.num_tokens == 0:
            raise UserError(
                f"{self.source}: the corpus is empty (0 tokens); expected at least one document "
                "with tokens"
            )

    def key_vocab(self) -> int:
        """The radix used to pack (prefix, token) codes: the declared vocab size, else max id + 1.

        The first call scans the tokens once (chunked) and checks them against the declared
        vocabulary size.
        """
        if self._key_vocab is None:
            hi = self.check_below(self.vocab_size, "vocab size")
            self._key_vocab = self.vocab_size if self.vocab_size is not None else hi + 1
        return self._key_vocab

    def check_below(self, limit: int | None, what: str) -> int:
        """Raise if some id is >= limit (None: no limit); return the largest id (-1 if none)."""
        hi = -1
        for a in range(0, self.num_tokens, _SCAN_CHUNK):
            chunk = self.read(a, min(self.num_tokens, a + _SCAN_CHUNK))
            m = int(chunk.max())
            if limit is not None and m >= limit:
                pos = a + int(np.argmax(chunk >= limit))
                raise UserError(
                    f"{self.source}: token id {int(chunk[pos - a])} at position {pos} is out of "
                    f"vocabulary (expected < {what} {limit})"
                )
            hi = max(hi, m)
        return hi

    # reading ------------------------------------------------------------------------------

    def read(self, a: int, b: int) -> np.ndarray:
        """A private copy of tokens[a:b] (pread from the file for datasets)."""
        b = min(b, self.num_tokens)
        if b <= a:
            return np.zeros(0, self.tokens.dtype)
        if self._fd is None:
            return np.array(self.tokens[a:b])
        item = self.tokens.dtype.itemsize
        want = (b - a) * item
        buf = bytearray(want)
        view = memoryview(buf)
        got = 0
        while got < want:
            n = os.preadv(self._fd, [view[got:]], self._file_offset + a * item + got)
            if n <= 0:
                raise UserError(f"{self.source}: unexpected end of the tokens file")
            got += n
        return np.frombuffer(buf, dtype=self.tokens.dtype)

    def starts(self, a: int, b: int) -> np.ndarray:
        """Boolean [b - a]: True where a document starts at that position (or past the end)."""
        mask = np.zeros(max(b - a, 0), bool)
        lo, hi = np.searchsorted(self.doc_offsets, [a, b], side="left")
        mask[self.doc_offsets[lo:hi] - a] = True
        if b > self.num_tokens:
            mask[max(self.num_tokens - a, 0) :] = True
        return mask

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


def load_arrays(
    token_ids_path: str | os.PathLike,
    doc_lengths_path: str | os.PathLike | None = None,
    vocab_size: int | None = None,
) -> Corpus:
    """`--token-ids FILE.npy [--doc-lengths FILE.npy]` as a Corpus."""

    def load(path, what):
        path = Path(path)
        if not path.is_file():
            problem = "is not a file" if path.exists() else "does not exist"
            raise UserError(f"{what} file {path} {problem} (expected a .npy array)")
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            # numpy reads a file of pickled objects, or of anything else, as "pickled data"
            reason = "it holds no .npy array of numbers" if "pickle" in str(e) else e
            raise UserError(f"{what} file {path} is not a readable .npy array: {reason}") from None

    tokens = load(token_ids_path, "--token-ids")
    lengths = load(doc_lengths_path, "--doc-lengths") if doc_lengths_path is not None else None
    return Corpus.from_arrays(tokens, lengths, vocab_size=vocab_size, source=str(token_ids_path))
