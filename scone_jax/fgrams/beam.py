"""The local backend's exact counting as an Apache Beam pipeline, for corpora beyond one machine.

Workers run the local kernels (`count.py`) on whole shards of documents, and the shuffle
merges what they send: per-partition partial counts, packed arrays, never one element per
n-gram. One stage per length n = 2..K:

    shards --Count{n}--> per shard: the candidate codes of length n (Apriori: both (n-1)-sub-
                         grams among the survivors of length n-1, looked up in the tables of
                         the survivors of lengths 2..n-1, the side inputs), partitioned by the
                         top bits of their mixed code, each partition sorted and run-length
                         counted: (partition, (layout, distinct keys, counts))
           --Group{n}--> --Merge{n}--> per partition: the shards' counts summed, cut at the
                         minimum count: survivors of length n (codes and counts)

A code is the local backend's: (id of the (n-1)-prefix) * V + last token, the id being the
slot of that prefix in the hash table of the survivors of length n-1. Workers build those
tables from the side inputs exactly as the local backend builds them (same codes, same order,
same insertion), so ids and codes agree everywhere, and the partitions taken in order are the
local level's codes in order. Each worker process builds a length's table once per run.

The survivors of every length are pooled; a histogram of their counts (a small side input)
gives the cutoff count c* (the S-th largest count), and every survivor with count >= c* is
decoded to its tokens on the workers and written out (ties included). The driver reads those
rows back and runs the shared `select.select_top`, so both backends produce the same set, ids
and keys. Runner choice: `beam_runner.py`.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from scone_jax.errors import UserError
from scone_jax.fgrams.beam_dataset import DatasetRef, WorkerRef, read_shard, write_temp_dataset
from scone_jax.fgrams.beam_runner import pipeline_options
from scone_jax.fgrams.count import (
    Counts,
    Layout,
    Level,
    check_codes_fit,
    index_of,
    merge_partials,
    partial_counts,
    shard_candidates,
)

# Shuffle partitions: at least this many (reducers run in parallel), at most this many
# (every shard sends a piece to each partition at every length).
MIN_PARTITIONS, MAX_PARTITIONS = 16, 4096
_STATS = "stats"


def default_shard_tokens(num_tokens: int) -> int:
    """1M tokens per shard; above 4G tokens num_tokens / 4096 (at most 16M), so that the
    shards times the partitions, the shuffle's elements per length, stay below ~10^8."""
    return int(np.clip(_pow2(num_tokens // 4096), 1 << 20, 1 << 24))


def default_partitions(num_tokens: int) -> int:
    """One shuffle partition per ~16M tokens, within [MIN_PARTITIONS, MAX_PARTITIONS]."""
    return int(np.clip(_pow2(num_tokens >> 24), MIN_PARTITIONS, MAX_PARTITIONS))


def _pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


# -- the survivors of shorter lengths, once per worker process ----------------------------------

_LEVELS: dict[tuple[str, int], Level] = {}
_LEVELS_LOCK = threading.Lock()


def _levels(run: str, sides) -> list[Level]:
    """Levels 2..len(sides)+1 (indexed) from their side inputs: lists of (partition, codes,
    counts). Cached per process and run: every stage after length m reads the same side input."""
    with _LEVELS_LOCK:
        for key in [k for k in _LEVELS if k[0] != run]:
            del _LEVELS[key]
        out = []
        for m, side in enumerate(sides, start=2):
            level = _LEVELS.get((run, m))
            if level is None:
                parts = sorted(side, key=lambda part: part[0])
                level = Level(
                    m,
                    np.concatenate([np.zeros(0, np.uint64)] + [p[1] for p in parts]),
                    np.concatenate([np.zeros(0, np.int64)] + [p[2] for p in parts]),
                    0,
                )
                level.index = index_of(level)
                _LEVELS[(run, m)] = level
            out.append(level)
        return out


def _forget(run: str) -> None:
    with _LEVELS_LOCK:
        for key in [k for k in _LEVELS if k[0] == run]:
            del _LEVELS[key]


# -- the stages ---------------------------------------------------------------------------------


class CountShard(beam.DoFn):
    """Length n on one shard: candidate codes, pruned by the survivors of lengths 2..n-1 (one
    side input each), counted into partial counts per shuffle partition."""

    def __init__(self, ref: WorkerRef, n: int, radix: int, partitions: int, run: str):
        self.ref, self.n, self.radix, self.partitions, self.run = ref, n, radix, partitions, run

    def process(self, shard, *sides):
        n, radix = self.n, self.radix
        indexes = [level.index for level in _levels(self.run, sides)]
        tokens, starts = read_shard(shard, self.ref)
        if len(tokens) and int(tokens.max()) >= radix:
            raise ValueError(f"token id {int(tokens.max())} out of vocabulary (expected < {radix})")
        if n >= 3:
            check_codes_fit(indexes[-1], radix, n)
        bound = (radix if n == 2 else indexes[-1].capacity) * radix
        layout = Layout.for_pass(bound, self.partitions, MAX_PARTITIONS)
        cands, sizes = shard_candidates(tokens, starts, n, radix, indexes, layout)
        sent = 0
        for q, keys, counts in partial_counts(cands, sizes):
            sent += keys.nbytes + counts.nbytes
            yield q, (layout, keys, counts)
        yield beam.pvalue.TaggedOutput(_STATS, (f"candidates\t{n}", len(cands)))
        yield beam.pvalue.TaggedOutput(_STATS, (f"shuffle_bytes\t{n}", sent))
        yield beam.pvalue.TaggedOutput(_STATS, (f"worker_tokens\t{worker_name()}", len(tokens)))


def worker_name() -> str:
    """host:pid of this process (the stats name each process that counted shards)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _merge(kv, min_count: int):
    """One partition's partial counts from every shard -> its survivors (partition, codes,
    counts)."""
    q, pieces = kv
    pieces = list(pieces)
    codes, counts = merge_partials(
        [p[1] for p in pieces], [p[2] for p in pieces], min_count, pieces[0][0], q
    )
    if len(codes):
        yield q, codes, counts


class FormatRows(beam.DoFn):
    """Survivors with count >= the cutoff as text rows "count t_0 .. t_{K-1}" (padded with -1),
    decoded with the tables of lengths 2..K-1 (side inputs); one element per batch, not per row
    (a Beam element costs ~50 us)."""

    def __init__(self, max_n: int, radix: int, run: str):
        self.max_n, self.radix, self.run = max_n, radix, run

    def process(self, element, cutoff: int, *sides):
        n, codes, counts = element
        keep = counts >= cutoff
        if not keep.any():
            return
        levels = _levels(self.run, sides[: n - 2])
        rows = np.full((int(keep.sum()), self.max_n + 1), -1, np.int64)
        rows[:, 0] = counts[keep]
        rows[:, 1 : n + 1] = Counts(self.max_n, 1, self.radix, levels).decode(n, codes[keep])
        yield "\n".join(" ".join(map(str, row)) for row in rows.tolist())


def _cutoff(hist: dict[int, int], num: int) -> int:
    """The num-th largest count given {count: how many n-grams have it} (all kept if fewer)."""
    total = 0
    for c in sorted(hist, reverse=True):
        total += hist[c]
        if total >= num:
            return c
    return min(hist) if hist else 1


def _histogram(counts: np.ndarray) -> dict[int, int]:
    values, k = np.unique(counts, return_counts=True)
    return dict(zip(values.tolist(), k.tolist()))


def _merge_hist(hists) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hists:
        for c, k in h.items():
            out[c] = out.get(c, 0) + k
    return out


def build_pipeline(
    p,
    dataset: DatasetRef,
    max_n: int,
    min_count: int,
    num_fgrams: int,
    out_prefix: str,
    radix: int,
    *,
    shard_tokens: int | None = None,
    partitions: int | None = None,
    run: str | None = None,
    doc_ids: np.ndarray | None = None,
):
    """Add the counting stages to pipeline `p`; results go to files under `out_prefix`. With
    `doc_ids`, only those documents of `dataset` are counted (a training split)."""
    total = int(dataset.offsets[-1])
    out = out_prefix.rstrip("/")  # "/" joins paths on every Beam filesystem, and needs no extra
    run = run or uuid.uuid4().hex
    partitions = partitions or default_partitions(total)
    ref = WorkerRef(dataset)
    shards = (
        p
        | "Shards"
        >> beam.Create(dataset.shards(shard_tokens or default_shard_tokens(total), doc_ids))
        | "Reshuffle" >> beam.Reshuffle()
    )
    levels, stats = [], []
    for n in range(2, max_n + 1):
        sides = [beam.pvalue.AsList(level) for level in levels]
        counted = shards | f"Count{n}" >> beam.ParDo(
            CountShard(ref, n, radix, partitions, run), *sides
        ).with_outputs(_STATS, main="partials")
        level = (
            counted.partials
            | f"Group{n}" >> beam.GroupByKey()
            | f"Merge{n}" >> beam.FlatMap(_merge, min_count)
        )
        stats.append(counted[_STATS])
        stats.append(level | f"Surv{n}" >> beam.Map(lambda e, n: (f"survivors\t{n}", len(e[1])), n))
        levels.append(level)
    pooled = [
        level | f"Tag{n}" >> beam.Map(lambda e, n: (n, e[1], e[2]), n)
        for n, level in enumerate(levels, start=2)
    ] | "Pool" >> beam.Flatten()
    cutoff = (
        pooled
        | "Counts" >> beam.Map(lambda e: _histogram(e[2]))
        | "Hist" >> beam.CombineGlobally(_merge_hist)
        | "Cutoff" >> beam.Map(_cutoff, num_fgrams)
    )
    (
        pooled
        | "Rows"
        >> beam.ParDo(
            FormatRows(max_n, radix, run),
            beam.pvalue.AsSingleton(cutoff),
            *[beam.pvalue.AsList(level) for level in levels[:-1]],
        )
        | "WriteRows" >> beam.io.WriteToText(f"{out}/rows")
    )
    (
        stats
        | "Stats" >> beam.Flatten()
        | "SumStats" >> beam.CombinePerKey(sum)
        | "FormatStats" >> beam.MapTuple(lambda k, v: f"{k}\t{v}")
        | "WriteStats" >> beam.io.WriteToText(f"{out}/stats")
    )


@dataclass
class BeamCounts:
    """The rows that can make the top S, and what the pipeline measured on the way."""

    tokens: np.ndarray  # [M, K], right-padded with -1
    lengths: np.ndarray
    counts: np.ndarray
    survivors: dict[str, int]  # per length
    candidates: dict[str, int]  # per length, after pruning
    shuffle_bytes: dict[str, int]  # per length: the partial counts the workers sent
    worker_tokens: dict[str, int]  # host:pid of each worker process -> tokens it counted


def read_results(out_prefix: str, max_n: int) -> BeamCounts:
    def text(pattern):
        for m in FileSystems.match([FileSystems.join(out_prefix, pattern)])[0].metadata_list:
            with FileSystems.open(m.path) as f:
                yield f.read().decode("utf-8")

    rows = np.array(" ".join(text("rows*")).split(), np.int64).reshape(-1, max_n + 1)
    tokens = rows[:, 1:]
    lengths = (tokens >= 0).sum(axis=1)
    stats = {"survivors": {}, "candidates": {}, "shuffle_bytes": {}, "worker_tokens": {}}
    for line in "".join(text("stats*")).splitlines():
        kind, key, v = line.split("\t")
        stats[kind][key] = int(v)
    return BeamCounts(tokens, lengths, rows[:, 0], **stats)


def count_with_beam(
    corpus,
    max_n: int,
    min_count: int,
    num_fgrams: int,
    *,
    pipeline_args: list[str] | None = None,
    workers: int | None = None,
    tmp_dir=None,
    work_dir: str | None = None,
    dataset_url: str | None = None,
    shard_tokens: int | None = None,
) -> BeamCounts:
    """Run the pipeline and read back the rows that can make the top `num_fgrams`.

    `pipeline_args` default to the FnApi runner with `workers` worker processes
    (`beam_runner.local_args`). Workers read `dataset_url` when given (a copy of the dataset
    on shared storage, for a cluster), else the corpus's own dataset directory, else a
    temporary copy of in-memory arrays. `work_dir` (shared storage on a cluster) holds the
    pipeline's output files.
    """
    options = pipeline_options(pipeline_args, workers)
    radix = corpus.key_vocab()
    local_tmp = tempfile.TemporaryDirectory(prefix="scone-beam-", dir=tmp_dir)
    run = uuid.uuid4().hex
    dataset_url_given = dataset_url is not None
    try:
        if dataset_url is None:
            from scone_jax.data.dataset import TokenizedDataset

            src = corpus.source
            if os.path.isfile(os.path.join(str(src), "meta.json")):
                dataset_url = str(TokenizedDataset.open(src).path)
            else:
                dataset_url = write_temp_dataset(corpus, local_tmp.name)
        dataset = DatasetRef(dataset_url)
        expected_sha, expected_offsets, doc_ids = (
            corpus.tokens_sha256,
            np.asarray(corpus.doc_offsets),
            None,
        )
        if corpus.split_doc_ids is not None and dataset_url_given:
            # a training split: the workers count its documents of the whole dataset's copy
            expected_sha = corpus.split["dataset_tokens_sha256"]
            expected_offsets, doc_ids = corpus.split_parent_offsets, corpus.split_doc_ids
        of = f"the dataset of {corpus.source}" if doc_ids is not None else corpus.source
        copy_sha = dataset.meta.get("tokens_sha256")
        if copy_sha and expected_sha and copy_sha != expected_sha:
            raise UserError(f"{dataset_url} is not a copy of {of} (different tokens)")
        if not np.array_equal(dataset.offsets, expected_offsets):
            raise UserError(
                f"{dataset_url} is not a copy of {of} (different documents: its doc_offsets.npy "
                "differs)"
            )
        out_prefix = (
            work_dir.rstrip("/") + f"/scone-fgrams-{run[:12]}"
            if work_dir
            else os.path.join(local_tmp.name, "out")
        )
        with beam.Pipeline(options=options) as p:
            build_pipeline(
                p,
                dataset,
                max_n,
                min_count,
                num_fgrams,
                out_prefix,
                radix,
                shard_tokens=shard_tokens,
                run=run,
                doc_ids=doc_ids,
            )
        return read_results(out_prefix, max_n)
    finally:
        _forget(run)
        local_tmp.cleanup()
