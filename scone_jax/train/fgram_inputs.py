"""A run's f-gram inputs: its f-gram set (given, or counted on the training split), the dataset's
tags, and the batcher that turns them into each batch's prefix forest (scone_jax/forest/)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scone_jax.config.schema import FgramConfig
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.data.pipeline import split_documents
from scone_jax.data.tokenize import dataset_tokenizer_path
from scone_jax.errors import UserError
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tags_for_dataset
from scone_jax.forest.batcher import FgramBatcher
from scone_jax.forest.layout import round_up
from scone_jax.forest.microbatch import MicrobatchForests
from scone_jax.train.fgram_dropout import FgramDropout


@dataclass
class FgramInputs:
    """A run's f-gram set and the batcher that feeds its tags to the model."""

    fgram_set: FgramSet
    batcher: FgramBatcher
    microbatches: int = 1
    drop_rate: float = 0.0  # fgrams.drop_rate: training batches only
    drop_seed: int = 0

    def transform(self, batcher: FgramBatcher | None = None) -> FgramBatcher | MicrobatchForests:
        """What turns a batch's tags into its forest: one forest, or one per microbatch."""
        batcher = batcher or self.batcher
        return MicrobatchForests(batcher, self.microbatches) if self.microbatches > 1 else batcher

    def train_transform(self):
        """`transform()` for the training stream: with f-gram dropout when it is on."""
        if not self.drop_rate:
            return self.transform()
        return FgramDropout(self.transform(), self.drop_rate, self.drop_seed)

    def batcher_for(self, dataset: TokenizedDataset, progress: bool = True) -> FgramBatcher:
        """The same buffers for another dataset (an extra eval set), tagged with this set."""
        ids, lengths = tags_for_dataset(dataset, self.fgram_set, progress=progress)
        return replace(self.batcher, tag_ids=ids, tag_lengths=lengths)


def train_split_corpus(
    dataset: TokenizedDataset,
    train_ids: np.ndarray,
    heldout_fraction: float | None = None,
    split_seed: int | None = None,
) -> Corpus:
    """The training documents only: held-out text must not choose the f-grams. The split is
    recorded in the set's meta (`training_split`), with the fraction and seed that drew it when
    given, so that a run on another split of the dataset can tell that its held-out text did."""
    lengths = dataset.doc_lengths[train_ids]
    tokens = (
        np.concatenate([dataset.doc(i) for i in train_ids])
        if len(train_ids)
        else np.zeros(0, np.int64)
    )
    corpus = Corpus.from_arrays(
        tokens,
        lengths,
        vocab_size=dataset.vocab_size,
        source=f"{dataset.path} (training split)",
        tokenizer_sha256=dataset.tokenizer_sha256,
        # the set's meta records it, as for a whole dataset: `fgrams dump --text` decodes with it
        # (the dataset's own copy: the path recorded at tokenizing is stale once it moves)
        tokenizer_path=str(dataset_tokenizer_path(dataset)),
    )
    corpus.split = {
        "dataset_tokens_sha256": dataset.meta.get("tokens_sha256"),
        "num_docs": dataset.num_docs,
        "train_docs_sha256": _docs_sha256(train_ids),
        "heldout_fraction": heldout_fraction,
        "split_seed": split_seed,
    }
    corpus.split_parent_offsets = np.asarray(dataset.doc_offsets, np.int64)
    corpus.split_doc_ids = np.sort(np.asarray(train_ids, np.int64))
    return corpus


def _docs_sha256(doc_ids: np.ndarray) -> str:
    return hashlib.sha256(np.sort(np.asarray(doc_ids, "<i8")).tobytes()).hexdigest()


def check_counted_on_training_split(
    fgram_set: FgramSet, dataset: TokenizedDataset, train_ids: np.ndarray
) -> None:
    """Warn when a given set was counted on text that includes this run's held-out documents:
    all of the dataset, or another split of it. Either makes held-out perplexity optimistic."""
    held_out = dataset.num_docs - len(train_ids)
    ours = dataset.meta.get("tokens_sha256")
    if not held_out or ours is None:
        return
    fix = (
        "count the training split (`scone-jax fgrams build DATASET --heldout-fraction F "
        "--split-seed S` with the run's data.eval_fraction and data.seed) or leave "
        "fgrams.fgram_set empty"
    )
    split = fgram_set.meta.get("training_split") or {}
    if fgram_set.meta.get("tokens_sha256") == ours:
        print(
            f"warning: f-gram set {fgram_set.path} was counted on all of {dataset.path}, its "
            f"{held_out} held-out document(s) included, so held-out perplexity is optimistic; "
            + fix,
            file=sys.stderr,
        )
        return
    if split.get("dataset_tokens_sha256") != ours or split.get("train_docs_sha256") == _docs_sha256(
        train_ids
    ):
        return  # another corpus, or this very split
    fraction, seed = split.get("heldout_fraction"), split.get("split_seed")
    if fraction is None or seed is None:
        what = f"some of this run's {held_out} held-out document(s) may have chosen its f-grams"
    else:
        set_train_ids, _ = split_documents(dataset.num_docs, fraction, seed)
        eval_ids = np.setdiff1d(np.arange(dataset.num_docs), train_ids)
        leaked = len(np.intersect1d(eval_ids, set_train_ids))
        if not leaked:
            return  # the set held out every document this run holds out
        what = f"{leaked} of this run's {held_out} held-out document(s) chose its f-grams"
        what = f"(--heldout-fraction {fraction} --split-seed {seed}): " + what
    print(
        f"warning: f-gram set {fgram_set.path} was counted on another split of {dataset.path} "
        f"{what}, so held-out perplexity is optimistic; " + fix,
        file=sys.stderr,
    )


