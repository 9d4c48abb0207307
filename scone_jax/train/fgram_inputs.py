"""A run's f-gram inputs: its f-gram set (given, or counted on the training split), the dataset's
tags, and the batcher that turns them into each batch's prefix forest (scone_jax/forest/)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scone_jax.config.schema import FgramConfig
from scone_jax.data.dataset import TokenizedDataset
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


def train_split_corpus(dataset: TokenizedDataset, train_ids: np.ndarray) -> Corpus:
    """The training documents only: held-out text must not choose the f-grams."""
    lengths = dataset.doc_lengths[train_ids]
    tokens = (
        np.concatenate([dataset.doc(i) for i in train_ids])
        if len(train_ids)
        else np.zeros(0, np.int64)
    )
    return Corpus.from_arrays(
        tokens,
        lengths,
        vocab_size=dataset.vocab_size,
        source=f"{dataset.path} (training split)",
        tokenizer_sha256=dataset.tokenizer_sha256,
        # the set's meta records it, as for a whole dataset: `fgrams dump --text` decodes with it
        tokenizer_path=dataset.meta.get("tokenizer_path"),
    )


def load_or_build_fgram_set(
    cfg: FgramConfig,
    dataset: TokenizedDataset,
    train_ids: np.ndarray,
    run_dir: str | Path,
    progress: bool = True,
) -> FgramSet:
    """`fgrams.fgram_set` if given (checked against the tokenizer and K), else RUN_DIR/fgrams,
    counted on the training split on first use."""
    if cfg.fgram_set:
        fgram_set = FgramSet.load(cfg.fgram_set)
        held_out = dataset.num_docs - len(train_ids)
        counted_on = fgram_set.meta.get("tokens_sha256")
        if held_out and counted_on is not None and counted_on == dataset.meta.get("tokens_sha256"):
            print(
                f"warning: f-gram set {cfg.fgram_set} was counted on all of {dataset.path}, its "
                f"{held_out} held-out document(s) included, so held-out perplexity is optimistic; "
                "count the training split (`scone-jax fgrams build DATASET --heldout-fraction F "
                "--split-seed S` with the run's data.eval_fraction and data.seed) or leave "
                "fgrams.fgram_set empty",
                file=sys.stderr,
            )
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
    fgram_set = load_or_build_fgram_set(cfg, dataset, train_ids, run_dir, progress)
    ids, lengths = tags_for_dataset(
        dataset,
        fgram_set,
        progress=progress,
        process_index=process_index,
        process_count=process_count,
        barrier=barrier,
    )
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
        backoff_ids=fgram_set.backoff_ids() if cfg.drop_to == "suffix" else None,
    )
    if cfg.permute_rows:
        # the control: f-gram w is embedded as the f-gram a fixed permutation gives it (after
        # the batcher is built, so the backoffs' lengths stay those of the set's own f-grams)
        order = np.random.default_rng(PERMUTE_ROWS_SEED).permutation(len(fgram_set.lengths))
        batcher.fgram_tokens = np.asarray(fgram_set.tokens)[order]
        batcher.fgram_lengths = np.asarray(fgram_set.lengths)[order]
    return FgramInputs(
        fgram_set=fgram_set,
        batcher=batcher,
        microbatches=microbatches,
        drop_rate=cfg.drop_rate,
        drop_seed=seed,
    )
