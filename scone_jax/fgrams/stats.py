"""What an f-gram set looks like and how much of a corpus it covers: printed, JSON, PNG."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from scone_jax.atomic import atomic_write_json, temporary_sibling


def set_stats(fs) -> dict:
    counts = np.asarray(fs.counts)
    lengths = np.asarray(fs.lengths)
    out = {
        "num_fgrams": fs.num_fgrams,
        "requested_num_fgrams": fs.meta.get("requested_num_fgrams"),
        "max_n": fs.max_n,
        "min_count": fs.meta.get("min_count"),
        "cutoff_count": fs.cutoff_count,
        "fgrams_per_length": {str(n): int(np.sum(lengths == n)) for n in range(2, fs.max_n + 1)},
        "survivors_per_length": fs.meta.get("survivors_per_length"),
    }
    if counts.size:
        out["count_quantiles"] = {
            q: int(np.quantile(counts, p, method="nearest"))
            for q, p in (("max", 1.0), ("p50", 0.5), ("p10", 0.1), ("min", 0.0))
        }
        hi = max(int(counts.max()), int(counts.min()) + 1)
        edges = np.unique(np.geomspace(max(int(counts.min()), 1), hi + 1, 40).astype(np.int64))
        hist, _ = np.histogram(counts, bins=edges)
        out["count_histogram"] = {"edges": edges.tolist(), "fgrams": hist.tolist()}
    return out


def coverage_stats(hist: np.ndarray, num_tokens: int) -> dict:
    """From a histogram of match lengths (index = length, 0 = unmatched) over a corpus."""
    hist = np.asarray(hist, np.int64)
    matched = int(hist[2:].sum())
    weighted = int((np.arange(len(hist)) * hist).sum())
    return {
        "num_tokens": int(num_tokens),
        "matched_tokens": matched,
        "coverage": matched / num_tokens if num_tokens else 0.0,
        "mean_match_length": weighted / matched if matched else 0.0,
        "mean_match_length_all_tokens": weighted / num_tokens if num_tokens else 0.0,
        "tokens_matched_per_length": {str(n): int(hist[n]) for n in range(2, len(hist))},
    }


def compute_stats(
    fs, hist: np.ndarray | None = None, num_tokens: int | None = None, corpus: str | None = None
) -> dict:
    out = {"fgram_set": set_stats(fs)}
    if hist is not None:
        out["coverage"] = {"corpus": corpus, **coverage_stats(hist, num_tokens)}
    return out


def format_stats(stats: dict) -> str:
    s = stats["fgram_set"]
    lines = [
        f"f-grams: {s['num_fgrams']:,} (requested {s['requested_num_fgrams']:,}), "
        f"K = {s['max_n']}, min count {s['min_count']}, cutoff count {s['cutoff_count']}"
    ]
    per = s["fgrams_per_length"]
    lines.append("per length: " + ", ".join(f"{n}: {c:,}" for n, c in per.items()))
    if s.get("count_quantiles"):
        q = s["count_quantiles"]
        lines.append(
            f"counts: max {q['max']:,}, median {q['p50']:,}, p10 {q['p10']:,}, min {q['min']:,}"
        )
    if "coverage" in stats:
        c = stats["coverage"]
        lines.append(
            f"coverage of {c.get('corpus') or 'the corpus'}: {c['coverage']:.2%} of "
            f"{c['num_tokens']:,} tokens matched, mean match length {c['mean_match_length']:.2f} "
            f"({c['mean_match_length_all_tokens']:.2f} over all tokens)"
        )
        lines.append(
            "tokens matched per length: "
            + ", ".join(f"{n}: {m:,}" for n, m in c["tokens_matched_per_length"].items())
        )
    return "\n".join(lines)


def plot_stats(stats: dict, path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = stats["fgram_set"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    lengths = [int(n) for n in s["fgrams_per_length"]]
    ax = axes[0]
    width = 0.4
    ax.bar(
        np.array(lengths) - width / 2,
        list(s["fgrams_per_length"].values()),
        width,
        label="f-grams in the set",
    )
    ax.set_xlabel("f-gram length")
    ax.set_ylabel("f-grams")
    ax.set_xticks(lengths)
    if "coverage" in stats:
        c = stats["coverage"]
        ax2 = ax.twinx()
        ax2.bar(
            np.array(lengths) + width / 2,
            [c["tokens_matched_per_length"][str(n)] for n in lengths],
            width,
            color="tab:orange",
            label="tokens matched",
        )
        ax2.set_ylabel("tokens whose longest match has this length")
        ax.set_title(
            f"coverage {c['coverage']:.1%}, mean match length {c['mean_match_length']:.2f}"
        )
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper right")
    else:
        ax.set_title("f-grams per length")
    ax = axes[1]
    if s.get("count_histogram"):
        h = s["count_histogram"]
        edges = np.asarray(h["edges"], float)
        ax.stairs(h["fgrams"], edges, fill=True)
        ax.set_xscale("log")
        ax.set_yscale("log")
        if s["cutoff_count"]:
            ax.axvline(s["cutoff_count"], color="k", ls="--", label=f"cutoff {s['cutoff_count']:,}")
            ax.legend()
    ax.set_xlabel("count in the corpus")
    ax.set_ylabel("f-grams")
    ax.set_title(f"{s['num_fgrams']:,} f-grams, K = {s['max_n']}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the file's own suffix: matplotlib picks the format from it (PNG without one)
    tmp = temporary_sibling(path, path.suffix if len(path.suffix) > 1 else ".png")
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def save_stats(
    stats: dict, json_path: str | os.PathLike | None, png_path: str | os.PathLike | None
) -> None:
    if json_path is not None:
        atomic_write_json(json_path, stats)
    if png_path is not None:
        plot_stats(stats, png_path)