def load_or_build_fgram_set(
    cfg: FgramConfig,
    dataset: TokenizedDataset,
    train_ids: np.ndarray,
    run_dir: str | Path,
    progress: bool = True,
    check_split: bool = True,
) -> FgramSet:
    """`fgrams.fgram_set` if given (checked against the tokenizer and K, and with
    `check_split`, against the run's held-out documents), else RUN_DIR/fgrams, counted on the
    training split on first use."""
    if cfg.fgram_set:
        fgram_set = FgramSet.load(cfg.fgram_set)
        if check_split:
            check_counted_on_training_split(fgram_set, dataset, train_ids)
    else:
        out = Path(run_dir) / "fgrams"
        if not (out / "meta.json").is_file():
            build_fgram_set(
                train_split_corpus(dataset, train_ids),
                out,
                max_n=cfg.max_n,
                num_fgrams=cfg.num_fgrams,
                min_count=cfg.min_count,
                progress=progress,
            )
        fgram_set = FgramSet.load(out)
    if fgram_set.max_n != cfg.max_n:
        raise UserError(
            f"f-gram set {fgram_set.path} has K={fgram_set.max_n}, but fgrams.max_n={cfg.max_n}"
        )
    if fgram_set.tokenizer_sha256 and fgram_set.tokenizer_sha256 != dataset.tokenizer_sha256:
        raise UserError(
            f"f-gram set {fgram_set.path} was built with tokenizer "
            f"{fgram_set.tokenizer_sha256[:12]}, but the dataset uses "
            f"{dataset.tokenizer_sha256[:12]}"
        )
    return fgram_set


PERMUTE_ROWS_SEED = 20250203  # the fixed permutation of the fgrams.permute_rows control


def prepare_fgram_inputs(
    cfg: FgramConfig,
    dataset: TokenizedDataset,
    train_ids: np.ndarray,
    run_dir: str | Path,
    positions_per_host: int,
    groups: int,
    progress: bool = True,
    process_index: int = 0,
    process_count: int = 1,
    barrier=None,
    microbatches: int = 1,
    seed: int = 0,
) -> FgramInputs:
    """The run's f-gram set, the dataset's tags (each of `process_count` processes tagging its
    share, see `tags_for_dataset`), and a batcher with `groups` node buffers (the host's data
    shards) that grow in steps of about 1/32 of a group's positions."""
    fgram_set = load_or_build_fgram_set(  # the session has checked its split on process 0
        cfg, dataset, train_ids, run_dir, progress, check_split=False
    )
    ids, lengths = tags_for_dataset(
        dataset,
        fgram_set,
        progress=progress,
        process_index=process_index,
        process_count=process_count,
        barrier=barrier,
    )
    backoffs = fgram_set.backoff_ids() if cfg.drop_to == "suffix" or cfg.suffix_rows else None
    granule = max(positions_per_host // (32 * groups * cfg.block_size * microbatches), 1)
    batcher = FgramBatcher(
        ids,
        lengths,
        fgram_set.tokens,
        fgram_set.lengths,
        block=cfg.block_size,
        granule=granule,
        dedup=cfg.dedup,
        groups=groups,
        capacity=round_up(-(-cfg.capacity // cfg.block_size), granule),
        backoff_ids=backoffs if cfg.drop_to == "suffix" else None,
        suffix_parent=backoffs if cfg.suffix_rows else None,
    )
    if cfg.permute_rows:
        # the control: f-gram w is embedded as the f-gram a fixed permutation gives it (after
        # the batcher is built, so the backoffs' lengths stay those of the set's own f-grams)
        order = np.random.default_rng(PERMUTE_ROWS_SEED).permutation(len(fgram_set.lengths))
        batcher.fgram_tokens = np.asarray(fgram_set.tokens)[order]
        batcher.fgram_lengths = np.asarray(fgram_set.lengths)[order]
        if cfg.suffix_rows:  # the suffixes of the f-gram w is embedded as, in the same ids
            embedded_as = np.empty_like(order)
            embedded_as[order] = np.arange(len(order))
            parent = backoffs[order]
            batcher.suffix_parent = np.where(parent >= 0, embedded_as[np.maximum(parent, 0)], -1)
    return FgramInputs(
        fgram_set=fgram_set,
        batcher=batcher,
        microbatches=microbatches,
        drop_rate=cfg.drop_rate,
        drop_seed=seed,
    )
