"""What a SCONE batch sends to the device for the f-gram model, apart from host-only fields
(the f-gram ids serving looks up, the stats the loop logs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scone_jax.forest.layout import grow_blocks


@dataclass(frozen=True)
class ForestBatch:
    """The forest's buffers (forest/layout.py) and each position's output: `index` [B, T] points
    into the G * R outputs (-1 = no match); `nodes` [G, N, B], `paths` [G, N, B, K],
    `outputs` [G, R]. With microbatches the buffers gain a leading axis [M, ...], one forest
    per microbatch, and a row's index points into its own microbatch's outputs."""

    index: np.ndarray
    nodes: np.ndarray
    paths: np.ndarray
    outputs: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """The buffers under the f-gram model's argument names (and the batch shardings' keys)."""
        return {
            "fgram_index": self.index,
            "fgram_nodes": self.nodes,
            "fgram_paths": self.paths,
            "fgram_outputs": self.outputs,
        }

    def padded(self, blocks: int, outputs: int) -> ForestBatch:
        """Each group's buffers grown to `blocks` blocks and `outputs` output slots (so every host
        of a job, or every microbatch of a batch, uses the same shapes), `index` re-pointed into
        the new outputs. Buffers may carry a leading microbatch axis (forest/microbatch.py)."""
        if self.nodes.ndim == 4:  # [M, G, N, B]: each microbatch's own forest
            grown = [grow_blocks(n, p, blocks) for n, p in zip(self.nodes, self.paths)]
            nodes, paths = np.stack([g[0] for g in grown]), np.stack([g[1] for g in grown])
        else:
            nodes, paths = grow_blocks(self.nodes, self.paths, blocks)
        have_outputs = self.outputs.shape[-1]
        slots = np.zeros((*self.outputs.shape[:-1], outputs), np.int32)
        slots[..., :have_outputs] = self.outputs
        moved = self.index // have_outputs * outputs + self.index % have_outputs
        return ForestBatch(
            np.where(self.index >= 0, moved, -1).astype(np.int32), nodes, paths, slots
        )

    def on_global_outputs(self, process_index: int) -> ForestBatch:
        """Host-local output slots -> slots of the global outputs, the hosts' buffers (each padded
        to the same size) stacked in process order (per microbatch, when there are several)."""
        per_forest = self.outputs.shape[-2] * self.outputs.shape[-1]
        index = np.where(self.index >= 0, self.index + process_index * per_forest, -1).astype(
            np.int32
        )
        return ForestBatch(index, self.nodes, self.paths, self.outputs)
