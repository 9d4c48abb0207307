"""Where Beam workers read a tokenized dataset, and the shards they split it into.

The layout is the dataset directory's (`tokens.bin`, `doc_offsets.npy`, `meta.json`), on a
local path or on storage Beam knows (gs://, s3://, hdfs://); a worker reads only its shard's
slice of the offsets and byte range of the tokens.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from apache_beam.io.filesystems import FileSystems

from scone_jax.errors import UserError

_COPY_CHUNK = 1 << 20


class DatasetRef:
    """Where Beam workers read a tokenized dataset: a local path or a URL (gs://, s3://, hdfs://).

    The driver reads `meta.json` and `doc_offsets.npy` to cut the documents into shards; a
    shard is just (first document, end document), and each worker reads its slice of the
    offsets and its byte range of `tokens.bin` itself.
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

    def shards(
        self, shard_tokens: int, doc_ids: np.ndarray | None = None
    ) -> list[tuple[int, int, tuple[int, ...]]]:
        """(first document, end document, documents left out) per shard of about
        `shard_tokens` tokens; with `doc_ids` (sorted), only those documents are counted."""
        total = int(self.offsets[-1])
        cuts = np.searchsorted(
            self.offsets, np.arange(shard_tokens, total, shard_tokens), side="left"
        )
        bounds = np.unique(np.concatenate([[0], cuts, [len(self.offsets) - 1]]))
        left_out = (
            np.zeros(0, np.int64)
            if doc_ids is None
            else np.setdiff1d(np.arange(len(self.offsets) - 1), doc_ids)
        )
        shards = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            skip = left_out[np.searchsorted(left_out, a) : np.searchsorted(left_out, b)]
            if len(skip) < b - a:  # a shard of held-out documents only is not sent
                shards.append((a, b, tuple(skip.tolist())))
        return shards


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


class WorkerRef:
    """What workers need of a DatasetRef (not the driver's copy of all offsets)."""

    def __init__(self, ref: DatasetRef):
        self.offsets_url, self.tokens_url = ref.offsets_url, ref.tokens_url
        self.offsets_header, self.meta = ref.offsets_header, {"dtype": ref.meta["dtype"]}


def read_shard(shard: tuple, ref: WorkerRef) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of documents [first, end), less those the shard leaves out, and where each
    document starts in them."""
    lo, hi = shard[:2]
    offs = np.frombuffer(
        _read_range(ref.offsets_url, ref.offsets_header + 8 * lo, 8 * (hi - lo + 1)), "<i8"
    )
    dtype = np.dtype(ref.meta["dtype"])
    tokens = np.frombuffer(
        _read_range(
            ref.tokens_url, int(offs[0]) * dtype.itemsize, int(offs[-1] - offs[0]) * dtype.itemsize
        ),
        dtype,
    )
    lengths = np.diff(offs)
    left_out = np.asarray(shard[2] if len(shard) > 2 else (), np.int64) - lo
    if len(left_out):
        keep_doc = np.ones(hi - lo, bool)
        keep_doc[left_out] = False
        tokens = tokens[np.repeat(keep_doc, lengths)]
        lengths = lengths[keep_doc]
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    starts = np.zeros(len(tokens), bool)
    starts[first[first < len(tokens)]] = True
    return tokens, starts


def write_temp_dataset(corpus, directory: str) -> str:
    """The minimal dataset layout the workers read (tokens.bin, doc_offsets.npy, meta.json)."""
    path = os.path.join(directory, "dataset")
    os.makedirs(path)
    with open(os.path.join(path, "tokens.bin"), "wb") as f:
        for a in range(0, corpus.num_tokens, _COPY_CHUNK):
            f.write(corpus.read(a, a + _COPY_CHUNK).astype("<u4").tobytes())
    np.save(os.path.join(path, "doc_offsets.npy"), np.asarray(corpus.doc_offsets, np.int64))
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(
            {"dtype": "<u4", "num_tokens": corpus.num_tokens, "vocab_size": corpus.vocab_size}, f
        )
    return path
