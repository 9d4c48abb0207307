"""Attach what the f-gram model needs to each batch, on the host (SCONE.md sections 3-4).

Each token of the dataset is tagged once with its longest f-gram match (fgrams/tag.py), so a
batch's f-grams are a lookup: `tag_ids[positions]`. Matches may reach back before the window
start (the tags were computed over whole documents) but never across a document boundary.

The f-gram model is causal with start-aligned positions, so its hidden states at position m
depend only on an f-gram's first m+1 tokens: f-grams sharing a prefix share that computation.
The batcher therefore sends the batch's f-grams as a prefix forest: one node per distinct
prefix (with deduplication; without it every matched position has its own chain), each node
carrying its token and its path, the slots of its ancestors and itself (-1 past its depth).
Nodes are laid out depth-first in blocks of B slots (`fgram_nodes` [G, N, B], `fgram_paths`
[G, N, B, K] as slots within the block): small trees (a first token's nodes) packed together,
larger ones cut into pieces that start with copies of their first node's ancestors, so every
path stays inside its block and the f-gram model runs each block as a short sequence with an
ancestry mask (model/fgram_model.py): dense, gather-free attention.
The nodes whose output some position reads (one per distinct f-gram) are listed per group in
`fgram_outputs` [G, R], and `fgram_index` [batch, T] points each position into those G * R
outputs (-1 = no match). Blocks are dealt round-robin to G groups, one per data shard of the
host, so attention never leaves a shard. Buffers are static: N blocks and R outputs per group,
calibrated on early batches; a batch that needs more gets the next multiple of `granule`
blocks (or `granule` blocks' worth of outputs) that fits (an overflow, counted in the stats:
one recompile per new size, always exact). Sizes depend on the batch alone, so a
resumed run sees the same shapes as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scone_jax.config.schema import FgramConfig
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.errors import UserError
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tags_for_dataset


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class PrefixForest:
    """f-grams as prefix nodes: `tokens` [N], `paths` [N, K] (node ids of the ancestors at
    depths 0..m and the node itself at m, -1 after), and `node_of_row` [R], each f-gram's node."""

    tokens: np.ndarray
    paths: np.ndarray
    node_of_row: np.ndarray


def prefix_forest(tokens: np.ndarray, lengths: np.ndarray, share_prefixes: bool) -> PrefixForest:
    """The forest of f-gram rows [R, K] (right-padded) of `lengths` [R]. With `share_prefixes`
    equal prefixes are one node (a trie per first token); else each row is its own chain."""
    rows_total, k = tokens.shape
    node_of_row = np.full(rows_total, -1, np.int64)
    radix = int(tokens.max()) + 1 if rows_total else 1
    node_tokens, paths = [], []
    count = 0
    for depth in range(k):
        rows = np.flatnonzero(lengths > depth)
        if not len(rows):
            break
        if share_prefixes:
            key = tokens[rows, depth] if depth == 0 else node_of_row[rows] * radix + tokens[rows, depth]
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        else:
            first = inverse = np.arange(len(rows))
        new = rows[first]  # one representative row per new node
        path = np.full((len(new), k), -1, np.int64)
        if depth:
            path[:, :depth] = np.concatenate(paths)[node_of_row[new], :depth]  # the parent's path
        path[:, depth] = count + np.arange(len(new))
        node_tokens.append(tokens[new, depth])
        paths.append(path)
        node_of_row[rows] = count + inverse.reshape(-1)
        count += len(new)
    if not count:
        return PrefixForest(np.zeros(0, np.int64), np.zeros((0, k), np.int64), node_of_row)
    return PrefixForest(np.concatenate(node_tokens), np.concatenate(paths), node_of_row)


def preorder(paths: np.ndarray) -> np.ndarray:
    """The forest's nodes in depth-first order: each node after its ancestors, each subtree
    contiguous (paths sorted lexicographically, -1 before any node id)."""
    return np.lexsort(paths.T[::-1]) if len(paths) else np.zeros(0, np.int64)


