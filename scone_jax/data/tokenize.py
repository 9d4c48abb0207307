"""Turn a corpus into a tokenized dataset on disk, once (what `scone-jax tokenize` runs).

The dataset directory (format in `dataset.py`) also holds a copy of its tokenizer as
`tokenizer.model` (sentencepiece) or `tokenizer.json` (Hugging Face), so it is self-contained:
`meta["tokenizer_path"]` points at that copy and `meta["tokenizer_sha256"]` is its fingerprint.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path

from scone_jax.atomic import atomic_dir, check_output_path
from scone_jax.config.schema import DataConfig
from scone_jax.data.dataset import DatasetWriter, TokenizedDataset
from scone_jax.data.hf_tokenizer import HFTokenizer
from scone_jax.data.text import (
    FingerprintingIterator,
    default_corpus,
    iter_documents,
    resolve_corpus_files,
)
from scone_jax.data.tokenizer import FILE_NAME, Tokenizer, find_tokenizer_file, load_tokenizer
from scone_jax.errors import UserError
from scone_jax.progress import progress_bar

TOKENIZER_FILE = FILE_NAME  # the name of a trained (sentencepiece) tokenizer
BATCH_DOCS = 256


def tokenize_corpus(
    docs: Iterable[str],
    tokenizer: Tokenizer | HFTokenizer,
    out_dir: str | os.PathLike,
    corpus_sha256: str | None = None,
    append_eos: bool = True,
    progress: bool = True,
) -> TokenizedDataset:
    """Encode `docs` in batches and write them as a dataset at `out_dir` (which must not exist).

    Each document becomes `tokenizer.encode(doc) + [eos]` (without eos if not `append_eos`),
    so packed training windows see document ends. `corpus_sha256` defaults to the fingerprint
    of `docs` as read. Written atomically: a failure midway leaves no `out_dir`.
    """
    out_dir = Path(out_dir)
    eos = tokenizer.eos_id
    if append_eos and eos < 0:
        raise UserError(
            f"tokenizer {tokenizer.path} has no eos piece (expected one when appending "
            "eos; train a tokenizer with scone-jax or pass --no-eos)"
        )
    source = FingerprintingIterator(docs)
    with atomic_dir(out_dir) as tmp:
        writer = DatasetWriter(tmp, tokenizer.vocab_size)
        bar = progress_bar(f"tokenize {out_dir.name}", unit=" docs", disable=not progress)
        start = time.perf_counter()
        with bar:
            for batch in _batches(iter(source), BATCH_DOCS):
                for ids in tokenizer.encode_batch(batch):
                    if append_eos:
                        ids.append(eos)
                    writer.add(ids)
                bar.update(len(batch))
                rate = writer.num_tokens / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(tokens=writer.num_tokens, tok_s=f"{rate:,.0f}", refresh=False)
        if source.num_docs == 0:
            raise UserError("empty corpus: no document to tokenize (expected at least one)")
        (tmp / tokenizer.file_name).write_bytes(tokenizer.model_bytes)
        writer.finish(
            tokenizer.token_byte_lengths(),
            tokenizer_sha256=tokenizer.sha256,
            tokenizer_path=str((out_dir / tokenizer.file_name).absolute()),
            corpus_sha256=corpus_sha256 or source.sha256,
            append_eos=append_eos,
            num_bytes=source.num_bytes,
            eos_id=eos,
            bos_id=tokenizer.bos_id,
        )
    return TokenizedDataset.open(out_dir)


def _batches(items: Iterator[str], size: int) -> Iterator[list[str]]:
    while batch := list(islice(items, size)):
        yield batch


def documents_factory(cfg: DataConfig) -> Callable[[], Iterator[str]]:
    """A callable giving a fresh iterator over the configured corpus (the default one if none).

    Files are resolved now, so a missing path fails before any work; the default corpus
    is built on the first call and reused.
    """
    if cfg.corpus:
        resolve_corpus_files(cfg.corpus)
        return lambda: iter_documents(cfg.corpus, cfg.doc_split, cfg.text_field)
    cache: list[list[str]] = []

    def default_docs() -> Iterator[str]:
        if not cache:
            cache.append(default_corpus(cfg.max_default_corpus_mb))
        return iter(cache[0])

    return default_docs


def prepare_tokenizer(
    cfg: DataConfig, docs_factory: Callable[[], Iterable[str]], out_path: str | os.PathLike
) -> Tokenizer | HFTokenizer:
    """Load `cfg.tokenizer` if set (sentencepiece or Hugging Face); else train a sentencepiece
    model on `docs_factory()` and write it to `out_path`."""
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
    return Tokenizer.train(docs_factory(), cfg.tokenizer_vocab_size, cfg.tokenizer_type, out_path)


def build_dataset(
    cfg: DataConfig, out_dir: str | os.PathLike, append_eos: bool = True, progress: bool = True
) -> TokenizedDataset:
    """Corpus -> tokenizer (loaded or trained) -> dataset at `out_dir`, holding its tokenizer.

    A trained tokenizer goes to a temporary file first; the dataset keeps the only copy.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise UserError(
            f"output directory {out_dir} already exists (expected a new path; remove it first)"
        )
    check_output_path(out_dir, "output directory")
    docs = documents_factory(cfg)
    with tempfile.TemporaryDirectory(prefix="scone-tokenizer-") as tmp:
        tokenizer = prepare_tokenizer(cfg, docs, Path(tmp) / TOKENIZER_FILE)
        return tokenize_corpus(docs(), tokenizer, out_dir, append_eos=append_eos, progress=progress)


def dataset_tokenizer_path(dataset: TokenizedDataset) -> Path:
    """Where a dataset's tokenizer is: its own copy (the path recorded at tokenizing is stale
    once the dataset moves), else that recorded path; absolute, for records read elsewhere."""
    path = find_tokenizer_file(dataset.path)
    if not path.is_file():
        path = Path(dataset.meta.get("tokenizer_path", path))
    return path.absolute()


def dataset_tokenizer(dataset: TokenizedDataset) -> Tokenizer | HFTokenizer:
    """The tokenizer a dataset was made with: its own copy, checked against its fingerprint."""
    path = dataset_tokenizer_path(dataset)
    tokenizer = load_tokenizer(path)
    if tokenizer.sha256 != dataset.tokenizer_sha256:
        raise UserError(
            f"tokenizer {path} has sha256 {tokenizer.sha256[:12]}... but dataset {dataset.path} "
            f"was made with {dataset.tokenizer_sha256[:12]}... (expected the same tokenizer)"
        )
    return tokenizer
