"""The prefix forest in static device buffers of blocks that attention never leaves.

Nodes are laid out depth-first in blocks of B slots (`tokens` [G, N, B], `paths` [G, N, B, K] as
slots within the block): small trees (a first token's nodes) packed together, larger ones cut
into pieces that start with copies of their first node's ancestors, so every path stays inside
its block and the f-gram model runs each block as a short sequence with an ancestry mask
(model/fgram_model.py): dense, gather-free attention. Blocks are dealt round-robin to G groups,
one per data shard of the host, so attention never leaves a shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scone_jax.forest.prefix import PrefixForest, preorder


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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


def grow_blocks(
    tokens: np.ndarray, paths: np.ndarray, blocks: int
) -> tuple[np.ndarray, np.ndarray]:
    """Node buffers [G, N, B] / [G, N, B, K] grown to `blocks` blocks per group, padding blocks
    added after each group's own, so its slots keep their numbers."""
    groups, have, block, k = paths.shape
    grown_tokens, grown_paths = empty_buffers(groups, blocks, block, k)
    grown_tokens[:, :have] = tokens
    grown_paths[:, :have] = paths
    return grown_tokens, grown_paths


def chunk_trees(
    order: np.ndarray, forest: PrefixForest, block: int, per_tree: bool
) -> tuple[np.ndarray, np.ndarray]:
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
        tree_end = np.repeat(
            np.append(tree_starts[1:], n), np.diff(np.append(tree_starts, n))
        ).tolist()
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


def forest_layout(
    forest: PrefixForest,
    groups: int,
    block: int,
    granule: int = 1,
    min_blocks: int = 0,
    min_outputs: int = 0,
) -> ForestLayout:
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
    chunk_block, chunk_offset, num_blocks = pack_chunks(
        np.diff(np.append(starts, n)) + copies, block
    )
    stream_starts, stream_copies = chunk_trees(order, forest, block, per_tree=False)
    if len(stream_starts) < num_blocks:  # one stream of full blocks: chunk c is block c
        starts, copies, num_blocks = stream_starts, stream_copies, len(stream_starts)
        chunk_block, chunk_offset = np.arange(num_blocks), np.zeros(num_blocks, np.int64)
    need = -(-num_blocks // groups)
    blocks = max(min_blocks, round_up(max(need, 1), granule))
    block_base = (
        chunk_block % groups * blocks + chunk_block // groups
    ) * block  # block b: group b % G
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    chunk_of = np.searchsorted(starts, pos, side="right") - 1  # per node
    within = (
        chunk_offset[chunk_of] + copies[chunk_of] + pos - starts[chunk_of]
    )  # slot within the block
    slot = block_base[chunk_of] + within
    tokens, paths = empty_buffers(groups, blocks, block, k)
    flat_tokens, flat_paths = tokens.reshape(-1), paths.reshape(-1, k)
    flat_tokens[slot] = forest.tokens
    ancestors = np.maximum(forest.paths, 0)
    in_chunk = (
        pos[ancestors] >= starts[chunk_of][:, None]
    )  # else: a copy, at its depth past the offset
    local = np.where(in_chunk, within[ancestors], chunk_offset[chunk_of][:, None] + np.arange(k))
    flat_paths[slot] = np.where(forest.paths >= 0, local, -1)
    # the copies: chunk c's first `copies[c]` slots hold its first node's ancestors
    copy_chunk = np.repeat(np.arange(len(starts)), copies)
    copy_depth = np.arange(len(copy_chunk)) - np.repeat(np.cumsum(copies) - copies, copies)
    original = forest.paths[order[starts[copy_chunk]], copy_depth]
    copy_slot = block_base[copy_chunk] + chunk_offset[copy_chunk] + copy_depth
    flat_tokens[copy_slot] = forest.tokens[original]
    flat_paths[copy_slot] = np.where(
        np.arange(k) <= copy_depth[:, None], chunk_offset[copy_chunk][:, None] + np.arange(k), -1
    )
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
