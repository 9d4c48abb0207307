"""Brute-force references in plain Python: count everything, filter, sort, match by dict."""

from __future__ import annotations

from collections import Counter


def brute_counts(docs, max_n: int) -> Counter:
    """Every n-gram (2 <= n <= max_n) inside each document, no pruning."""
    c: Counter = Counter()
    for doc in docs:
        d = [int(x) for x in doc]
        for n in range(2, max_n + 1):
            for i in range(len(d) - n + 1):
                c[tuple(d[i : i + n])] += 1
    return c


def brute_select(docs, max_n: int, num: int, min_count: int) -> list[tuple[tuple[int, ...], int]]:
    """The top `num` n-grams with count >= min_count: count desc, shorter first, tokens asc."""
    c = brute_counts(docs, max_n)
    kept = [(g, k) for g, k in c.items() if k >= min_count]
    kept.sort(key=lambda gk: (-gk[1], len(gk[0]), gk[0]))
    return kept[:num]


def brute_tag(docs, fgrams: dict[tuple[int, ...], int], max_n: int):
    """Longest f-gram ending at each token of each document: (ids, lengths), -1/0 if none."""
    ids, lengths = [], []
    for doc in docs:
        d = [int(x) for x in doc]
        for i in range(len(d)):
            best, blen = -1, 0
            for n in range(min(max_n, i + 1), 1, -1):
                hit = fgrams.get(tuple(d[i - n + 1 : i + 1]))
                if hit is not None:
                    best, blen = hit, n
                    break
            ids.append(best)
            lengths.append(blen)
    return ids, lengths
