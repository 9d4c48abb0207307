"""Corpus -> f-gram set directory: count (local or Beam), select the top S, store, stats."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from scone_jax.atomic import atomic_dir, check_output_path, check_replaceable
from scone_jax.errors import UserError
from scone_jax.fgrams import stats as stats_mod
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.select import cutoff_rows, select_top
from scone_jax.fgrams.store import SET_KIND, SET_MARKER, FgramSet

BACKENDS = ("local", "beam")


MAX_K = 64  # lengths are stored as int8, tag lengths as uint8


def check_settings(max_n: int, num_fgrams: int, min_count: int) -> None:
    if max_n < 2:
        raise UserError(f"--max-n {max_n}: f-grams have 2..K tokens, so K must be >= 2")
    if max_n > MAX_K:
        raise UserError(f"--max-n {max_n} is above the supported maximum K = {MAX_K}")
    if num_fgrams < 1:
        raise UserError(f"--num-fgrams {num_fgrams}: the set must hold at least 1 f-gram")
    if num_fgrams >= 2**31:
        raise UserError(f"--num-fgrams {num_fgrams}: ids are int32, so S must be < 2**31")
    if min_count < 1:
        raise UserError(f"--min-count {min_count} must be >= 1")


def select_fgrams(
    corpus: Corpus,
    max_n: int = 5,
    num_fgrams: int = 100_000,
    min_count: int = 5,
    *,
    backend: str = "local",
    memory_budget: int | None = None,
    workers: int | None = None,
    force_disk: bool = False,
    tmp_dir=None,
    beam_options: list[str] | None = None,
    beam_dataset: str | None = None,
    beam_work_dir: str | None = None,
    beam_shard_tokens: int | None = None,
    progress: bool = True,
) -> FgramSet:
    """Count and select; returns the set in memory (nothing written)."""
    check_settings(max_n, num_fgrams, min_count)
    corpus.check_nonempty()
    radix = corpus.key_vocab()  # validates ids against the declared vocabulary
    start = time.perf_counter()
    if backend == "local":
        from scone_jax.fgrams.count import count_ngrams

        counted = count_ngrams(
            corpus,
            max_n,
            min_count,
            memory_budget=memory_budget,
            workers=workers,
            force_disk=force_disk,
            tmp_dir=tmp_dir,
            progress=progress,
        )
        all_counts = (
            np.concatenate([lv.counts for lv in counted.levels])
            if counted.levels
            else np.zeros(0, np.int64)
        )
        rows = cutoff_rows(all_counts, num_fgrams)
        bounds = np.cumsum([0] + [len(lv.counts) for lv in counted.levels])
        by_level = [
            rows[(rows >= lo) & (rows < hi)] - lo for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
        tokens, lengths, counts = counted.pooled(by_level)
        survivors = {str(lv.n): len(lv.codes) for lv in counted.levels}
        candidates = {str(lv.n): lv.candidates for lv in counted.levels}
        extra = {"plan": counted.plan.mode if counted.plan else None}
    elif backend == "beam":
        try:
            from scone_jax.fgrams.beam import count_with_beam
        except ImportError:
            raise UserError(
                "--backend beam needs apache-beam (pip install 'scone_jax[beam]')"
            ) from None

        counted = count_with_beam(
            corpus,
            max_n,
            min_count,
            num_fgrams,
            pipeline_args=beam_options,
            workers=workers,
            tmp_dir=tmp_dir,
            dataset_url=beam_dataset,
            work_dir=beam_work_dir,
            shard_tokens=beam_shard_tokens,
        )
        tokens, lengths, counts = counted.tokens, counted.lengths, counted.counts
        survivors, candidates = counted.survivors, counted.candidates
        extra = {
            "beam_shuffle_bytes": sum(counted.shuffle_bytes.values()),
            "beam_worker_tokens": counted.worker_tokens,
        }
    else:
        raise UserError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    for n in range(2, max_n + 1):
        survivors.setdefault(str(n), 0)
        candidates.setdefault(str(n), 0)
    total = sum(survivors.values())
    if total == 0:
        raise UserError(
            f"no n-gram of length 2..{max_n} occurs at least {min_count} times in {corpus.source} "
            f"({corpus.num_tokens} tokens); lower the minimum count (--min-count, or "
            "fgrams.min_count in a config) or count a larger corpus"
        )
    order, cutoff = select_top(tokens, lengths, counts, num_fgrams)
    if total < num_fgrams:
        print(
            f"note: only {total:,} n-grams occur at least {min_count} times; keeping all of them "
            f"(fewer than the {num_fgrams:,} requested)",
            file=sys.stderr,
        )
    meta = {
        "vocab_size": corpus.vocab_size,
        "tokenizer_sha256": corpus.tokenizer_sha256,
        "tokenizer_path": corpus.tokenizer_path,
        "corpus_sha256": corpus.corpus_sha256,
        "tokens_sha256": corpus.tokens_sha256,
        "corpus_fingerprint": corpus.fingerprint,
        **({"training_split": corpus.split} if corpus.split else {}),
        "corpus_source": corpus.source,
        "num_tokens": corpus.num_tokens,
        "num_docs": corpus.num_docs,
        "survivors_per_length": survivors,
        "candidates_per_length": candidates,
        "backend": backend,
        "count_seconds": round(time.perf_counter() - start, 3),
        **extra,
    }
    return FgramSet.create(
        tokens[order, :max_n],
        lengths[order],
        counts[order],
        max_n=max_n,
        min_count=min_count,
        key_vocab=radix,
        requested=num_fgrams,
        **meta,
    )


def build_fgram_set(
    corpus: Corpus,
    out: str | os.PathLike,
    max_n: int = 5,
    num_fgrams: int = 100_000,
    min_count: int = 5,
    *,
    with_stats: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    workers: int | None = None,
    **kwargs,
) -> FgramSet:
    """Count, select, and write the set directory atomically (with stats.json and stats.png)."""
    out = Path(out)
    check_replaceable(out, overwrite, SET_MARKER, SET_KIND)  # before the counting, not after
    check_output_path(out, "output directory")
    fs = select_fgrams(
        corpus, max_n, num_fgrams, min_count, progress=progress, workers=workers, **kwargs
    )
    with atomic_dir(out, overwrite, marker=SET_MARKER, kind=SET_KIND) as tmp:
        fs.write_into(tmp)
        if with_stats:
            from scone_jax.fgrams.tag import tag_corpus

            _, _, hist = tag_corpus(
                fs,
                corpus,
                workers=workers,
                progress=progress,
                keep=False,
                memory_budget=kwargs.get("memory_budget"),
            )
            st = stats_mod.compute_stats(fs, hist, corpus.num_tokens, corpus.source)
            stats_mod.save_stats(st, tmp / "stats.json", tmp / "stats.png")
            fs.stats = st
    fs.path = out
    return fs
