"""`scone-jax fgrams {build,dump,tag,stats}`: the f-gram vocabulary from the command line.

Parsing and reporting only; the work is in `scone_jax.fgrams`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

import numpy as np

from scone_jax.atomic import check_output_path, storage_errors, temporary_sibling
from scone_jax.config.schema import FgramConfig
from scone_jax.errors import UserError

_DEFAULTS = FgramConfig()


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fgrams",
        help="count, inspect and apply the f-gram vocabulary (SCONE n-grams)",
        description="Build the f-gram set (the S most frequent token n-grams of length 2..K), "
        "print it, tag token streams with their longest f-gram match, and report coverage "
        "statistics.",
    )
    sub = p.add_subparsers(dest="fgrams_command", metavar="SUBCOMMAND", required=True)

    b = sub.add_parser(
        "build",
        help="count n-grams in a tokenized corpus and write an f-gram set directory",
        description="Count every token n-gram of length 2..K (never across documents) exactly, "
        "keep those occurring at least --min-count times (Apriori-pruned on prefix and suffix), "
        "and write the --num-fgrams most frequent (ties: shorter first, then token ids) to --out, "
        "with stats.json and stats.png.",
    )
    _add_input(b)
    b.add_argument(
        "--out", required=True, metavar="DIR", help="new f-gram set directory (written atomically)"
    )
    b.add_argument(
        "--max-n",
        type=int,
        default=_DEFAULTS.max_n,
        metavar="K",
        help=f"longest f-gram, in tokens (default {_DEFAULTS.max_n}; >= 2)",
    )
    b.add_argument(
        "--num-fgrams",
        type=int,
        default=_DEFAULTS.num_fgrams,
        metavar="S",
        help=f"how many f-grams to keep (default {_DEFAULTS.num_fgrams}); fewer if fewer qualify",
    )
    b.add_argument(
        "--min-count",
        type=int,
        default=_DEFAULTS.min_count,
        metavar="M",
        help=f"minimum occurrences, at every length (default {_DEFAULTS.min_count})",
    )
    b.add_argument(
        "--backend",
        choices=("local", "beam"),
        default="local",
        help="local: vectorised, multi-threaded, out-of-core when needed (default); "
        "beam: an Apache Beam pipeline (see docs/beam.md)",
    )
    b.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="working memory for local counting, e.g. 2G or 512M (default: half of RAM); "
        "beyond it, state spills to --tmp-dir",
    )
    b.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="threads, or with --backend beam local worker processes (default: all cores)",
    )
    b.add_argument(
        "--tmp-dir", default=None, metavar="DIR", help="scratch space for out-of-core counting"
    )
    b.add_argument(
        "--beam-options",
        default=None,
        metavar="'ARGS'",
        help="Beam pipeline options as one quoted string after '=', e.g. "
        '--beam-options="--runner=DataflowRunner --project=P --region=R '
        '--temp_location=gs://B/tmp" (default: the FnApi runner with --workers worker '
        "processes; docs/beam.md)",
    )
    b.add_argument(
        "--beam-dataset",
        default=None,
        metavar="URL",
        help="where Beam workers read the dataset (a copy on gs://, s3://, hdfs://); "
        "default: the local DATASET path",
    )
    b.add_argument(
        "--beam-work-dir",
        default=None,
        metavar="URL",
        help="shared directory for the pipeline's output files (required on a cluster)",
    )
    b.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="count only DATASET's training split: hold out the documents `scone-jax train` "
        "holds out with data.eval_fraction=F and data.seed=--split-seed (default 0: count all)",
    )
    b.add_argument(
        "--split-seed", type=int, default=0, metavar="N", help="data.seed of that split (default 0)"
    )
    b.add_argument(
        "--no-stats", action="store_true", help="skip tagging the corpus for stats.json/stats.png"
    )
    b.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.set_defaults(func=cmd_build)

    d = sub.add_parser(
        "dump",
        help="print an f-gram set as TSV: id, count, token ids",
        description="Print one f-gram per line in id order: id<TAB>count<TAB>space-separated token "
        "ids (and with --text, <TAB>the decoded text, with \\t, \\n and \\\\ escaped).",
    )
    d.add_argument("fgram_set", metavar="DIR", help="f-gram set directory")
    d.add_argument(
        "--text", action="store_true", help="add a column with the f-gram decoded by the tokenizer"
    )
    d.add_argument(
        "--tokenizer",
        default=None,
        metavar="MODEL",
        help="the tokenizer for --text, a sentencepiece .model or Hugging Face tokenizer.json "
        "(default: the one recorded when the set was built)",
    )
    d.add_argument(
        "--limit", type=int, default=None, metavar="N", help="print only the first N f-grams"
    )
    d.set_defaults(func=cmd_dump)

    t = sub.add_parser(
        "tag",
        help="tag every token with its longest matching f-gram",
        description="For every token, the id of the longest f-gram ending at it (-1 if none) and "
        "its length (0 if none), never across documents. For a DATASET without --out-ids, the tags "
        "are stored beside it (DATASET/tags/<set fingerprint>/), where training reads them.",
    )
    t.add_argument("fgram_set", metavar="DIR", help="f-gram set directory")
    _add_input(t, vocab=False)
    t.add_argument("--out-ids", default=None, metavar="FILE.npy", help="int32 ids, -1 = no match")
    t.add_argument(
        "--out-lengths", default=None, metavar="FILE.npy", help="uint8 match lengths, 0 = no match"
    )
    t.add_argument(
        "--workers", type=int, default=None, metavar="N", help="threads (default: all cores)"
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_tag)

    s = sub.add_parser(
        "stats",
        help="print an f-gram set's statistics (and coverage of a corpus)",
        description="Print the set's size, cutoff count and f-grams per length, plus coverage "
        "(fraction of tokens matched, mean match length, tokens matched per length) of the corpus "
        "it was built from, or of DATASET / --token-ids when given.",
    )
    s.add_argument("fgram_set", metavar="DIR", help="f-gram set directory")
    _add_input(s, vocab=False)
    s.add_argument("--json", default=None, metavar="FILE", help="also write the statistics as JSON")
    s.add_argument("--plot", default=None, metavar="FILE.png", help="also write the histogram plot")
    s.add_argument(
        "--workers", type=int, default=None, metavar="N", help="threads (default: all cores)"
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_stats)


def _add_input(parser, vocab: bool = True) -> None:
    parser.add_argument(
        "dataset",
        nargs="?",
        metavar="DATASET",
        help="tokenized dataset directory (the output of `scone-jax tokenize`)",
    )
    parser.add_argument(
        "--token-ids",
        default=None,
        metavar="FILE.npy",
        help="instead of DATASET: a 1-D integer array of token ids",
    )
    parser.add_argument(
        "--doc-lengths",
        default=None,
        metavar="FILE.npy",
        help="with --token-ids: document lengths, summing to the number of token ids "
        "(default: one document)",
    )
    if vocab:
        parser.add_argument(
            "--vocab-size",
            type=int,
            default=None,
            metavar="V",
            help="with --token-ids: every id must be < V (default: unchecked)",
        )


PLOT_FORMATS = ("", ".png", ".pdf", ".svg")


def _check_outputs_apart(args, outputs: list[tuple[str, str | os.PathLike | None]]) -> None:
    """An output is never an input file, a file inside the f-gram set or the dataset, or another
    output: writing it would destroy what the command reads, or what it wrote first."""
    directories = [
        (what, Path(path).resolve())
        for what, path in (("the f-gram set", args.fgram_set), ("dataset", args.dataset))
        if path
    ]
    files = {Path(p).resolve() for p in (args.token_ids, args.doc_lengths) if p}
    seen: dict[Path, str] = {}
    for flag, path in outputs:
        if not path:
            continue
        resolved = Path(path).resolve()
        if resolved in files:
            raise UserError(f"{flag} {path} is an input file (expected a new path)")
        for what, directory in directories:
            if resolved == directory or directory in resolved.parents:
                raise UserError(
                    f"{flag} {path} is inside {what} {directory} (expected a path outside the "
                    "inputs)"
                )
        if resolved in seen:
            raise UserError(f"{flag} and {seen[resolved]} are the same file {path}")
        seen[resolved] = flag


def _check_input(args) -> None:
    if args.dataset and args.token_ids:
        raise UserError("give either DATASET or --token-ids, not both")
    if args.doc_lengths and not args.token_ids:
        raise UserError("--doc-lengths needs --token-ids")


def _corpus(args, required: bool = True):
    from scone_jax.fgrams.corpus import Corpus, load_arrays

    _check_input(args)
    if args.token_ids:
        return load_arrays(args.token_ids, args.doc_lengths, getattr(args, "vocab_size", None))
    if getattr(args, "vocab_size", None) is not None:
        raise UserError("--vocab-size applies only with --token-ids (a DATASET knows its own)")
    if args.dataset:
        return Corpus.from_dataset(args.dataset)
    if required:
        raise UserError("no input: give a DATASET directory or --token-ids FILE.npy")
    return None


def cmd_build(args) -> int:
    from scone_jax.artifacts.lock import writing
    from scone_jax.fgrams import outofcore
    from scone_jax.fgrams.build import build_fgram_set, check_settings
    from scone_jax.fgrams.stats import format_stats

    check_settings(args.max_n, args.num_fgrams, args.min_count)
    _check_workers(args)
    if args.tmp_dir:
        check_output_path(args.tmp_dir, "--tmp-dir")
    budget = outofcore.parse_size(args.memory_budget) if args.memory_budget else None
    if args.dataset and "://" in args.dataset:
        raise UserError(
            f"{args.dataset}: give a local DATASET path; for workers reading a copy on shared "
            f"storage add --beam-dataset URL"
        )
    corpus = _training_split(args) if args.heldout_fraction else _corpus(args)
    kwargs = {}
    if args.backend == "beam":
        kwargs["beam_options"] = _beam_options(args.beam_options)
        if args.beam_work_dir:
            _check_work_dir(args.beam_work_dir)
        kwargs["beam_dataset"] = args.beam_dataset
        kwargs["beam_work_dir"] = args.beam_work_dir
    elif args.beam_options or args.beam_dataset or args.beam_work_dir:
        raise UserError("--beam-options, --beam-dataset and --beam-work-dir need --backend beam")
    with writing([("--out", args.out)], args.command_line):
        fs = build_fgram_set(
            corpus,
            args.out,
            args.max_n,
            args.num_fgrams,
            args.min_count,
            backend=args.backend,
            memory_budget=budget,
            workers=args.workers,
            tmp_dir=args.tmp_dir,
            with_stats=not args.no_stats,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            **kwargs,
        )
    if fs.stats:
        print(format_stats(fs.stats))
    print(f"wrote {fs.num_fgrams:,} f-grams to {args.out}")
    return 0


def _beam_options(text: str | None) -> list[str] | None:
    if not text:
        return None
    try:
        return shlex.split(text)
    except ValueError as e:  # an unbalanced quote
        raise UserError(f"--beam-options {text!r}: {e} (expected shell-quoted options)") from None


def _check_work_dir(work_dir: str) -> None:
    """A local work dir must be a directory that exists (storage URLs are Beam's to check)."""
    if "://" not in work_dir and not os.path.isdir(work_dir):
        what = "is a file" if os.path.exists(work_dir) else "does not exist"
        raise UserError(f"--beam-work-dir {work_dir} {what} (expected an existing directory)")


def _training_split(args):
    """The documents `scone-jax train` trains on, so that held-out text never chooses f-grams."""
    from scone_jax.data.dataset import TokenizedDataset
    from scone_jax.data.pipeline import split_documents
    from scone_jax.train.fgram_inputs import train_split_corpus

    if not args.dataset:
        raise UserError("--heldout-fraction needs a tokenized DATASET directory (not --token-ids)")
    if not 0.0 < args.heldout_fraction < 1.0:
        raise UserError(f"--heldout-fraction {args.heldout_fraction} (expected 0 < F < 1)")
    if not 0 <= args.split_seed < 2**32:
        raise UserError(
            f"--split-seed {args.split_seed} (expected 0 <= seed < 2**32, as data.seed)"
        )
    dataset = TokenizedDataset.open(args.dataset)
    train_ids, _ = split_documents(dataset.num_docs, args.heldout_fraction, args.split_seed)
    return train_split_corpus(dataset, train_ids, args.heldout_fraction, args.split_seed)


def _check_workers(args) -> None:
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers {args.workers} must be >= 1")


def cmd_dump(args) -> int:
    from scone_jax.fgrams.store import FgramSet

    fs = FgramSet.load(args.fgram_set)
    if args.limit is not None and args.limit < 0:
        raise UserError(f"--limit {args.limit} must be >= 0")
    decode = _decoder(fs, args.tokenizer) if args.text else None
    n = fs.num_fgrams if args.limit is None else min(args.limit, fs.num_fgrams)
    out = sys.stdout
    try:
        for a in range(0, n, 1 << 16):  # blocks: a few seconds for ten million lines
            b = min(n, a + (1 << 16))
            lines = []
            for i, toks, length, count in zip(
                range(a, b),
                fs.tokens[a:b].tolist(),
                fs.lengths[a:b].tolist(),
                fs.counts[a:b].tolist(),
            ):
                line = f"{i}\t{count}\t{' '.join(map(str, toks[:length]))}"
                if decode is not None:
                    line += "\t" + _escape(decode(toks[:length]))
                lines.append(line + "\n")
            out.write("".join(lines))
        out.flush()
    except BrokenPipeError:  # `... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _decoder(fs, tokenizer_path: str | None):
    path = tokenizer_path or fs.meta.get("tokenizer_path")
    if not path:
        raise UserError(
            "--text needs a tokenizer: give --tokenizer MODEL (none was recorded when the set was "
            "built)"
        )
    try:
        from scone_jax.data.tokenizer import load_tokenizer
    except ImportError:
        raise UserError("--text needs scone_jax.data.tokenizer, which is not available") from None
    tok = load_tokenizer(path)
    if fs.tokenizer_sha256 and tok.sha256 != fs.tokenizer_sha256:
        raise UserError(
            f"tokenizer {path} (sha256 {tok.sha256[:12]}...) is not the one the f-gram set was "
            f"counted with ({fs.tokenizer_sha256[:12]}...)"
        )
    return tok.decode


def cmd_tag(args) -> int:
    from scone_jax.fgrams.store import FgramSet
    from scone_jax.fgrams.tag import tag_corpus, tags_dir, tags_for_dataset

    _check_workers(args)
    _check_input(args)
    fs = FgramSet.load(args.fgram_set)
    if bool(args.out_ids) != bool(args.out_lengths):
        raise UserError(
            "give both --out-ids and --out-lengths (or neither, to store tags beside a DATASET)"
        )
    progress = not args.no_progress
    if args.dataset and not args.token_ids and not args.out_ids:
        ids, lengths = tags_for_dataset(
            args.dataset, fs, workers=args.workers, progress=progress, in_memory_if_read_only=False
        )
        _report_tags(lengths, f"stored in {tags_dir(args.dataset, fs)}")
        return 0
    if not args.out_ids:
        raise UserError("--token-ids needs --out-ids FILE.npy and --out-lengths FILE.npy")
    corpus = _corpus(args)
    out_ids, out_lengths = Path(args.out_ids), Path(args.out_lengths)
    _check_outputs_apart(args, [("--out-ids", out_ids), ("--out-lengths", out_lengths)])
    for flag, path in (("--out-ids", out_ids), ("--out-lengths", out_lengths)):
        if not path.parent.is_dir():
            problem = "is not a directory" if path.parent.exists() else "does not exist"
            raise UserError(f"{flag} {path}: directory {path.parent} {problem}")
        check_output_path(path, flag, is_file=True)
    tmp_ids = tmp_lengths = None
    try:
        with storage_errors(f"{out_ids} and {out_lengths}"):
            # .npy: np.save would append it to a name without it
            tmp_ids = temporary_sibling(out_ids, ".npy")
            tmp_lengths = temporary_sibling(out_lengths, ".npy")
            _, lengths, _ = tag_corpus(
                fs, corpus, tmp_ids, tmp_lengths, workers=args.workers, progress=progress
            )
        del lengths
        os.replace(tmp_ids, out_ids)
        os.replace(tmp_lengths, out_lengths)
    except PermissionError as e:
        raise UserError(f"cannot write {e.filename or out_ids.parent}: {e.strerror}") from None
    finally:
        for path in (tmp_ids, tmp_lengths):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    _report_tags(
        np.load(out_lengths, mmap_mode="r", allow_pickle=False),
        f"wrote {out_ids} and {out_lengths}",
    )
    return 0


def _report_tags(lengths, where: str) -> None:
    n = len(lengths)
    matched = int(np.count_nonzero(lengths)) if n else 0
    print(f"tagged {n:,} tokens: {matched / n if n else 0:.2%} matched an f-gram; {where}")


def cmd_stats(args) -> int:
    import json

    from scone_jax.fgrams import stats as st
    from scone_jax.fgrams.store import FgramSet
    from scone_jax.fgrams.tag import tag_corpus

    _check_workers(args)
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output_path(path, flag, is_file=True)
    _check_outputs_apart(args, [("--json", args.json), ("--plot", args.plot)])
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_FORMATS:
        raise UserError(
            f"--plot {args.plot}: no image format {Path(args.plot).suffix!r} (expected a name "
            f"ending {', '.join(f for f in PLOT_FORMATS if f)}, or none for PNG)"
        )
    fs = FgramSet.load(args.fgram_set)
    corpus = _corpus(args, required=False)
    if corpus is not None:
        corpus.check_nonempty()
        _, _, hist = tag_corpus(
            fs, corpus, workers=args.workers, progress=not args.no_progress, keep=False
        )
        stats = st.compute_stats(fs, hist, corpus.num_tokens, corpus.source)
    elif (fs.path / "stats.json").is_file():
        try:
            stats = json.loads((fs.path / "stats.json").read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{fs.path / 'stats.json'} is unreadable: {e}") from None
    else:
        stats = st.compute_stats(fs)
    print(st.format_stats(stats))
    st.save_stats(stats, args.json, args.plot)
    return 0
