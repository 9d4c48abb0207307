"""Gradient accumulation for SCONE: one prefix forest per microbatch, so the f-gram model's
buffers (and its activations) shrink with the microbatch like the backbone's.

Microbatch m of a host's batch is its rows m, m + M, m + 2M, ...: with M dividing every data
shard's rows, each microbatch is spread evenly over the shards and splitting it out of the
global batch is a local reshape (`microbatch_rows` in train/step.py). The data order, and so an
exact resume, is the batch's: only the f-gram buffers are laid out per microbatch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from scone_jax.forest.batch import ForestBatch
from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.stats import combine_stats


@dataclass
class MicrobatchForests:
    """A batch's forests, one per microbatch, padded to one size and stacked [M, ...]."""

    batcher: FgramBatcher
    microbatches: int

    def parts(self, batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        keys = [k for k in ("positions", "fgram_keep") if k in batch]
        return [
            {k: batch[k][m :: self.microbatches] for k in keys} for m in range(self.microbatches)
        ]

    def calibrate(self, batches: Iterable[dict[str, np.ndarray]], headroom: float = 1.05) -> None:
        """Buffers sized for a microbatch (the batcher's calibration on every sample's parts)."""
        self.batcher.calibrate((part for b in batches for part in self.parts(b)), headroom)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        parts = [self.batcher(part) for part in self.parts(batch)]
        blocks = max(p["forest"].nodes.shape[1] for p in parts)
        outputs = max(p["forest"].outputs.shape[1] for p in parts)
        forests = [p["forest"].padded(blocks, outputs) for p in parts]
        index = np.empty(  # [B, T], or [B, T, links] with suffix rows
            batch["positions"].shape + forests[0].index.shape[2:], np.int32
        )
        ids = np.empty(batch["positions"].shape, np.int32)
        for m, (part, forest) in enumerate(zip(parts, forests)):
            index[m :: self.microbatches] = forest.index
            ids[m :: self.microbatches] = part["fgram_ids"]
        stacked = ForestBatch(
            index,
            np.stack([f.nodes for f in forests]),
            np.stack([f.paths for f in forests]),
            np.stack([f.outputs for f in forests]),
        )
        out = dict(batch)
        out["forest"] = stacked
        out["fgram_ids"] = ids
        out["fgram_stats"] = {
            **combine_stats(
                [p["fgram_stats"] for p in parts],
                [p["fgram_ids"].size for p in parts],
                [int((p["fgram_ids"] >= 0).sum()) for p in parts],
            ),
            # the stacked buffers' slots: each part padded to the largest
            "fgram_positions": int(stacked.nodes.size),
            "fgram_outputs": int(stacked.outputs.size),
        }
        return out
