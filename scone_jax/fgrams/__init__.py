"""The f-gram vocabulary: exact counting, top-S selection, storage, longest-match tagging.

    corpus.Corpus            validated token ids + document boundaries (dataset or arrays)
    build.build_fgram_set    count (local or Beam), select, write a set directory with stats
    store.FgramSet           the set on disk: tokens, lengths, counts, 64-bit keys, meta
    tag.tags_for_dataset     per-token (id, length) tags, cached beside a dataset (training)
    tag.StreamingTagger      the same, one new token at a time (decoding)
    tag.DecodeTagger         the same for a batch of sequences, one call per decode step

See docs/fgrams.md and docs/beam.md. This package imports no model or training code.
"""

from scone_jax.fgrams.build import build_fgram_set, select_fgrams
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import (
    DecodeTagger,
    StreamingTagger,
    tag_corpus,
    tag_tokens,
    tags_for_dataset,
)

__all__ = [
    "Corpus",
    "DecodeTagger",
    "FgramSet",
    "StreamingTagger",
    "build_fgram_set",
    "select_fgrams",
    "tag_corpus",
    "tag_tokens",
    "tags_for_dataset",
]
