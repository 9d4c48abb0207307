"""What `scone-jax generate` prints: the prompt and its continuation as one text."""

import numpy as np

from scone_jax.cli.generate_cmd import continuation
from scone_jax.data.tokenizer import Tokenizer


def test_the_continuation_keeps_the_space_its_first_piece_brings(tmp_path):
    rng = np.random.default_rng()
    words = "the value of a cat sat on mat and then ran far away".split()
    texts = [" ".join(rng.choice(words, 200)) for _ in range(30)]
    tokenizer = Tokenizer.train(texts, 280, out_path=tmp_path / "t.model")
    prompt = tokenizer.encode("The value of")
    whole = tokenizer.encode("The value of the cat")
    assert whole[: len(prompt)] == prompt
    new = whole[len(prompt) :]
    assert not tokenizer.decode(new).startswith(" ")  # decoded alone, the space is lost
    assert continuation(tokenizer, prompt, new) == " the cat"
    assert continuation(tokenizer, prompt, []) == ""
