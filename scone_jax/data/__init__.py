"""Corpora, sentencepiece tokenizers, tokenized datasets on disk, and the grain input pipeline."""
