"""A byte-level BPE (GPT-2's scheme) trained here by the `tokenizers` library, saved as a
`tokenizer.json`: the kind of file a user brings from the Hugging Face world, made offline."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
ALPHABET = "the quick brown fox jumps over a lazy dog éàü中文字 \n,."


def random_texts(rng: random.Random, n: int, max_len: int = 80) -> list[str]:
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


def train_byte_level_bpe(
    path: Path, texts: list[str], vocab_size: int = 400, specials=(EOS,)
) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path
