"""`scone-jax tokenize`: write a tokenized dataset (and its tokenizer) to a new directory."""

from __future__ import annotations

import argparse

from scone_jax.artifacts.lock import writing
from scone_jax.config.schema import DataConfig
from scone_jax.data.tokenize import TOKENIZER_FILE, build_dataset
from scone_jax.errors import UserError

_DEFAULTS = DataConfig()

DESCRIPTION = f"""\
Tokenize a corpus once and write it to --out as a dataset directory: tokens.bin,
doc_offsets.npy, token_bytes.npy, meta.json and the tokenizer used ({TOKENIZER_FILE}).

Corpus: --corpus files, directories or globs (repeatable; .jsonl, .jsonl.gz and .jsonl.zst
files give one document per line's --text-field, .parquet files one per row of that column).
Without --corpus, the embedded default corpus is used: the docstrings and comments of the
installed Python standard library (no download).

Tokenizer: --tokenizer loads an existing sentencepiece .model or a Hugging Face
tokenizer.json (a local file, copied into OUT); otherwise a sentencepiece model is trained on
the corpus (--vocab-size, --model-type) and saved as OUT/{TOKENIZER_FILE}.
"""

EPILOG = """\
examples:
  scone-jax tokenize --out runs/stdlib-data
  scone-jax tokenize --corpus 'books/*.txt' --doc-split blank_line --vocab-size 4096 --out data/books
  scone-jax tokenize --corpus web.jsonl --text-field content --tokenizer spm.model --out data/web
  scone-jax tokenize --corpus 'shards/*.parquet' --tokenizer tokenizer.json --out data/web
"""  # noqa: E501 (the --help epilog, printed as is: RawDescriptionHelpFormatter)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tokenize",
        help="tokenize a corpus into a dataset directory",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--corpus",
        metavar="PATH_OR_GLOB",
        action="append",
        default=[],
        help="a text, .jsonl or .parquet file, a directory or a glob; repeatable, read in the "
        "order given (glob matches sorted). Default: the embedded standard-library corpus",
    )
    p.add_argument(
        "--doc-split",
        choices=("file", "blank_line"),
        default=_DEFAULTS.doc_split,
        help="plain text: one document per file, or per block separated by blank lines "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--text-field",
        "--jsonl-field",
        dest="text_field",
        metavar="FIELD",
        default=_DEFAULTS.text_field,
        help="the text field of .jsonl records and column of .parquet files (default: "
        "%(default)s; --jsonl-field is its old name)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="MODEL",
        help="load this sentencepiece .model or Hugging Face tokenizer.json instead of training "
        "one",
    )
    p.add_argument(
        "--vocab-size",
        metavar="N",
        type=int,
        help="vocabulary size of the trained tokenizer (default: "
        f"{_DEFAULTS.tokenizer_vocab_size})",
    )
    p.add_argument(
        "--model-type",
        choices=("bpe", "unigram"),
        help="sentencepiece model type of the trained tokenizer (default: "
        f"{_DEFAULTS.tokenizer_type})",
    )
    p.add_argument(
        "--max-default-corpus-mb",
        metavar="MB",
        type=float,
        default=_DEFAULTS.max_default_corpus_mb,
        help="size cap of the default corpus, in MB of UTF-8 text (default: %(default)s)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        required=True,
        help="the dataset directory to create (must not exist; written atomically)",
    )
    p.add_argument(
        "--no-eos",
        action="store_true",
        help="do not append the eos token at the end of each document",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.tokenizer and (args.vocab_size is not None or args.model_type is not None):
        raise UserError(
            "--tokenizer loads a model; --vocab-size/--model-type train one (expected one or the "
            "other)"
        )
    cfg = DataConfig(
        corpus=list(args.corpus),
        doc_split=args.doc_split,
        text_field=args.text_field,
        tokenizer=args.tokenizer or "",
        tokenizer_vocab_size=args.vocab_size
        if args.vocab_size is not None
        else _DEFAULTS.tokenizer_vocab_size,
        tokenizer_type=args.model_type or _DEFAULTS.tokenizer_type,
        max_default_corpus_mb=args.max_default_corpus_mb,
    )
    cfg.validate()
    with writing([("--out", args.out)], args.command_line):
        ds = build_dataset(cfg, args.out, append_eos=not args.no_eos, progress=not args.no_progress)
    print(
        f"tokenized {ds.num_docs} docs, {ds.num_tokens} tokens ({ds.meta['num_bytes']} bytes of "
        f"text), tokenizer vocab {ds.vocab_size} sha256 {ds.tokenizer_sha256[:12]} -> {ds.path}"
    )
    return 0
