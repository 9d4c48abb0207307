"""A sentencepiece tokenizer that round-trips any text and carries its own fingerprint;
`load_tokenizer` also opens a Hugging Face `tokenizer.json` (hf_tokenizer.py).

Trained models use byte fallback (characters outside the vocabulary become `<0x..>` byte
pieces), identity normalization and no whitespace cleanup, so `decode(encode(text)) == text`
for every string without the meta symbol "▁" (U+2581), which sentencepiece reads as a space.
Special ids are fixed: unk 0, bos 1, eos 2, no pad. `sha256` hashes the serialized model
bytes and travels with every artifact made with the tokenizer.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from scone_jax.atomic import atomic_write_bytes
from scone_jax.data.hf_tokenizer import FILE_NAME as HF_FILE_NAME
from scone_jax.data.hf_tokenizer import HFTokenizer
from scone_jax.data.tokenizer_file import TokenizerFile
from scone_jax.errors import UserError

FILE_NAME = "tokenizer.model"
MODEL_TYPES = ("bpe", "unigram")
SPECIAL_IDS = {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}
META_SYMBOL = "\u2581"
# The trainer's thread count is stored in the model proto, hence in the fingerprint: keep it fixed.
TRAIN_THREADS = 8
MAX_TRAIN_SENTENCES = 1_000_000
# Training sentences are lines; longer ones are cut (sentencepiece would drop them silently).
MAX_SENTENCE_CHARS = 16_384


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | HFTokenizer:
    """A sentencepiece `.model`, or a Hugging Face tokenizer (a file named `*.json`)."""
    if Path(path).name.lower().endswith(".json"):
        return HFTokenizer.load(path)
    return Tokenizer.load(path)


def tokenizer_file_name(path: str | os.PathLike) -> str:
    """The name a copy of the tokenizer at `path` takes in a dataset or an export."""
    return HF_FILE_NAME if Path(path).name.lower().endswith(".json") else FILE_NAME


def find_tokenizer_file(directory: str | os.PathLike) -> Path:
    """The tokenizer copy in a dataset or export directory (`tokenizer.model` if neither is)."""
    directory = Path(directory)
    for name in (FILE_NAME, HF_FILE_NAME):
        if (directory / name).is_file():
            return directory / name
    return directory / FILE_NAME


class Tokenizer(TokenizerFile):
    """A loaded sentencepiece model plus where it came from and its sha256 fingerprint."""

    file_name = FILE_NAME
    noun = "tokenizer model"
    expected = "a sentencepiece .model file"

    def __init__(self, model_bytes: bytes, path: str | os.PathLike):
        super().__init__(model_bytes, path)
        if not model_bytes:
            raise UserError(f"tokenizer model {self.path} is empty (expected {self.expected})")
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model_bytes)
        except (RuntimeError, OSError) as e:
            raise UserError(
                f"tokenizer model {self.path} is not a valid sentencepiece model "
                f"({str(e).strip() or type(e).__name__})"
            ) from None

    @classmethod
    def train(
        cls,
        docs: Iterable[str],
        vocab_size: int,
        model_type: str = "bpe",
        out_path: str | os.PathLike | None = None,
        *,
        max_sentences: int = MAX_TRAIN_SENTENCES,
    ) -> Tokenizer:
        """Train on the non-empty lines of `docs` (the first `max_sentences`); write `out_path`.

        Deterministic: the same documents and settings give byte-identical models. The model
        file is written atomically.
        """
        if out_path is None:
            raise TypeError("Tokenizer.train needs out_path (where to write the .model file)")
        if model_type not in MODEL_TYPES:
            raise UserError(f"tokenizer model_type={model_type!r} (expected one of {MODEL_TYPES})")
        if vocab_size <= 0:
            raise UserError(f"tokenizer vocab_size={vocab_size} (expected > 0)")
        sentences = _training_sentences(docs, max_sentences)
        if not sentences:
            raise UserError(
                "empty corpus: no non-empty line to train the tokenizer on (expected some text)"
            )
        writer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=writer,
                vocab_size=vocab_size,
                model_type=model_type,
                byte_fallback=True,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                input_sentence_size=0,
                max_sentence_length=4 * MAX_SENTENCE_CHARS,
                num_threads=TRAIN_THREADS,
                minloglevel=2,
                **SPECIAL_IDS,
            )
        except RuntimeError as e:
            raise UserError(_explain_training_error(str(e), vocab_size, model_type)) from None
        data = writer.getvalue()
        atomic_write_bytes(Path(out_path), data)
        return cls(data, out_path)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Iterable[str], num_threads: int | None = None) -> list[list[int]]:
        """Encode many texts at once on `num_threads` threads (default: all CPUs)."""
        return self._sp.encode(list(texts), num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def _piece_byte_lengths(self) -> np.ndarray:
        """Sentencepiece's pieces: "▁" counts as one space byte, byte pieces `<0x..>` as 1,
        control, unknown and unused pieces as 0. For text without "▁", the lengths of
        `encode(text)` sum to `len(text.encode()) + (1 if text else 0)`: the one extra byte is
        the dummy-prefix space sentencepiece puts in front of every non-empty text.
        """
        sp = self._sp
        lengths = np.zeros(self.vocab_size, dtype=np.int32)
        for i in range(self.vocab_size):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                continue
            lengths[i] = (
                1
                if sp.is_byte(i)
                else len(sp.id_to_piece(i).replace(META_SYMBOL, " ").encode("utf-8"))
            )
        return lengths


def _training_sentences(docs: Iterable[str], limit: int) -> list[str]:
    """The first `limit` non-empty lines; collected up front so corpus errors surface here."""
    out: list[str] = []
    for doc in docs:
        for line in doc.splitlines():
            if line.strip():
                out.append(line[:MAX_SENTENCE_CHARS])
                if len(out) >= limit:
                    return out
    return out


def _explain_training_error(message: str, vocab_size: int, model_type: str) -> str:
    if m := re.search(r"required_chars\. \d+ vs (\d+)", message):
        return (
            f"tokenizer vocab_size={vocab_size} is too small for this corpus (expected >= "
            f"{m.group(1)}: 256 byte pieces, 3 special pieces and the corpus's characters)"
        )
    if m := re.search(r"value <= (\d+)", message):
        return (
            f"tokenizer vocab_size={vocab_size} is too large for this corpus (expected <= "
            f"{m.group(1)} for a {model_type} model; use a larger corpus or a smaller vocab size)"
        )
    return (
        f"sentencepiece training failed with vocab_size={vocab_size}, "
        f"model_type={model_type!r}: {message.strip()}"
    )
