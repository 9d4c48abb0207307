"""A Hugging Face `tokenizer.json` (the `tokenizers` library), read from a local file only.

The paper presets' vocabularies (GPT-2's 50,257 pieces, OLMo's 50,304) exist as such files and
no sentencepiece model reproduces them. The interface is `Tokenizer`'s (tokenizer.py), so
datasets, f-gram sets, training and generation take either. Conventions:

* Texts are encoded without the tokenizer's post-processor (`add_special_tokens=False`), so no
  BOS is added and a document is `encode(doc) + [eos]`, as with sentencepiece.
* A special token's text inside a document (`<|endoftext|>` written out) is encoded as text,
  as sentencepiece does: only the dataset's own document ends are EOS, and token bytes still
  sum to the text's bytes.
* EOS and BOS are the added special tokens with the usual names (`EOS_NAMES`, `BOS_NAMES`);
  a file with no EOS among them gives `eos_id == -1` (tokenize with `--no-eos`).
* `sha256` hashes the file's bytes, the fingerprint every artifact made with it carries.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer as _HFTokenizer

from scone_jax.data.tokenizer_file import TokenizerFile
from scone_jax.errors import UserError

FILE_NAME = "tokenizer.json"
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>")
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (character -> byte), as ByteLevel uses it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class HFTokenizer(TokenizerFile):
    """A loaded `tokenizer.json` plus where it came from and its sha256 fingerprint."""

    file_name = FILE_NAME
    noun = "tokenizer"
    expected = "a Hugging Face tokenizer.json"

    def __init__(self, data: bytes, path: str | os.PathLike):
        super().__init__(data, path)
        try:
            spec = json.loads(data.decode("utf-8"))
            self._tok = _HFTokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # the tokenizers library raises plain Exception
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(
                f"tokenizer {self._path} is not a valid Hugging Face tokenizer.json ({reason})"
            ) from None
        self._spec = spec
        self._tok.encode_special_tokens = True  # a special token's text in a document is text
        specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t["special"]}
        self._eos = next((specials[n] for n in EOS_NAMES if n in specials), -1)
        self._bos = next((specials[n] for n in BOS_NAMES if n in specials), -1)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def bos_id(self) -> int:
        return self._bos

    @property
    def byte_level(self) -> bool:
        """Whether pieces are bytes in GPT-2's stand-in alphabet (a ByteLevel decoder)."""
        decoder = self._spec.get("decoder") or {}
        parts = (
            decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        )
        return any(d.get("type") == "ByteLevel" for d in parts)

    def piece(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` (None for an id the file leaves unused)."""
        return self._tok.id_to_token(int(token_id))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None) -> list[list[int]]:
        """Encode many texts at once (the library's own thread pool; `num_threads` unused)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def _piece_byte_lengths(self) -> np.ndarray:
        """Byte-level pieces count one byte per character of GPT-2's alphabet (a piece may be part
        of a character), byte-fallback pieces `<0x..>` one byte, "▁" one space byte, special
        tokens 0. For a byte-level tokenizer the lengths of `encode(text)` sum to
        `len(text.encode())` exactly.
        """
        alphabet = byte_level_alphabet() if self.byte_level else None
        specials = {t["id"] for t in self._spec.get("added_tokens", []) if t["special"]}
        lengths = np.zeros(self.vocab_size, dtype=np.int32)
        for i in range(self.vocab_size):
            piece = self.piece(i)
            if piece is None or i in specials:
                continue
            if alphabet is not None and all(c in alphabet for c in piece):
                lengths[i] = len(piece)
            elif _BYTE_PIECE.fullmatch(piece):
                lengths[i] = 1
            else:
                lengths[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
        return lengths
