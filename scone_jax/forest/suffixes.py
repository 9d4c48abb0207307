"""Suffix rows (`fgrams.suffix_rows`): a matched f-gram's embedding is the sum of F over the
f-gram and each of its proper suffixes in the set, so training and export both need each
f-gram's chain of suffixes: its longest suffix in the set, that one's, and so on."""

from __future__ import annotations

import numpy as np


def suffix_chains(ids: np.ndarray, parent: np.ndarray, links: int) -> np.ndarray:
    """ids [...] (-1 = none) -> [..., links]: each id, then its suffixes in the set longest
    first (`parent`: [S] each f-gram's longest proper suffix in the set, -1 = none), -1 past
    the chain's end. An f-gram of K tokens has at most K - 2 suffixes of 2 tokens or more, so
    `links` = K - 1 holds every chain."""
    chain = [np.asarray(ids)]
    for _ in range(links - 1):
        chain.append(np.where(chain[-1] >= 0, parent[np.maximum(chain[-1], 0)], -1))
    return np.stack(chain, axis=-1)
