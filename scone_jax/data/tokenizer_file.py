"""What every tokenizer shares: the file's bytes, where they came from and their fingerprint.

A tokenizer is a file (a sentencepiece `.model`, a Hugging Face `tokenizer.json`); its sha256
travels with every artifact made with it, so a dataset or an f-gram set refuses a different
one. `Tokenizer` (tokenizer.py) and `HFTokenizer` (hf_tokenizer.py) extend this class with the
library that reads the bytes.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Self

import numpy as np

from scone_jax.errors import UserError


class TokenizerFile(ABC):
    """A tokenizer's serialized bytes, its absolute path and sha256; subclasses decode them."""

    file_name: str  # the name a copy takes in a dataset or an export directory
    noun: str  # how error lines name the file ("tokenizer model", "tokenizer")
    expected: str  # what such a file is, for error lines

    def __init__(self, data: bytes, path: str | os.PathLike):
        self._path = Path(path).absolute()
        self._bytes = data
        self._sha256 = hashlib.sha256(data).hexdigest()
        self._token_bytes: np.ndarray | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Self:
        p = Path(path)
        if not p.is_file():
            problem = "is not a file" if p.exists() else "does not exist"
            raise UserError(f"{cls.noun} {p} {problem} (expected {cls.expected})")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {cls.noun} {p}: {e.strerror}") from None
        return cls(data, p)

    @property
    def sha256(self) -> str:
        return self._sha256

    @property
    def path(self) -> Path:
        return self._path

    @property
    def model_bytes(self) -> bytes:
        """The serialized file (what `sha256` hashes); copy it to make the file elsewhere."""
        return self._bytes

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    def token_byte_lengths(self) -> np.ndarray:
        """int32 [vocab_size]: UTF-8 bytes each piece stands for, for bits per byte (cached,
        read-only; `_piece_byte_lengths` says how each library's pieces count)."""
        if self._token_bytes is None:
            lengths = self._piece_byte_lengths()
            lengths.flags.writeable = False
            self._token_bytes = lengths
        return self._token_bytes

    @abstractmethod
    def _piece_byte_lengths(self) -> np.ndarray: ...

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self._path)!r}, vocab_size={self.vocab_size}, "
            f"sha256={self._sha256[:12]})"
        )
