"""A batch's f-grams as a forest, from per-token tags (fgrams/tag.py), on the host.

Each token of the dataset is tagged once with its longest f-gram match, so a batch's f-grams are
a lookup: `tag_ids[positions]`. Matches may reach back before the window start (the tags were
computed over whole documents) but never across a document boundary. The nodes whose output
some position reads (one per distinct f-gram) are listed per group in `outputs` [G, R], and
`index` [batch, T] points each position into those G * R outputs. Buffers are static: N blocks
and R outputs per group, calibrated on early batches; a batch that needs more gets the next
multiple of `granule` blocks (or `granule` blocks' worth of outputs) that fits (an overflow,
counted in the stats: one recompile per new size, always exact). Sizes depend on the batch
alone, so a resumed run sees the same shapes as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from scone_jax.forest.batch import ForestBatch
from scone_jax.forest.layout import forest_layout, round_up
from scone_jax.forest.prefix import PrefixForest, prefix_forest
from scone_jax.forest.suffixes import suffix_chains


@dataclass
class FgramBatcher:
    tag_ids: np.ndarray  # [num_tokens] longest-match f-gram id per dataset position, -1 = none
    tag_lengths: np.ndarray  # [num_tokens] match length, 0 = none
    fgram_tokens: np.ndarray  # [S, K] token ids, right-padded with -1
    fgram_lengths: np.ndarray  # [S]
    block: int  # slots per attention block (>= K)
    granule: int = 1  # blocks per group grow in multiples of this
    capacity: int = 0  # calibrated blocks per group
    output_capacity: int = 0  # calibrated output slots per group
    dedup: bool = True
    groups: int = 1  # one per data shard of this host's batch
    # [S] the f-gram a position dropped by `fgram_keep` takes instead (-1 = none, the default)
    backoff_ids: np.ndarray | None = None
    # [S] the length of that f-gram (0 = none); by default read from `fgram_lengths`, which a
    # permuted control's rows do not match
    backoff_lengths: np.ndarray | None = None
    # [S] with fgrams.suffix_rows: each f-gram's longest proper suffix in the set (-1 = none);
    # a matched position then reads F of its f-gram and of every f-gram down that chain
    suffix_parent: np.ndarray | None = None

    def __post_init__(self):
        if self.backoff_ids is not None and self.backoff_lengths is None:
            self.backoff_lengths = np.where(
                self.backoff_ids >= 0, self.fgram_lengths[np.maximum(self.backoff_ids, 0)], 0
            )

    @property
    def max_n(self) -> int:
        return self.fgram_tokens.shape[1]

    def chains(self, ids: np.ndarray) -> np.ndarray:
        """Each position's f-gram ids: [B, T] as given, or with `suffix_parent` [B, T, K - 1],
        its f-gram followed by its suffixes in the set, longest first (-1 past the chain's end)."""
        if self.suffix_parent is None:
            return ids
        return suffix_chains(ids, self.suffix_parent, self.max_n - 1)

    def forest(self, ids: np.ndarray) -> tuple[PrefixForest, np.ndarray, np.ndarray]:
        """The batch's forest, its rows (f-gram ids), and each matched position's row."""
        matched = ids[ids >= 0]
        if self.dedup:
            rows, row_of_position = np.unique(matched, return_inverse=True)
        else:
            rows, row_of_position = matched, np.arange(len(matched))
        forest = prefix_forest(
            self.fgram_tokens[rows], self.fgram_lengths[rows], share_prefixes=self.dedup
        )
        return forest, rows, row_of_position.reshape(-1)

    def calibrate(self, batches: Iterable[dict[str, np.ndarray]], headroom: float = 1.05) -> None:
        """Set the blocks and output slots per group from sample batches (the largest seen, plus
        headroom); a capacity already set (`fgrams.capacity`) is kept."""
        layouts = [
            forest_layout(
                self.forest(self.chains(np.asarray(self.tag_ids[b["positions"]])))[0],
                self.groups,
                self.block,
            )
            for b in batches
        ]
        if not self.capacity:
            self.capacity = round_up(
                max(int(max((x.need for x in layouts), default=0) * headroom), 1), self.granule
            )
        peak_outputs = max((x.need_outputs for x in layouts), default=0)
        self.output_capacity = round_up(
            max(int(peak_outputs * headroom), 1), self.granule * self.block
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add `forest` (a ForestBatch) and the host-only `fgram_ids` and `fgram_stats`.
        Positions where the batch's `fgram_keep` mask (if any) is False take their f-gram's
        backoff (`backoff_ids`), or count as unmatched."""
        ids = np.asarray(self.tag_ids[batch["positions"]], dtype=np.int64)
        lengths = np.asarray(self.tag_lengths[batch["positions"]])
        if "fgram_keep" in batch:
            dropped = ~np.asarray(batch["fgram_keep"], bool) & (ids >= 0)
            if self.backoff_ids is None:
                ids = np.where(dropped, -1, ids)
            else:
                tags = np.maximum(ids, 0)
                ids = np.where(dropped, self.backoff_ids[tags], ids)
                lengths = np.where(dropped, self.backoff_lengths[tags], lengths)
        matched = ids >= 0
        links = self.chains(ids)
        forest, rows, row_of_position = self.forest(links)
        layout = forest_layout(
            forest, self.groups, self.block, self.granule, self.capacity, self.output_capacity
        )
        index = np.full(links.shape, -1, np.int32)
        index[links >= 0] = layout.output[row_of_position]
        n_matched = int(matched.sum())
        # without suffix rows the deduplicated forest's rows are the distinct matches: no np.unique
        plain_rows = self.dedup and self.suffix_parent is None
        distinct = len(rows) if plain_rows else len(np.unique(ids[matched]))
        out = dict(batch)
        out["forest"] = ForestBatch(index, layout.tokens, layout.paths, layout.outputs)
        out["fgram_ids"] = ids.astype(np.int32)  # host-side only: what serving looks up
        out["fgram_stats"] = {
            "match_rate": n_matched / ids.size,
            "distinct_ratio": distinct / n_matched if n_matched else 0.0,
            "mean_match_length": float(lengths[matched].mean()) if n_matched else 0.0,
            "fgram_nodes": len(forest.tokens),
            "fgram_positions": int(layout.tokens.size),
            "fgram_outputs": int(layout.outputs.size),
            "fgram_overflow": int(
                layout.need > self.capacity or layout.need_outputs > self.output_capacity
            ),
        }
        return out
