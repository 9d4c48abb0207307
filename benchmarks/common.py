"""Shared benchmark helpers: real text when ../shared/data is there, a matmul peak, timing."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

SHARED_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "valid.txt"


def real_text_dataset(vocab_size: int, workdir: Path | None = None):
    """WikiText-2 valid (blank-line documents) when present, else the embedded default corpus."""
    from scone_jax.config.schema import DataConfig
    from scone_jax.data.tokenize import build_dataset

    workdir = Path(workdir or tempfile.mkdtemp(prefix="scone-bench-"))
    corpus = [str(SHARED_TEXT)] if SHARED_TEXT.is_file() else []
    cfg = DataConfig(corpus=corpus, doc_split="blank_line", tokenizer_vocab_size=vocab_size)
    out = workdir / f"dataset_{vocab_size}"
    ds = build_dataset(cfg, out, progress=False)
    return ds, ("WikiText-2 valid" if corpus else "the default corpus")


def matmul_peak(n: int = 1024, repeats: int = 20) -> float:
    """Best-of FLOP/s of a float32 n x n matmul on the default device."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def interleaved_timings(
    fns: dict, rounds: int, seed: int = 0
) -> tuple[dict[str, float], dict[str, float], dict]:
    """Median seconds per call of each fn, calling each once per round in a fresh random order
    (drift hits all alike, and none always runs right after the same other), the median over
    rounds of each fn's time relative to the first fn's in that round, and a bootstrap 90%
    interval of that median (how far this run's ratio can be trusted)."""
    rng = np.random.default_rng(seed)
    names = list(fns)
    times = {k: [] for k in names}
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            t = time.perf_counter()
            fns[names[i]]()
            times[names[i]].append(time.perf_counter() - t)
    first = np.array(times[names[0]])
    ratios = {k: np.array(v) / first for k, v in times.items()}
    return (
        {k: float(np.median(v)) for k, v in times.items()},
        {k: float(np.median(r)) for k, r in ratios.items()},
        {k: median_interval(r, rng) for k, r in ratios.items()},
    )


def median_interval(
    samples: np.ndarray, rng: np.random.Generator, resamples: int = 2000
) -> tuple[float, float]:
    """Bootstrap 90% interval of the median of `samples` (per-round ratios)."""
    medians = np.median(samples[rng.integers(0, len(samples), (resamples, len(samples)))], axis=1)
    return float(np.quantile(medians, 0.05)), float(np.quantile(medians, 0.95))


def ratio_text(ratio: float, interval: tuple[float, float], unit: str = "") -> str:
    """A ratio and its bootstrap interval as the tables show them: "1.40x (1.36-1.43)"."""
    return f"{ratio:.2f}{unit} ({interval[0]:.2f}-{interval[1]:.2f})"