@dataclass
class ForestLayout:
    """A forest in static device buffers of blocks: `tokens` [G, N, B], `paths` [G, N, B, K] as
    slots within the block, `outputs` [G, R], the slots (within the group's N * B) of the
    nodes whose output is read, and `output` [rows], each row's place in the flattened
    [G * R] outputs. `need` and `need_outputs` are the fullest group's counts (N and R are
    those, rounded up, or more)."""

    tokens: np.ndarray
    paths: np.ndarray
    outputs: np.ndarray
    output: np.ndarray
    need: int
    need_outputs: int


def empty_buffers(groups: int, blocks: int, block: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Node buffers of padding slots only: each a one-token f-gram of token 0 (its own path)."""
    tokens = np.zeros((groups, blocks, block), np.int32)
    paths = np.full((groups, blocks, block, k), -1, np.int32)
    paths[..., 0] = np.arange(block)
    return tokens, paths


def grow_blocks(tokens: np.ndarray, paths: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Node buffers [G, N, B] / [G, N, B, K] grown to `blocks` blocks per group, padding blocks
    added after each group's own, so its slots keep their numbers."""
    groups, have, block, k = paths.shape
    grown_tokens, grown_paths = empty_buffers(groups, blocks, block, k)
    grown_tokens[:, :have] = tokens
    grown_paths[:, :have] = paths
    return grown_tokens, grown_paths


def chunk_trees(order: np.ndarray, forest: PrefixForest, block: int, per_tree: bool) -> tuple[np.ndarray, np.ndarray]:
    """Cut the depth-first node order into chunks that each fit a block, greedily: a chunk that
    starts at a node of depth d leaves d slots for that node's ancestors (copied). With
    `per_tree`, chunks never span two trees (first tokens), so a tree of at most `block` nodes
    is one chunk without copies; else the whole order is cut into full blocks. -> each chunk's
    first position in `order`, and its copies."""
    n = len(order)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    depth = ((forest.paths[order] >= 0).sum(1) - 1).tolist()  # Python ints: the loop is sequential
    if per_tree:
        tree_starts = np.flatnonzero(np.diff(forest.paths[order, 0], prepend=-1))
        tree_end = np.repeat(np.append(tree_starts[1:], n), np.diff(np.append(tree_starts, n))).tolist()
    else:
        tree_end = [n] * n
    starts, copies = [], []
    i = 0
    while i < n:  # one iteration per chunk
        d = depth[i]
        starts.append(i)
        copies.append(d)
        i = min(i + block - d, tree_end[i])
    return np.asarray(starts, np.int64), np.asarray(copies, np.int64)


def pack_chunks(sizes: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing: each chunk (`sizes` slots, at most `block`) goes into the open block
    with the least room that holds it, largest chunks first. -> each chunk's block and its
    offset in that block, and the block count. Open blocks are kept in one stack per free
    room, with a bitmask of the non-empty stacks: O(1) per chunk."""
    chunk_block = np.empty(len(sizes), np.int64)
    chunk_offset = np.empty(len(sizes), np.int64)
    by_room: list[list[int]] = [[] for _ in range(block + 1)]
    nonempty, blocks = 0, 0
    for c in np.argsort(-sizes, kind="stable").tolist():
        size = int(sizes[c])
        fits = nonempty >> size
        if fits:
            room = size + (fits & -fits).bit_length() - 1
            b = by_room[room].pop()
            if not by_room[room]:
                nonempty &= ~(1 << room)
        else:
            room, b, blocks = block, blocks, blocks + 1
        chunk_block[c], chunk_offset[c] = b, block - room
        if room > size:
            by_room[room - size].append(b)
            nonempty |= 1 << (room - size)
    return chunk_block, chunk_offset, blocks


def forest_layout(forest: PrefixForest, groups: int, block: int, granule: int = 1,
                  min_blocks: int = 0, min_outputs: int = 0) -> ForestLayout:
    """Lay the forest out in blocks of `block` slots that attention never leaves.

    Nodes are cut into chunks in depth-first order (`chunk_trees`), so a chunk's nodes find their
    ancestors in the chunk, except the ancestors of its first node: those are copied to the
    chunk's first slots (slot = chunk offset + depth; a copy computes the same state as its
    original, since a node depends on its path alone). Cut per tree, small trees share blocks
    without copies (`pack_chunks`; the common case in text); where cutting the whole order into
    full blocks needs fewer blocks (mostly trees larger than a block), that cut is used. Blocks
    are dealt round-robin to `groups` groups of N blocks: the fullest group's count rounded up to
    `granule`, and at least `min_blocks` (a calibrated capacity). Padding slots are a one-token
    f-gram of token 0 whose output nobody reads. The rows' nodes (distinct: each row is a
    different f-gram) are each group's outputs, R of them: the fullest group's count rounded up
    to `granule` blocks' worth, and at least `min_outputs`."""
    n, k = forest.paths.shape
    if block < k:
        raise ValueError(f"block={block} slots cannot hold an f-gram of {k} tokens")
    order = preorder(forest.paths)
    starts, copies = chunk_trees(order, forest, block, per_tree=True)
    chunk_block, chunk_offset, num_blocks = pack_chunks(np.diff(np.append(starts, n)) + copies, block)
    stream_starts, stream_copies = chunk_trees(order, forest, block, per_tree=False)
    if len(stream_starts) < num_blocks:  # one stream of full blocks: chunk c is block c
        starts, copies, num_blocks = stream_starts, stream_copies, len(stream_starts)
        chunk_block, chunk_offset = np.arange(num_blocks), np.zeros(num_blocks, np.int64)
    need = -(-num_blocks // groups)
    blocks = max(min_blocks, round_up(max(need, 1), granule))
    block_base = (chunk_block % groups * blocks + chunk_block // groups) * block  # block b: group b % G
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    chunk_of = np.searchsorted(starts, pos, side="right") - 1  # per node
    within = chunk_offset[chunk_of] + copies[chunk_of] + pos - starts[chunk_of]  # slot within the block
    slot = block_base[chunk_of] + within
    tokens, paths = empty_buffers(groups, blocks, block, k)
    flat_tokens, flat_paths = tokens.reshape(-1), paths.reshape(-1, k)
    flat_tokens[slot] = forest.tokens
    ancestors = np.maximum(forest.paths, 0)
    in_chunk = pos[ancestors] >= starts[chunk_of][:, None]  # else: a copy, at its depth past the offset
    local = np.where(in_chunk, within[ancestors], chunk_offset[chunk_of][:, None] + np.arange(k))
    flat_paths[slot] = np.where(forest.paths >= 0, local, -1)
    # the copies: chunk c's first `copies[c]` slots hold its first node's ancestors
    copy_chunk = np.repeat(np.arange(len(starts)), copies)
    copy_depth = np.arange(len(copy_chunk)) - np.repeat(np.cumsum(copies) - copies, copies)
    original = forest.paths[order[starts[copy_chunk]], copy_depth]
    copy_slot = block_base[copy_chunk] + chunk_offset[copy_chunk] + copy_depth
    flat_tokens[copy_slot] = forest.tokens[original]
    flat_paths[copy_slot] = np.where(np.arange(k) <= copy_depth[:, None],
                                     chunk_offset[copy_chunk][:, None] + np.arange(k), -1)
    # outputs: each row's node, grouped by its block's group, in slot order
    row_slot = slot[forest.node_of_row]
    row_group = row_slot // (blocks * block)
    counts = np.bincount(row_group, minlength=groups)
    need_outputs = int(counts.max()) if len(row_slot) else 0
    width = max(min_outputs, round_up(max(need_outputs, 1), granule * block))
    order = np.argsort(row_slot, kind="stable")
    rank = np.empty(len(row_slot), np.int64)
    rank[order] = np.arange(len(row_slot)) - (np.cumsum(counts) - counts)[row_group[order]]
    outputs = np.zeros((groups, width), np.int32)
    outputs[row_group, rank] = row_slot - row_group * (blocks * block)
    return ForestLayout(tokens, paths, outputs, row_group * width + rank, need, need_outputs)


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

    @property
    def max_n(self) -> int:
        return self.fgram_tokens.shape[1]

    def forest(self, ids: np.ndarray) -> tuple[PrefixForest, np.ndarray, np.ndarray]:
        """The batch's forest, its rows (f-gram ids), and each matched position's row."""
        matched = ids[ids >= 0]
        if self.dedup:
            rows, row_of_position = np.unique(matched, return_inverse=True)
        else:
            rows, row_of_position = matched, np.arange(len(matched))
        forest = prefix_forest(self.fgram_tokens[rows], self.fgram_lengths[rows], share_prefixes=self.dedup)
        return forest, rows, row_of_position.reshape(-1)

    def calibrate(self, batches: Iterable[dict[str, np.ndarray]], headroom: float = 1.05) -> None:
        """Set the blocks and output slots per group from sample batches (the largest seen, plus
        headroom); a capacity already set (`fgrams.capacity`) is kept."""
        layouts = [forest_layout(self.forest(np.asarray(self.tag_ids[b["positions"]]))[0], self.groups, self.block)
                   for b in batches]
        if not self.capacity:
            self.capacity = round_up(max(int(max((x.need for x in layouts), default=0) * headroom), 1), self.granule)
        peak_outputs = max((x.need_outputs for x in layouts), default=0)
        self.output_capacity = round_up(max(int(peak_outputs * headroom), 1), self.granule * self.block)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add `fgram_index` [B, T], the forest's buffers `fgram_nodes`/`fgram_paths`/`fgram_outputs`,
        and `fgram_stats`."""
        ids = np.asarray(self.tag_ids[batch["positions"]], dtype=np.int64)
        matched = ids >= 0
        forest, rows, row_of_position = self.forest(ids)
        layout = forest_layout(forest, self.groups, self.block, self.granule, self.capacity, self.output_capacity)
        index = np.full(ids.shape, -1, np.int32)
        index[matched] = layout.output[row_of_position]
        n_matched = int(matched.sum())
        out = dict(batch)
        out.update(fgram_index=index, fgram_nodes=layout.tokens, fgram_paths=layout.paths,
                   fgram_outputs=layout.outputs)
        out["fgram_ids"] = ids.astype(np.int32)  # host-side only: what serving looks up
        out["fgram_stats"] = {
            "match_rate": n_matched / ids.size,
            "distinct_ratio": (len(rows) if self.dedup else len(np.unique(rows))) / n_matched if n_matched else 0.0,
            "mean_match_length": float(np.asarray(self.tag_lengths[batch["positions"]])[matched].mean())
            if n_matched else 0.0,
            "fgram_nodes": len(forest.tokens),
            "fgram_positions": int(layout.tokens.size),
            "fgram_outputs": int(layout.outputs.size),
            "fgram_overflow": int(layout.need > self.capacity or layout.need_outputs > self.output_capacity),
        }
        return out


def pad_buffers(batch: dict[str, np.ndarray], blocks: int, outputs: int) -> dict[str, np.ndarray]:
    """Grow each group's buffers to `blocks` blocks and `outputs` output slots (so every host of
    a job uses the same shapes), re-pointing `fgram_index` into the new outputs."""
    tokens, paths = grow_blocks(batch["fgram_nodes"], batch["fgram_paths"], blocks)
    groups, have_outputs = batch["fgram_outputs"].shape
    slots = np.zeros((groups, outputs), np.int32)
    slots[:, :have_outputs] = batch["fgram_outputs"]
    index = batch["fgram_index"]
    moved = index // have_outputs * outputs + index % have_outputs
    return {**batch, "fgram_nodes": tokens, "fgram_paths": paths, "fgram_outputs": slots,
            "fgram_index": np.where(index >= 0, moved, -1).astype(np.int32)}


@dataclass
class FgramInputs:
    """A run's f-gram set and the batcher that feeds its tags to the model."""

    fgram_set: FgramSet
    batcher: FgramBatcher

    def batcher_for(self, dataset: TokenizedDataset, progress: bool = True) -> FgramBatcher:
        """The same buffers for another dataset (an extra eval set), tagged with this set."""
        ids, lengths = tags_for_dataset(dataset, self.fgram_set, progress=progress)
        return replace(self.batcher, tag_ids=ids, tag_lengths=lengths)


def train_split_corpus(dataset: TokenizedDataset, train_ids: np.ndarray) -> Corpus:
    """The training documents only: held-out text must not choose the f-grams."""
    lengths = dataset.doc_lengths[train_ids]
    tokens = np.concatenate([dataset.doc(i) for i in train_ids]) if len(train_ids) else np.zeros(0, np.int64)
    return Corpus.from_arrays(tokens, lengths, vocab_size=dataset.vocab_size,
                              source=f"{dataset.path} (training split)",
                              tokenizer_sha256=dataset.tokenizer_sha256)


def load_or_build_fgram_set(cfg: FgramConfig, dataset: TokenizedDataset, train_ids: np.ndarray,
                            run_dir: str | Path, progress: bool = True) -> FgramSet:
    """`fgrams.fgram_set` if given (checked against the tokenizer and K), else RUN_DIR/fgrams,
    counted on the training split on first use."""
    if cfg.fgram_set:
        fgram_set = FgramSet.load(cfg.fgram_set)
    else:
        out = Path(run_dir) / "fgrams"
        if not (out / "meta.json").is_file():
            build_fgram_set(train_split_corpus(dataset, train_ids), out, max_n=cfg.max_n,
                            num_fgrams=cfg.num_fgrams, min_count=cfg.min_count, progress=progress)
        fgram_set = FgramSet.load(out)
    if fgram_set.max_n != cfg.max_n:
        raise UserError(f"f-gram set {fgram_set.path} has K={fgram_set.max_n}, but fgrams.max_n={cfg.max_n}")
    if fgram_set.tokenizer_sha256 and fgram_set.tokenizer_sha256 != dataset.tokenizer_sha256:
        raise UserError(f"f-gram set {fgram_set.path} was built with tokenizer {fgram_set.tokenizer_sha256[:12]}, "
                        f"but the dataset uses {dataset.tokenizer_sha256[:12]}")
    return fgram_set


PERMUTE_ROWS_SEED = 20250203  # the fixed permutation of the fgrams.permute_rows control


def prepare_fgram_inputs(cfg: FgramConfig, dataset: TokenizedDataset, train_ids: np.ndarray,
                         run_dir: str | Path, positions_per_host: int, groups: int,
                         progress: bool = True, process_index: int = 0, process_count: int = 1,
                         barrier=None) -> FgramInputs:
    """The run's f-gram set, the dataset's tags (each of `process_count` processes tagging its
    share, see `tags_for_dataset`), and a batcher with `groups` node buffers (the host's data
    shards) that grow in steps of about 1/32 of a group's positions."""
    fgram_set = load_or_build_fgram_set(cfg, dataset, train_ids, run_dir, progress)
    ids, lengths = tags_for_dataset(dataset, fgram_set, progress=progress, process_index=process_index,
                                    process_count=process_count, barrier=barrier)
    granule = max(positions_per_host // (32 * groups * cfg.block_size), 1)
    fgram_tokens, fgram_lengths = fgram_set.tokens, fgram_set.lengths
    if cfg.permute_rows:  # the control: f-gram w is embedded as the f-gram a fixed permutation gives it
        order = np.random.default_rng(PERMUTE_ROWS_SEED).permutation(len(fgram_lengths))
        fgram_tokens, fgram_lengths = np.asarray(fgram_tokens)[order], np.asarray(fgram_lengths)[order]
    batcher = FgramBatcher(ids, lengths, fgram_tokens, fgram_lengths, block=cfg.block_size,
                           granule=granule, dedup=cfg.dedup, groups=groups,
                           capacity=round_up(-(-cfg.capacity // cfg.block_size), granule))
    return FgramInputs(fgram_set=fgram_set, batcher=batcher)


def global_fgram_index(index: np.ndarray, outputs_per_host: int, process_index: int) -> np.ndarray:
    """Host-local output slots -> slots of the global outputs, the hosts' buffers (each padded
    to the same size) stacked in process order."""
    return np.where(index >= 0, index + process_index * outputs_per_host, -1).astype(np.int32)
