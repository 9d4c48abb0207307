"""A batch's f-grams as a prefix forest: one node per distinct prefix (SCONE.md sections 3-4).

The f-gram model is causal with start-aligned positions, so its hidden states at position m
depend only on an f-gram's first m+1 tokens: f-grams sharing a prefix share that computation.
With deduplication each distinct prefix is one node; without it every matched position has its
own chain. Each node carries its token and its path: the nodes of its ancestors and itself
(-1 past its depth).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
            key = (
                tokens[rows, depth]
                if depth == 0
                else node_of_row[rows] * radix + tokens[rows, depth]
            )
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
