"""The same exact counting as an Apache Beam pipeline, for corpora beyond one machine.

Runs on any Beam runner (DirectRunner here and in tests; Dataflow, Flink, Spark on a
cluster: see docs/beam.md). The pipeline, one stage per length n = 2..K:

    shards of documents --ReadDocs--> token arrays
      --EmitNgrams(n)-->  (n-gram bytes, count in this document), only candidates: for n >= 3
                          both (n-1)-prefix and (n-1)-suffix are in the side input of the
                          (n-1)-grams that survived (Apriori on both sides)
      --CombinePerKey(sum)--> --Filter(count >= min count)--> survivors of length n

The survivors of every length are pooled; a histogram of their counts (a small side input)
gives the cutoff count c* (the S-th largest count), and every survivor with count >= c* is
written out (ties included). The driver reads those rows back and runs the shared
`select.select_top`, so the Beam and local backends produce the same set, ids and keys.

An n-gram is keyed by its tokens as big-endian uint32 bytes: exact, and byte order equals
token order. n-grams never cross a document boundary because they are made per document.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import uuid

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from scone_jax.errors import UserError

SHARD_TOKENS = 1 << 20


# -- reading documents -------------------------------------------------------------------------


class DatasetRef:
    """Where Beam workers read a tokenized dataset: a local path or a URL (gs://, s3://, hdfs://).

    The driver reads `meta.json` and `doc_offsets.npy` to cut the documents into shards of
    about a million tokens; a shard is just (first document, end document), and each worker
    reads its slice of the offsets and its byte range of `tokens.bin` itself.
    """

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        try:
            with FileSystems.open(self._join("meta.json")) as f:
                self.meta = json.loads(f.read().decode("utf-8"))
            with FileSystems.open(self.offsets_url) as f:
                raw = f.read()
            self.offsets_header = _npy_header_length(io.BytesIO(raw))
            self.offsets = np.load(io.BytesIO(raw), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UserError(f"{url} is not a readable tokenized dataset: {e}") from None
        if self.offsets.dtype != np.dtype("<i8") or self.offsets.ndim != 1:
            raise UserError(f"{self.offsets_url} is not an int64 vector")

    def _join(self, name: str) -> str:
        return FileSystems.join(self.url, name)

    @property
    def tokens_url(self) -> str:
        return self._join("tokens.bin")

    @property
    def offsets_url(self) -> str:
        return self._join("doc_offsets.npy")

    def shards(self, shard_tokens: int = SHARD_TOKENS) -> list[tuple[int, int]]:
        """(first document, end document) per shard of about `shard_tokens` tokens."""
        total = int(self.offsets[-1])
        cuts = np.searchsorted(
            self.offsets, np.arange(shard_tokens, total, shard_tokens), side="left"
        )
        bounds = np.unique(np.concatenate([[0], cuts, [len(self.offsets) - 1]]))
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _npy_header_length(f) -> int:
    version = np.lib.format.read_magic(f)
    (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )(f)
    return f.tell()


def _read_range(url: str, start: int, size: int) -> bytes:
    with FileSystems.open(url) as f:
        f.seek(start)
        data = f.read(size)
    if len(data) != size:
        raise ValueError(f"{url}: short read of {size} bytes at {start}")
    return data


class _WorkerRef:
    """What workers need of a DatasetRef (not the driver's copy of all offsets)."""

    def __init__(self, ref: DatasetRef):
        self.offsets_url, self.tokens_url = ref.offsets_url, ref.tokens_url
        self.offsets_header, self.meta = ref.offsets_header, {"dtype": ref.meta["dtype"]}


def _read_docs(shard, ref: _WorkerRef):
    lo, hi = shard
    offs = np.frombuffer(
        _read_range(ref.offsets_url, ref.offsets_header + 8 * lo, 8 * (hi - lo + 1)), "<i8"
    )
    dtype = np.dtype(ref.meta["dtype"])
    data = np.frombuffer(
        _read_range(
            ref.tokens_url, int(offs[0]) * dtype.itemsize, int(offs[-1] - offs[0]) * dtype.itemsize
        ),
        dtype,
    )
    offs = offs - offs[0]
    for a, b in zip(offs[:-1], offs[1:]):
        if b > a:
            yield data[a:b].astype(">u4")


class EmitNgrams(beam.DoFn):
    """Per document, the distinct candidate n-grams and their counts in it.

    The side input (survivors of length n-1) is turned into a set once per DoFn instance:
    it is the same for the whole pass.
    """

    def __init__(self, n: int, vocab_size: int | None):
        self.n, self.vocab_size = n, vocab_size
        self._prev = None

    def process(self, doc: np.ndarray, prev=None):
        n = self.n
        if self.vocab_size is not None and len(doc) and int(doc.max()) >= self.vocab_size:
            raise ValueError(
                f"token id {int(doc.max())} out of vocabulary (expected < {self.vocab_size})"
            )
        if len(doc) < n:
            return
        if prev is not None and self._prev is None:
            self._prev = set(prev)
        grams = (
            np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(doc, n))
            .view(f"V{4 * n}")
            .ravel()
        )
        uniq, counts = np.unique(grams, return_counts=True)
        for g, c in zip(uniq.tolist(), counts.tolist()):
            if self._prev is not None and (g[:-4] not in self._prev or g[4:] not in self._prev):
                continue
            yield g, c


def _cutoff(hist: dict[int, int], num: int) -> int:
    """The num-th largest count given {count: how many n-grams have it} (all kept if fewer)."""
    total = 0
    for c in sorted(hist, reverse=True):
        total += hist[c]
        if total >= num:
            return c
    return min(hist) if hist else 1


def _merge_hist(hists) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hists:
        for c, k in h.items():
            out[c] = out.get(c, 0) + k
    return out


def _format_row(kv) -> str:
    key, count = kv
    return f"{count}\t{' '.join(map(str, np.frombuffer(key, '>u4').tolist()))}"


def build_pipeline(
    p,
    dataset: DatasetRef,
    max_n: int,
    min_count: int,
    num_fgrams: int,
    out_prefix: str,
    prune: bool = True,
    shard_tokens: int = SHARD_TOKENS,
):
    """Add the counting stages to pipeline `p`; results go to files under `out_prefix`."""
    vocab = dataset.meta.get("vocab_size")
    docs = (
        p
        | "Shards" >> beam.Create(dataset.shards(shard_tokens))
        | "Reshuffle" >> beam.Reshuffle()
        | "ReadDocs" >> beam.FlatMap(_read_docs, _WorkerRef(dataset))
    )
    survivors, stats = [], []
    prev_keys = None
    for n in range(2, max_n + 1):
        emit = EmitNgrams(n, vocab)
        if prev_keys is not None and prune:
            grams = docs | f"Emit{n}" >> beam.ParDo(emit, beam.pvalue.AsList(prev_keys))
        else:
            grams = docs | f"Emit{n}" >> beam.ParDo(emit)
        counted = (
            grams
            | f"Sum{n}" >> beam.CombinePerKey(sum)
            | f"Min{n}" >> beam.Filter(lambda kv, m: kv[1] >= m, min_count)
        )
        survivors.append(counted)
        stats.append(grams | f"Cand{n}" >> beam.Map(lambda kv, n: (f"candidates\t{n}", kv[1]), n))
        stats.append(counted | f"Surv{n}" >> beam.Map(lambda kv, n: (f"survivors\t{n}", 1), n))
        prev_keys = counted | f"Keys{n}" >> beam.Keys()
    pooled = survivors | "Pool" >> beam.Flatten()
    hist = (
        pooled
        | "Counts" >> beam.Map(lambda kv: {kv[1]: 1})
        | "Hist" >> beam.CombineGlobally(_merge_hist)
    )
    cutoff = hist | "Cutoff" >> beam.Map(_cutoff, num_fgrams)
    (
        pooled
        | "AtLeastCutoff" >> beam.Filter(lambda kv, c: kv[1] >= c, beam.pvalue.AsSingleton(cutoff))
        | "Format" >> beam.Map(_format_row)
        | "WriteRows" >> beam.io.WriteToText(FileSystems.join(out_prefix, "rows"))
    )
    (
        stats
        | "Stats" >> beam.Flatten()
        | "SumStats" >> beam.CombinePerKey(sum)
        | "FormatStats" >> beam.MapTuple(lambda k, v: f"{k}\t{v}")
        | "WriteStats" >> beam.io.WriteToText(FileSystems.join(out_prefix, "stats"))
    )


def read_results(out_prefix: str, max_n: int):
    """(tokens [M, K], lengths, counts, survivors per length, candidates per length)."""

    def lines(pattern):
        for m in FileSystems.match([FileSystems.join(out_prefix, pattern)])[0].metadata_list:
            with FileSystems.open(m.path) as f:
                yield from f.read().decode("utf-8").splitlines()

    counts, rows = [], []
    for line in lines("rows*"):
        c, toks = line.split("\t")
        counts.append(int(c))
        rows.append([int(x) for x in toks.split()])
    tokens = np.full((len(rows), max_n), -1, np.int64)
    lengths = np.array([len(r) for r in rows], np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    survivors, candidates = {}, {}
    for line in lines("stats*"):
        kind, n, v = line.split("\t")
        (survivors if kind == "survivors" else candidates)[n] = int(v)
    return tokens, lengths, np.array(counts, np.int64), survivors, candidates


def count_with_beam(
    corpus,
    max_n: int,
    min_count: int,
    num_fgrams: int,
    *,
    pipeline_args: list[str] | None = None,
    tmp_dir=None,
    work_dir: str | None = None,
    dataset_url: str | None = None,
    prune: bool = True,
    shard_tokens: int = SHARD_TOKENS,
):
    """Run the pipeline and read back the rows that can make the top `num_fgrams`.

    Workers read `dataset_url` when given (a copy of the dataset on shared storage, for a
    cluster), else the corpus's own dataset directory, else a temporary copy of in-memory
    arrays. `work_dir` (shared storage on a cluster) holds the pipeline's output files.
    """
    local_tmp = tempfile.TemporaryDirectory(prefix="scone-beam-", dir=tmp_dir)
    try:
        if dataset_url is None:
            from scone_jax.data.dataset import TokenizedDataset

            src = corpus.source
            if os.path.isfile(os.path.join(str(src), "meta.json")):
                dataset_url = str(TokenizedDataset.open(src).path)
            else:
                dataset_url = _write_temp_dataset(corpus, local_tmp.name)
        dataset = DatasetRef(dataset_url)
        theirs = (dataset.meta.get("tokens_sha256"), int(dataset.offsets[-1]))
        if (
            theirs[0]
            and corpus.tokens_sha256
            and theirs != (corpus.tokens_sha256, corpus.num_tokens)
        ):
            raise UserError(f"{dataset_url} is not a copy of {corpus.source} (different tokens)")
        out_prefix = (
            work_dir.rstrip("/") + f"/scone-fgrams-{uuid.uuid4().hex[:12]}"
            if work_dir
            else os.path.join(local_tmp.name, "out")
        )
        args = list(pipeline_args or ["--runner=DirectRunner"])
        with beam.Pipeline(options=PipelineOptions(args)) as p:
            build_pipeline(
                p, dataset, max_n, min_count, num_fgrams, out_prefix, prune, shard_tokens
            )
        return read_results(out_prefix, max_n)
    finally:
        local_tmp.cleanup()


def _write_temp_dataset(corpus, directory: str) -> str:
    """The minimal dataset layout the workers read (tokens.bin, doc_offsets.npy, meta.json)."""
    path = os.path.join(directory, "dataset")
    os.makedirs(path)
    with open(os.path.join(path, "tokens.bin"), "wb") as f:
        for a in range(0, corpus.num_tokens, SHARD_TOKENS):
            f.write(corpus.read(a, a + SHARD_TOKENS).astype("<u4").tobytes())
    np.save(os.path.join(path, "doc_offsets.npy"), np.asarray(corpus.doc_offsets, np.int64))
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(
            {"dtype": "<u4", "num_tokens": corpus.num_tokens, "vocab_size": corpus.vocab_size}, f
        )
    return path
