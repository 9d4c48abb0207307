"""F-gram dropout: in training, a random share of the matched positions is fed as unmatched
(T's row alone), or with `fgrams.drop_to: suffix` as their f-gram's backoff, so that the
backbone cannot lean on an f-gram row that fits the training text only. The draw is a hash of
(seed, step, dataset position): the same on every host and after a resume, fresh at every
step, and independent of the batch's layout (microbatches).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from scone_jax.fgrams.keys import fgram_key, fmix64


def keep_mask(positions: np.ndarray, step: int, rate: float, seed: int) -> np.ndarray:
    """True where a position keeps its f-gram: each is dropped with probability `rate`
    (the top 53 bits of fmix64(position ^ key of (seed, step)) against rate * 2**53)."""
    salt = np.uint64(fgram_key((seed, step)))
    h = fmix64(np.asarray(positions).astype(np.uint64) ^ salt)
    return (h >> np.uint64(11)) >= np.uint64(round(rate * 2**53))


@dataclass
class FgramDropout:
    """Wraps a batch transform (the batcher, or its microbatch split) for the training
    stream: adds the batch's `fgram_keep` mask, then transforms."""

    transform: object
    rate: float
    seed: int

    def calibrate(self, batches: Iterable[dict[str, np.ndarray]], headroom: float = 1.05) -> None:
        # sized for every match; a backoff's f-gram can add nodes the full match lacks, which
        # only grows the forest's capacity (a recompile), never changes a result
        self.transform.calibrate(batches, headroom)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keep = keep_mask(batch["positions"], batch["step"], self.rate, self.seed)
        return self.transform({**batch, "fgram_keep": keep})
