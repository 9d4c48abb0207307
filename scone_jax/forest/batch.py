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
    `outputs` [G, R]."""

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
        of a job uses the same shapes), `index` re-pointed into the new outputs."""
        nodes, paths = grow_blocks(self.nodes, self.paths, blocks)
        groups, have_outputs = self.outputs.shape
        slots = np.zeros((groups, outputs), np.int32)
        slots[:, :have_outputs] = self.outputs
        moved = self.index // have_outputs * outputs + self.index % have_outputs
        return ForestBatch(
            np.where(self.index >= 0, moved, -1).astype(np.int32), nodes, paths, slots
        )

    def on_global_outputs(self, process_index: int) -> ForestBatch:
        """Host-local output slots -> slots of the global outputs, the hosts' buffers (each padded
        to the same size) stacked in process order."""
        index = np.where(
            self.index >= 0, self.index + process_index * self.outputs.size, -1
        ).astype(np.int32)
        return ForestBatch(index, self.nodes, self.paths, self.outputs)
