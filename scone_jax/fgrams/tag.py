"""Which f-gram each token gets (SCONE.md section 3): the longest f-gram ending at it.

Exact and vectorised. A built set is closed under prefixes and suffixes (a prefix or
suffix of an f-gram occurs at least as often and ranks earlier, shorter first), which
gives a chained lookup with one probe per length and no hashing of whole n-grams:

    slot2[i] = table2[t[i-1] * V + t[i]]                     (i not a document start)
    slotn[i] = tablen[slot(n-1)[i-1] * V + t[i]]              where slot(n-1)[i-1] >= 0
                                                               and slot(n-1)[i] >= 0

The second condition (the suffix survived) prunes lookups and keeps matches inside a
document. The f-gram id is `tablen.vals[slot]`; the longest hit wins. Closure is checked
when a `Tagger` is built. Tags are written beside a tokenized dataset
(`DATASET/tags/<set fingerprint>/`) by `tags_for_dataset`, which training calls.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from scone_jax.atomic import atomic_dir, atomic_write_json, replace_dir
from scone_jax.checksums import ChecksumError, verify_manifest, write_manifest
from scone_jax.errors import UserError
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.hashindex import FIB_INT, M64, HashIndex
from scone_jax.progress import progress_bar

TAG_CHUNK = 1 << 20
TAGS_DIR = "tags"


class Tagger:
    """Per-length tables: code (prefix slot or first token) * V + last token -> slot -> id."""

    def __init__(self, fs):
        self.max_n, self.radix = fs.max_n, fs.key_vocab
        self.num_fgrams = fs.num_fgrams
        v = np.uint64(self.radix)
        toks = fs.tokens.astype(np.int64)
        lengths = fs.lengths.astype(np.int64)
        self.tables: dict[int, HashIndex] = {}
        for n in range(2, self.max_n + 1):
            rows = np.flatnonzero(lengths == n)
            prefix = self._chain(toks[rows, : n - 1], n - 1) if n > 2 else toks[rows, 0]
            if np.any(prefix < 0):
                raise UserError(
                    f"f-gram set {fs.path or ''} is not closed under prefixes (f-gram "
                    f"{int(rows[np.argmax(prefix < 0)])} lacks its prefix); was it built by "
                    "`scone-jax fgrams build`?"
                )
            self.tables[n] = HashIndex(
                prefix.astype(np.uint64) * v + toks[rows, n - 1].astype(np.uint64), rows, load=0.5
            )  # smaller tables: tagging is bound by cache misses
        for n in range(3, self.max_n + 1):  # suffix closure, which the pruning relies on
            rows = np.flatnonzero(lengths == n)
            if np.any(self._chain(toks[rows, 1:n], n - 1) < 0):
                raise UserError(
                    f"f-gram set {fs.path or ''} is not closed under suffixes; was it built by "
                    "`scone-jax fgrams build`?"
                )

    def _chain(self, toks: np.ndarray, n: int) -> np.ndarray:
        """Slot in table n of each row of toks [R, n] (-1 where some prefix is missing)."""
        v = np.uint64(self.radix)
        slot = self.tables[2].slots(toks[:, 0].astype(np.uint64) * v + toks[:, 1].astype(np.uint64))
        for k in range(3, n + 1):
            ok = np.flatnonzero(slot >= 0)
            nxt = np.full(len(slot), -1, np.int64)
            nxt[ok] = self.tables[k].slots(
                slot[ok].astype(np.uint64) * v + toks[ok, k - 1].astype(np.uint64)
            )
            slot = nxt
        return slot

    def tag_window(self, t: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tags for every position of a window; position 0 is treated as having no left context.

        `starts[i]` is True where a document starts. Callers discard the first K-1 positions
        of a window that begins mid-document (they are context for the rest).
        """
        m, v = len(t), np.uint64(self.radix)
        ids = np.full(m, -1, np.int32)
        lens = np.zeros(m, np.uint8)
        if m < 2 or not self.num_fgrams:
            return ids, lens
        known = t < self.radix
        t = t.astype(np.uint64)
        ok = ~starts[1:] & known[1:] & known[:-1]  # the bigram ending at i (masks are for i >= 1)
        cur = np.full(m, -1, np.int64)
        cur[1:][ok] = self.tables[2].slots((t[:-1] * v + t[1:])[ok])
        for n in range(2, self.max_n + 1):
            if n > 2:  # extend the (n-1)-gram ending at i-1 when the one ending at i exists too
                ok = (cur[:-1] >= 0) & (cur[1:] >= 0)
                if not ok.any():
                    break
                nxt = np.full(m, -1, np.int64)
                nxt[1:][ok] = self.tables[n].slots((cur[:-1].astype(np.uint64) * v + t[1:])[ok])
                cur = nxt
            hit = cur >= 0
            ids[hit] = self.tables[n].vals[cur[hit]]
            lens[hit] = n
        return ids, lens


