"""The SCONE input layer at inference: host-side longest match, a (deduplicated) row gather
from the table tier, and the lookup-and-add inside the model's jitted step.

In every combine mode the exported row is what to add to T(s_i) (in replace mode it holds
F(w) - T(last token of w), in gated mode F's gated output), and unmatched positions add zero
(SCONE.md section 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from scone_jax.data.pipeline import prefetch
from scone_jax.fgrams.tag import DecodeTagger
from scone_jax.serve.tables import DeviceTable, Table


def add_table_rows(x: jax.Array, fgram_index: jax.Array, rows: jax.Array) -> jax.Array:
    """x [B, T, d] + rows[fgram_index] where fgram_index >= 0 (inside jit)."""
    gathered = jnp.take(rows, jnp.maximum(fgram_index, 0), axis=0).astype(x.dtype)
    return x + jnp.where((fgram_index >= 0)[..., None], gathered, jnp.zeros_like(gathered))


@dataclass
class TableLookup:
    """Turns f-gram ids [B, T] into what the jitted input layer takes.

    Host and disk tiers send the batch's distinct rows ([U, d], U rounded up to `granule`
    so shapes repeat) and an index into them; the device tier sends row ids instead and
    gathers from its resident table inside jit. A decode step (`decoder`) sends one row per
    sequence instead, in sequence order (zero where there is no match; the device tier sends
    the ids).
    """

    table: Table
    granule: int = 64

    def prepare(self, fgram_ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(fgram_ids, np.int64)
        matched = ids >= 0
        unique, inverse = np.unique(ids[matched], return_inverse=True)
        size = -(-max(len(unique), 1) // self.granule) * self.granule
        index = np.full(ids.shape, -1, np.int32)
        index[matched] = inverse
        if isinstance(self.table, DeviceTable):
            row_ids = np.zeros(size, np.int32)
            row_ids[: len(unique)] = unique
            return {"fgram_index": index, "fgram_row_ids": row_ids}
        rows = np.zeros((size, self.table.width), np.float32)
        rows[: len(unique)] = self.table.gather(unique)
        return {"fgram_index": index, "fgram_rows": rows}

    def decoder(self, prompts: list[np.ndarray]) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
        """For a decode loop: new tokens [B] -> what the next step adds for them (`add_rows`),
        keeping each row's match state from its prompt on.

        This runs between two device steps with cold caches, where every numpy call costs
        several microseconds, so it makes the fewest: one `DecodeTagger.push` for all rows (O(K)
        scalar probes each; measured against the stateless numpy `match_batch` at batch 1 and
        16), ids kept in a Python list, rows sent as stored (bfloat16 or int8 and its scales;
        converted inside the step) and not deduplicated ([B] is a fixed shape; a repeated row
        costs a copy, not a fetch); zero rows where there is no match. The device tier sends
        the ids instead.
        """
        tagger = DecodeTagger(self.table.fgram_set, prompts)
        table, on_device = self.table, isinstance(self.table, DeviceTable)

        def step(new: np.ndarray) -> dict[str, np.ndarray]:
            ids = tagger.push(new.tolist())
            if on_device:
                return {"fgram_step_ids": np.array(ids, np.int32)}
            rows, scales = table.gather_stored([max(i, 0) for i in ids])
            if min(ids) < 0:
                rows[[b for b, i in enumerate(ids) if i < 0]] = 0
            return (
                {"fgram_step_rows": rows}
                if scales is None
                else {"fgram_step_rows": rows, "fgram_step_scales": scales}
            )

        return step

    def rows_on_device(self, prepared: dict[str, jax.Array]) -> jax.Array:
        """Inside jit: the [U, d] rows the index points into."""
        if "fgram_row_ids" in prepared:
            return jnp.take(self.table.device_rows, prepared["fgram_row_ids"], axis=0)
        return prepared["fgram_rows"]

    def add_rows(self, x: jax.Array, prepared: dict[str, jax.Array]) -> jax.Array:
        """Inside jit: x [B, T, d] plus the table's row at each matched position."""
        if "fgram_step_rows" in prepared:  # a decode step: row b is sequence b's, as stored
            rows = prepared["fgram_step_rows"].astype(jnp.float32)
            if (
                "fgram_step_scales" in prepared
            ):  # int8: dequantized as `table_store.dequantize` does
                rows = rows * prepared["fgram_step_scales"][:, None]
            return x + rows[:, None, :].astype(x.dtype)
        if "fgram_step_ids" in prepared:  # the same from the device tier's table
            ids = prepared["fgram_step_ids"]
            index = jnp.where(ids >= 0, jnp.arange(ids.shape[0], dtype=jnp.int32), -1)[:, None]
            return add_table_rows(
                x, index, jnp.take(self.table.device_rows, jnp.maximum(ids, 0), axis=0)
            )
        return add_table_rows(x, prepared["fgram_index"], self.rows_on_device(prepared))


def prefetch_prepared(items: Iterable, prepare: Callable, depth: int = 2) -> Iterator:
    """(item, prepare(item) already on the device) for each item, `depth` items ahead, so host
    lookups and transfers overlap the device's work on the current batch."""
    return prefetch(items, lambda item: (item, jax.device_put(prepare(item))), depth)