def tag_tokens(fs, tokens, doc_offsets=None) -> tuple[np.ndarray, np.ndarray]:
    """Tag an in-memory token array (documents from `doc_offsets`, default one document)."""
    tokens = np.asarray(tokens)
    if tokens.size and tokens.min() < 0:
        raise UserError(f"negative token id {int(tokens.min())} (expected ids >= 0)")
    starts = np.zeros(len(tokens), bool)
    if doc_offsets is not None:
        offs = np.asarray(doc_offsets)
        starts[offs[offs < len(tokens)]] = True
    if len(tokens):
        starts[0] = True
    return fs.tagger().tag_window(tokens, starts)


def reserved_npy(path, dtype, length: int) -> np.memmap:
    """A new `.npy` file of `length` items, mapped for writing, with its disk blocks reserved up
    front: a full disk then fails here with OSError(ENOSPC) and leaves no file, where writes
    through a sparse mapping would kill the process with SIGBUS."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(length,))
    if not hasattr(os, "posix_fallocate"):  # Linux and the BSDs have it; macOS does not
        return array
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError:
        del array
        Path(path).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return array


def tag_corpus(
    fs,
    corpus: Corpus,
    out_ids=None,
    out_lengths=None,
    *,
    workers: int | None = None,
    progress: bool = True,
    chunk: int | None = None,
    keep: bool = True,
    memory_budget: int | None = None,
    span: tuple[int, int] | None = None,
):
    """Tag a whole corpus chunk by chunk on a thread pool.

    Returns (ids, lengths, match_length_histogram); ids/lengths are in-memory arrays, or
    `.npy` memmaps when `out_ids` / `out_lengths` paths are given (a corpus larger than RAM),
    or None with `keep=False` (statistics only). Chunks of `chunk` tokens (default: a million,
    fewer when `memory_budget` asks, at ~100 bytes per token in flight per worker). With
    `span=(a, b)` only tokens a..b-1 are tagged, into existing `out_ids` / `out_lengths`
    files (one process's share; the histogram covers the span).
    """
    check_vocab(fs, corpus)
    tagger = fs.tagger()
    n_tok, k = corpus.num_tokens, fs.max_n
    workers = workers or os.cpu_count() or 1
    if chunk is None:
        chunk = (
            TAG_CHUNK
            if memory_budget is None
            else int(np.clip(memory_budget // (4 * workers * 100), 1 << 12, TAG_CHUNK))
        )
    first, end = span or (0, n_tok)
    if out_ids is not None and span is not None:
        ids = np.load(out_ids, mmap_mode="r+", allow_pickle=False)
        lens = np.load(out_lengths, mmap_mode="r+", allow_pickle=False)
    elif out_ids is not None:
        ids = reserved_npy(out_ids, np.int32, n_tok)
        lens = reserved_npy(out_lengths, np.uint8, n_tok)
    elif keep:
        ids, lens = np.empty(n_tok, np.int32), np.empty(n_tok, np.uint8)
    else:
        ids = lens = None

    def job(a: int) -> np.ndarray:
        b = min(a + chunk, end)
        lo = max(0, a - (k - 1))
        t = corpus.read(lo, b)
        starts = corpus.starts(lo, b)
        i, n = tagger.tag_window(t, starts)
        if ids is not None:
            ids[a:b], lens[a:b] = i[a - lo :], n[a - lo :]
        return np.bincount(n[a - lo :], minlength=k + 1)

    hist = np.zeros(k + 1, np.int64)
    bar = progress_bar(
        "tag",
        total=end - first,
        unit="tok",
        unit_scale=True,
        disable=not progress,
        leave=False,
    )
    with ThreadPoolExecutor(workers) as pool:
        for h in pool.map(job, range(first, end, chunk)):
            hist += h
            bar.update(int(h.sum()))
    bar.close()
    if out_ids is not None:
        ids.flush()
        lens.flush()
    return ids, lens, hist


def check_vocab(fs, corpus: Corpus) -> None:
    """Tokens the set's vocabulary does not know are an error when both sides declare one."""
    fs.check_tokenizer(corpus.tokenizer_sha256, corpus.source)
    if (
        fs.vocab_size is not None
        and corpus.vocab_size is not None
        and corpus.vocab_size > fs.vocab_size
    ):
        raise UserError(
            f"{corpus.source} has vocab size {corpus.vocab_size} but the f-gram set was counted "
            f"with vocab size {fs.vocab_size}"
        )
    if fs.vocab_size is not None and corpus.vocab_size is None:
        corpus.check_below(fs.vocab_size, "the f-gram set's vocab size")


# -- tags beside a tokenized dataset ---------------------------------------------------------------


def tags_dir(dataset_path: str | os.PathLike, fs) -> Path:
    return Path(dataset_path) / TAGS_DIR / fs.fingerprint[:16]


def tags_for_dataset(
    dataset,
    fs,
    *,
    workers: int | None = None,
    progress: bool = True,
    process_index: int = 0,
    process_count: int = 1,
    barrier: Callable[[str], None] | None = None,
    in_memory_if_read_only: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [N], lengths uint8 [N]) for every token of a tokenized dataset.

    Loads `DATASET/tags/<fingerprint>/` when it exists, matches this set and dataset, and passes
    its checksums; otherwise tags once and saves there (atomically) so training never
    recomputes. A read-only dataset directory falls back to tagging in memory (for training),
    or is a UserError without `in_memory_if_read_only` (for a command whose job is the store).
    In a job of `process_count` processes sharing the dataset directory, every process calls
    this (with a `barrier(name)` that waits for all of them) and tags only its share of the
    tokens.
    """
    if isinstance(dataset, str | os.PathLike):
        from scone_jax.data.dataset import TokenizedDataset

        dataset = TokenizedDataset.open(dataset)
    fs.check_tokenizer(dataset.meta.get("tokenizer_sha256"), str(dataset.path))
    final = tags_dir(dataset.path, fs)
    want = {
        "fgram_fingerprint": fs.fingerprint,
        "tokens_sha256": dataset.meta.get("tokens_sha256"),
        "num_tokens": dataset.num_tokens,
    }
    found = _load_tags(final, want)
    if process_count > 1:
        barrier("tags-checked")  # every process has looked before any starts writing
        if found is None:
            return _tag_split(
                dataset, fs, final, want, process_index, process_count, barrier, workers, progress
            )
    if found is not None:
        return found
    corpus = Corpus.from_dataset(dataset)
    try:
        with atomic_dir(final, overwrite=True) as tmp:
            _, _, hist = tag_corpus(
                fs, corpus, tmp / "ids.npy", tmp / "lengths.npy", workers=workers, progress=progress
            )
            (tmp / "meta.json").write_text(
                json.dumps(
                    {
                        **want,
                        "match_length_histogram": hist.tolist(),
                        "fgram_set": str(fs.path or ""),
                    },
                    indent=2,
                )
                + "\n"
            )
            write_manifest(tmp)
    except PermissionError as e:
        if not in_memory_if_read_only:
            raise UserError(
                f"cannot write tags beside {dataset.path}: {e.strerror} (expected a writable "
                "dataset directory; or tag into files with --token-ids, --out-ids, --out-lengths)"
            ) from None
        print(
            f"warning: cannot write tags beside {dataset.path}; tagging in memory", file=sys.stderr
        )
        ids, lens, _ = tag_corpus(fs, corpus, workers=workers, progress=progress)
        return ids, lens
    except OSError:
        found = _load_tags(final, want)  # another process finished first
        if found is None:
            raise
        return found
    found = _load_tags(final, want)
    assert found is not None
    return found


def _tag_split(
    dataset,
    fs,
    final: Path,
    want: dict,
    process_index: int,
    process_count: int,
    barrier: Callable[[str], None],
    workers: int | None,
    progress: bool,
):
    """Each process tags a contiguous share of the tokens into files process 0 created; process
    0 then adds the histograms, writes meta.json and the manifest, and renames the directory
    into place. Shares may cut documents: each chunk reads K-1 tokens of left context."""
    staging = final.parent / f".{final.name}.split"
    n_tok = dataset.num_tokens
    if process_index == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name, dtype in (("ids.npy", np.int32), ("lengths.npy", np.uint8)):
            reserved_npy(staging / name, dtype, n_tok).flush()
    barrier("tags-staged")
    bounds = np.linspace(0, n_tok, process_count + 1).astype(np.int64)
    span = (int(bounds[process_index]), int(bounds[process_index + 1]))
    _, _, hist = tag_corpus(
        fs,
        Corpus.from_dataset(dataset),
        staging / "ids.npy",
        staging / "lengths.npy",
        workers=workers,
        progress=progress,
        span=span,
    )
    atomic_write_json(staging / f"histogram.{process_index}.json", hist.tolist())
    barrier("tags-written")
    if process_index == 0:
        parts = [staging / f"histogram.{i}.json" for i in range(process_count)]
        total = np.sum([json.loads(part.read_text()) for part in parts], axis=0)
        for part in parts:
            part.unlink()
        (staging / "meta.json").write_text(
            json.dumps(
                {**want, "match_length_histogram": total.tolist(), "fgram_set": str(fs.path or "")},
                indent=2,
            )
            + "\n"
        )
        write_manifest(staging)
        replace_dir(staging, final)
    barrier("tags-ready")
    found = _load_tags(final, want)
    if found is None:
        raise UserError(
            f"tags written by {process_count} processes are missing or damaged in {final} "
            "(expected a dataset directory every process shares)"
        )
    return found


def _load_tags(directory: Path, want: dict):
    """The saved tags if they match `want`; None (tag again) if absent, stale or damaged."""
    try:
        verify_manifest(directory, required=("ids.npy", "lengths.npy", "meta.json"))
    except ChecksumError as e:
        print(f"warning: {e}; tagging again", file=sys.stderr)
        return None
    try:
        meta = json.loads((directory / "meta.json").read_text())
        if any(meta.get(k) != v for k, v in want.items()):
            return None
        ids = np.load(directory / "ids.npy", mmap_mode="r", allow_pickle=False)
        lens = np.load(directory / "lengths.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if ids.shape != (want["num_tokens"],) or lens.shape != ids.shape:
        return None
    return ids, lens


# -- decoding -------------------------------------------------------------------------------------


class StreamingTagger:
    """The f-gram of each new token while decoding.

    `match(last_tokens, token)` is stateless: give the previous K-1 tokens of the document (fewer at
    its start) and the new token. `push(token)` keeps that state itself (O(K) probes: a
    `DecodeTagger` of one sequence); `reset()` at a document boundary. `match_batch` does many
    sequences at once (prefill and batched decoding), with contexts left-padded by -1.
    """

    def __init__(self, fs):
        self.fs, self.t = fs, fs.tagger()
        self.k, self.radix = fs.max_n, fs.key_vocab
        self.reset()

    def reset(self) -> None:
        self._stream = DecodeTagger(self.fs, [[]])  # `push`: a decode batch of one sequence

    def _probe(self, n: int, code_prefix: int, token: int) -> int:
        return self.t.tables[n].slot_one(code_prefix * self.radix + token)

    def match(self, last_tokens, token: int) -> tuple[int, int]:
        w = [int(x) for x in list(last_tokens)[-(self.k - 1) :]] + [int(token)]
        if any(x < 0 for x in w):
            raise UserError("negative token id in streaming tagging input")
        best = (-1, 0)
        for n in range(2, len(w) + 1):  # suffix closure: stop at the first miss
            seg = w[len(w) - n :]
            if any(x >= self.radix for x in seg):
                break
            slot = self._probe(2, seg[0], seg[1])
            for k in range(3, n + 1):
                if slot < 0:
                    break
                slot = self._probe(k, slot, seg[k - 1])
            if slot < 0:
                break
            best = (int(self.t.tables[n].vals[slot]), n)
        return best

    def push(self, token: int) -> tuple[int, int]:
        return self._stream.push_one(0, int(token))

    def match_batch(
        self, contexts: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """contexts [B, K-1] (left-padded with -1), tokens [B] -> (ids [B], lengths [B])."""
        w = np.concatenate(
            [
                np.asarray(contexts, np.int64).reshape(len(tokens), -1)[:, -(self.k - 1) :],
                np.asarray(tokens, np.int64)[:, None],
            ],
            axis=1,
        )
        b, m = w.shape
        ok = (w >= 0) & (w < self.radix)
        v = np.uint64(self.radix)
        ids = np.full(b, -1, np.int32)
        lens = np.zeros(b, np.uint8)
        cur = np.full((b, m - 1), -1, np.int64)  # cur[:, j]: slot of the n-gram starting at j
        sel = np.nonzero(ok[:, :-1] & ok[:, 1:])
        cur[sel] = self.t.tables[2].slots(
            w[:, :-1][sel].astype(np.uint64) * v + w[:, 1:][sel].astype(np.uint64)
        )
        for n in range(2, m + 1):
            if n > 2:
                nxt = np.full((b, m - n + 1), -1, np.int64)
                sel = np.nonzero((cur[:, :-1] >= 0) & ok[:, n - 1 :])  # an unknown id ends it
                nxt[sel] = self.t.tables[n].slots(
                    cur[:, :-1][sel].astype(np.uint64) * v + w[:, n - 1 :][sel].astype(np.uint64)
                )
                cur = nxt
            last = cur[:, -1]
            hit = np.flatnonzero(last >= 0)
            ids[hit] = self.t.tables[n].vals[last[hit]]
            lens[hit] = n
        return ids, lens


class DecodeTagger:
    """The streaming match of B sequences decoding together: `push(tokens)` takes each
    sequence's new token (a list of B ints) and returns each one's f-gram id (-1: none);
    `push_one(b, token)` gives sequence b's (id, length).

    This is on the critical path of every decode step, between two device steps that leave the
    host's caches cold, where each Python call and attribute lookup costs several times its
    warm price: so one call per step, the tables' arrays held in locals, and the probe of
    `HashIndex.slot_one` inlined (measured at batch 1 and 16: about half the time of one
    method call per sequence through `slot_one`).
    """

    def __init__(self, fs, contexts: list):
        """`contexts`: each sequence's tokens so far (its last K-1 set the match state)."""
        tagger = fs.tagger()
        self.k, self.radix = fs.max_n, fs.key_vocab
        self._tables = [None, None] + [
            (t.keys, t.vals, 64 - t.bits, t.capacity - 1)
            for t in (tagger.tables[n] for n in range(2, self.k + 1))
        ]
        self._last = [-1] * len(
            contexts
        )  # each sequence's previous token (-1: none that can match)
        self._slots = [[-1] * (self.k + 1) for _ in contexts]  # slot of the n-gram ending there
        for b, context in enumerate(contexts):
            for token in list(context)[-(self.k - 1) :]:
                self.push_one(b, int(token))

    def push(self, tokens: list[int]) -> list[int]:
        return [self.push_one(b, token)[0] for b, token in enumerate(tokens)]

    def push_one(self, b: int, token: int) -> tuple[int, int]:
        k, radix, tables = self.k, self.radix, self._tables
        last, prev = self._last[b], self._slots[b]
        cur = [-1] * (k + 1)
        best = (-1, 0)
        if 0 <= token < radix and last >= 0:
            # n = 2: keyed by the previous token; longer: by the slot of the shorter n-gram
            code = last
            for n in range(2, k + 1):
                if n > 2:
                    code = prev[n - 1]
                    if code < 0:
                        break
                keys, vals, shift, mask = tables[n]
                key = code * radix + token
                slot = ((key * FIB_INT) & M64) >> shift
                while True:
                    found = keys.item(slot)
                    if found == key or found == M64:
                        break
                    slot = (slot + 1) & mask
                if found != key:
                    break
                cur[n] = slot
                best = (vals.item(slot), n)
        self._slots[b] = cur
        self._last[b] = token if 0 <= token < radix else -1
        return best
