"""Bad input catalogue: for every command, wrong inputs give one clear line, exit 2, and no output.

Each case is an argv (with `{w}` for the shared world of inputs and `{tmp}` for the case's own
empty scratch directory) and a substring the error line must contain. The world is built once
per module: a tokenized dataset, a tiny trained SCONE run, its tables, and every bad input
file. Cases run in-process through `main(argv)`; the world and the scratch directory are
fingerprinted before and after, so a failing command provably overwrote nothing and left no
partial output anywhere. A few cases also run as real processes, for the exit status and the
absence of a traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import scone_jax
import scone_jax.export.table as export_module
from scone_jax.artifacts.hf_checkpoint import hf_config
from scone_jax.artifacts.run_dir import check_run_dir
from scone_jax.cli.main import COMMANDS, main
from scone_jax.config import load_config, save_config
from scone_jax.config.schema import ModelConfig
from scone_jax.data.pipeline import split_documents
from scone_jax.data.tokenize import tokenize_corpus
from scone_jax.data.tokenizer import Tokenizer
from scone_jax.export.hf import export_hf
from scone_jax.export.table import export_table
from scone_jax.fgrams.build import build_fgram_set
from scone_jax.fgrams.corpus import Corpus
from scone_jax.train.fgram_inputs import train_split_corpus
from scone_jax.train.loop import train
from tests.conftest import make_dataset
from tests.train.helpers import cli_run, tiny_overrides

WORDS = "the cat sat on a mat and then ran far away from dog which barked loud at night".split()
FGRAM_SETTINGS = [
    "fgrams.max_n=4",
    "fgrams.num_fgrams=500",
    "fgrams.min_count=2",
    "fgrams.n_layers=1",
]
BASELINE = ["train", "tiny", *tiny_overrides("{w}/ds", "{tmp}/run", 2)]
SCONE = ["train", "tiny_scone", *tiny_overrides("{w}/ds", "{tmp}/run", 2), *FGRAM_SETTINGS]
FROM_CORPUS = [*BASELINE, "data.dataset="]  # tokenize data.corpus into the run directory
RUN = "{w}/run"
TABLE = ["--table", "{w}/table"]

CASES = [
    # sweep
    ("sweep-missing-file", ["sweep", "{w}/nope.yaml", "--out", "{tmp}/sw"], "nope.yaml not found"),
    (
        "sweep-unreadable-file",
        ["sweep", "{w}/unreadable.yaml", "--out", "{tmp}/sw"],
        "unreadable.yaml",
    ),
    (
        "sweep-python-object-yaml",
        ["sweep", "{w}/python_object.yaml", "--out", "{tmp}/sw"],
        "not valid YAML",
    ),
    ("sweep-invalid-utf8", ["sweep", "{w}/latin1.yaml", "--out", "{tmp}/sw"], "latin1.yaml"),
    (
        "sweep-not-a-mapping",
        ["sweep", "{w}/list.yaml", "--out", "{tmp}/sw"],
        "must be a mapping at the top level",
    ),
    (
        "sweep-unknown-key",
        ["sweep", "{w}/sweep_unknown_key.yaml", "--out", "{tmp}/sw"],
        "unknown key(s) ['repeat']",
    ),
    ("sweep-no-points", ["sweep", "{w}/sweep_no_points.yaml", "--out", "{tmp}/sw"], "no points"),
    (
        "sweep-launcher-args-locally",
        ["sweep", "cpu_num_fgrams", "--dry-run", "--launcher-args=--nodes 4"],
        "--launcher-args='--nodes 4' with the local launcher",
    ),
    (
        "sweep-grid-not-a-list",
        ["sweep", "{w}/sweep_bad_grid.yaml", "--out", "{tmp}/sw"],
        "must be a non-empty list",
    ),
    (
        "sweep-out-of-range-value",
        ["sweep", "{w}/sweep_bad_value.yaml", "--out", "{tmp}/sw"],
        "train.steps=-1",
    ),
    (
        "sweep-unset-variable",
        ["sweep", "{w}/sweep_unset_variable.yaml", "--out", "{tmp}/sw"],
        "SCONE_NEVER_SET_VARIABLE is not set",
    ),
    (
        "sweep-bad-override",
        ["sweep", "cpu_num_fgrams", "train.steps=many", "--dry-run"],
        "train.steps",
    ),
    (
        "sweep-out-below-a-file",
        ["sweep", "cpu_num_fgrams", "--out", "{w}/plain_file/sw"],
        "is not a directory",
    ),
    (
        "sweep-unknown-launcher",
        ["sweep", "cpu_num_fgrams", "--launcher", "lsf", "--dry-run"],
        "invalid choice: 'lsf'",
    ),
    # report
    (
        "report-out-is-not-a-report",
        ["report", "{w}/run", "--out", "{w}/ds"],
        "ds exists and is not a sweep report",
    ),
    ("report-missing-dir", ["report", "{w}/nope"], "is not a sweep directory"),
    ("report-run-dir-not-sweep", ["report", "{w}/run"], "is not a sweep directory"),
    (
        "report-out-below-a-file",
        ["report", "{w}/run", "--out", "{w}/plain_file/r"],
        "is not a directory",
    ),
    # tokenize
    (
        "tokenize-corpus-is-a-fifo",
        ["tokenize", "--corpus", "{w}/fifo", "--out", "{tmp}/ds"],
        "fifo is neither a regular file nor a directory",
    ),
    (
        "tokenize-missing-corpus",
        ["tokenize", "--corpus", "{w}/nope.txt", "--out", "{tmp}/ds"],
        "nope.txt does not exist",
    ),
    (
        "tokenize-unreadable-corpus",
        ["tokenize", "--corpus", "{w}/unreadable.txt", "--out", "{tmp}/ds"],
        "unreadable.txt",
    ),
    (
        "tokenize-invalid-utf8",
        ["tokenize", "--corpus", "{w}/bad_utf8.txt", "--out", "{tmp}/ds"],
        "invalid UTF-8",
    ),
    (
        "tokenize-empty-corpus",
        ["tokenize", "--corpus", "{w}/blank.txt", "--out", "{tmp}/ds"],
        "empty corpus",
    ),
    (
        "tokenize-glob-matches-nothing",
        ["tokenize", "--corpus", "{w}/*.nothing", "--out", "{tmp}/ds"],
        "matches no file",
    ),
    (
        "tokenize-malformed-jsonl",
        ["tokenize", "--corpus", "{w}/bad.jsonl", "--out", "{tmp}/ds"],
        "bad.jsonl:2: not valid JSON",
    ),
    (
        "tokenize-jsonl-lone-surrogate",
        ["tokenize", "--corpus", "{w}/surrogate.jsonl", "--out", "{tmp}/ds"],
        "surrogate.jsonl:2: field 'text' holds a lone surrogate",
    ),
    (
        "tokenize-jsonl-lone-surrogate-given-tokenizer",
        [
            "tokenize",
            "--corpus",
            "{w}/surrogate.jsonl",
            "--tokenizer",
            "{w}/tokenizer.model",
            "--out",
            "{tmp}/ds",
        ],
        "surrogate.jsonl:2: field 'text' holds a lone surrogate",
    ),
    (
        "tokenize-parquet-invalid-utf8",
        ["tokenize", "--corpus", "{w}/bad_utf8.parquet", "--out", "{tmp}/ds"],
        "bad_utf8.parquet: row 2 of column 'text' is not valid UTF-8",
    ),
    (
        "tokenize-jsonl-without-field",
        ["tokenize", "--corpus", "{w}/nofield.jsonl", "--out", "{tmp}/ds"],
        "no string field 'text'",
    ),
    (
        "tokenize-vocab-too-small",
        ["tokenize", "--corpus", "{w}/corpus", "--vocab-size", "100", "--out", "{tmp}/ds"],
        "tokenizer_vocab_size=100 (expected >= 260)",
    ),
    (
        "tokenize-vocab-too-large",
        [
            "tokenize",
            "--corpus",
            "{w}/corpus",
            "--vocab-size",
            "100000",
            "--no-progress",
            "--out",
            "{tmp}/ds",
        ],
        "vocab_size=100000 is too large for this corpus",
    ),
    (
        "tokenize-vocab-not-an-int",
        ["tokenize", "--vocab-size", "many", "--out", "{tmp}/ds"],
        "invalid int value: 'many'",
    ),
    (
        "tokenize-negative-default-corpus-cap",
        ["tokenize", "--max-default-corpus-mb", "-1", "--out", "{tmp}/ds"],
        "max_default_corpus_mb=-1.0 (expected > 0)",
    ),
    (
        "tokenize-garbage-tokenizer",
        [
            "tokenize",
            "--corpus",
            "{w}/corpus",
            "--tokenizer",
            "{w}/garbage.model",
            "--out",
            "{tmp}/ds",
        ],
        "not a valid sentencepiece model",
    ),
    (
        "tokenize-unreadable-tokenizer",
        [
            "tokenize",
            "--corpus",
            "{w}/corpus",
            "--tokenizer",
            "{w}/unreadable.model",
            "--out",
            "{tmp}/ds",
        ],
        "unreadable.model",
    ),
    (
        "tokenize-out-exists",
        [
            "tokenize",
            "--corpus",
            "{w}/corpus",
            "--tokenizer",
            "{w}/ds/tokenizer.model",
            "--out",
            "{w}/ds",
        ],
        "ds already exists",
    ),
    (
        "tokenize-out-below-a-file",
        [
            "tokenize",
            "--corpus",
            "{w}/corpus",
            "--tokenizer",
            "{w}/ds/tokenizer.model",
            "--out",
            "{w}/plain_file/ds",
        ],
        "plain_file is not a directory",
    ),
    # fgrams build
    (
        "build-overwrite-its-own-dataset",
        ["fgrams", "build", "{w}/ds", "--min-count", "2", "--out", "{w}/ds", "--overwrite"],
        "ds exists and is not an f-gram set",
    ),
    (
        "build-overwrite-the-working-directory",
        ["fgrams", "build", "{w}/ds", "--min-count", "2", "--out", ".", "--overwrite"],
        "holds the current directory",
    ),
    (
        "build-vocab-size-with-a-dataset",
        ["fgrams", "build", "{w}/ds", "--vocab-size", "100", "--out", "{tmp}/set"],
        "--vocab-size applies only with --token-ids",
    ),
    (
        "build-from-an-fgram-set",
        ["fgrams", "build", "{w}/fgrams", "--out", "{tmp}/set"],
        "fgrams is not a tokenized dataset (no tokens.bin",
    ),
    (
        "build-pickled-token-ids",
        ["fgrams", "build", "--token-ids", "{w}/pickled.npy", "--out", "{tmp}/set"],
        "pickled.npy is not a readable .npy array",
    ),
    (
        "build-pickled-doc-lengths",
        [
            "fgrams",
            "build",
            "--token-ids",
            "{w}/ids.npy",
            "--doc-lengths",
            "{w}/pickled.npy",
            "--out",
            "{tmp}/set",
        ],
        "pickled.npy is not a readable .npy array",
    ),
    (
        "build-unreadable-token-ids",
        ["fgrams", "build", "--token-ids", "{w}/unreadable.npy", "--out", "{tmp}/set"],
        "unreadable.npy",
    ),
    (
        "build-missing-dataset",
        ["fgrams", "build", "{w}/nope", "--out", "{tmp}/set"],
        "nope is not a tokenized dataset",
    ),
    (
        "build-dataset-with-pickled-offsets",
        ["fgrams", "build", "{w}/pickled_ds", "--out", "{tmp}/set"],
        "doc_offsets.npy",
    ),
    (
        "build-empty-token-ids",
        ["fgrams", "build", "--token-ids", "{w}/empty.npy", "--out", "{tmp}/set"],
        "corpus is empty",
    ),
    (
        "build-doc-lengths-do-not-sum",
        [
            "fgrams",
            "build",
            "--token-ids",
            "{w}/ids.npy",
            "--doc-lengths",
            "{w}/short_lengths.npy",
            "--out",
            "{tmp}/set",
        ],
        "sum to 99 but there are 100",
    ),
    (
        "build-2d-token-ids",
        ["fgrams", "build", "--token-ids", "{w}/ids_2d.npy", "--out", "{tmp}/set"],
        "must be a 1-D integer array",
    ),
    (
        "build-float-token-ids",
        ["fgrams", "build", "--token-ids", "{w}/float_ids.npy", "--out", "{tmp}/set"],
        "dtype float64",
    ),
    (
        "build-max-n-1",
        ["fgrams", "build", "--token-ids", "{w}/ids.npy", "--max-n", "1", "--out", "{tmp}/set"],
        "K must be >= 2",
    ),
    (
        "build-max-n-65",
        ["fgrams", "build", "--token-ids", "{w}/ids.npy", "--max-n", "65", "--out", "{tmp}/set"],
        "maximum K = 64",
    ),
    (
        "build-num-fgrams-0",
        [
            "fgrams",
            "build",
            "--token-ids",
            "{w}/ids.npy",
            "--num-fgrams",
            "0",
            "--out",
            "{tmp}/set",
        ],
        "at least 1 f-gram",
    ),
    (
        "build-negative-split-seed",
        ["fgrams", "build", "{w}/ds", "--heldout-fraction", "0.1", "--split-seed", "-1"]
        + ["--out", "{tmp}/set"],
        "--split-seed -1 (expected 0 <= seed < 2**32",
    ),
    (
        "build-memory-budget-nan",
        ["fgrams", "build", "{w}/ds", "--memory-budget", "nan", "--out", "{tmp}/set"],
        "memory budget 'nan' is not a size",
    ),
    (
        "build-memory-budget-below-a-byte",
        ["fgrams", "build", "{w}/ds", "--memory-budget", "0.1", "--out", "{tmp}/set"],
        "memory budget '0.1' is not a size",
    ),
    (
        "build-min-count-0",
        ["fgrams", "build", "--token-ids", "{w}/ids.npy", "--min-count", "0", "--out", "{tmp}/set"],
        "--min-count 0 must be >= 1",
    ),
    (
        "build-ids-beyond-vocab",
        [
            "fgrams",
            "build",
            "--token-ids",
            "{w}/ids.npy",
            "--vocab-size",
            "5",
            "--out",
            "{tmp}/set",
        ],
        "out of vocabulary (expected < vocab size 5)",
    ),
    (
        "build-out-exists",
        ["fgrams", "build", "--token-ids", "{w}/ids.npy", "--out", "{w}/other_fgrams"],
        "already exists",
    ),
    (
        "build-out-below-a-file",
        ["fgrams", "build", "--token-ids", "{w}/ids.npy", "--out", "{w}/plain_file/set"],
        "plain_file is not a directory",
    ),
    (
        "build-tmp-dir-is-a-file",
        [
            "fgrams",
            "build",
            "--token-ids",
            "{w}/ids.npy",
            "--tmp-dir",
            "{w}/plain_file",
            "--out",
            "{tmp}/set",
        ],
        "--tmp-dir",
    ),
    # fgrams dump
    ("dump-missing-set", ["fgrams", "dump", "{w}/nope"], "nope is not an f-gram set"),
    ("dump-file-as-set", ["fgrams", "dump", "{w}/plain_file"], "plain_file is not an f-gram set"),
    (
        "dump-negative-limit",
        ["fgrams", "dump", "{w}/fgrams", "--limit", "-1"],
        "--limit -1 must be >= 0",
    ),
    (
        "dump-text-other-tokenizer",
        ["fgrams", "dump", "{w}/fgrams", "--text", "--tokenizer", "{w}/other.model"],
        "is not the one the f-gram set was counted with",
    ),
    (
        "dump-text-unreadable-tokenizer",
        ["fgrams", "dump", "{w}/fgrams", "--text", "--tokenizer", "{w}/unreadable.model"],
        "unreadable.model",
    ),
    # fgrams tag
    ("tag-dataset-as-the-set", ["fgrams", "tag", "{w}/ds", "{w}/ds"], "ds is not an f-gram set"),
    (
        "tag-out-ids-is-its-input",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/ids.npy",
            "--out-ids",
            "{w}/ids.npy",
            "--out-lengths",
            "{tmp}/l.npy",
        ],
        "ids.npy is an input file",
    ),
    (
        "tag-out-below-a-file",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/ids.npy",
            "--out-ids",
            "{w}/plain_file/i.npy",
            "--out-lengths",
            "{tmp}/l.npy",
        ],
        "plain_file is not a directory",
    ),
    (
        "tag-dataset-of-other-tokenizer",
        ["fgrams", "tag", "{w}/fgrams", "{w}/other_ds"],
        "tokenized with tokenizer bbbbbbbbbbbb",
    ),
    (
        "tag-ids-beyond-set-vocab",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/big_ids.npy",
            "--out-ids",
            "{tmp}/i.npy",
            "--out-lengths",
            "{tmp}/l.npy",
        ],
        "out of vocabulary",
    ),
    (
        "tag-out-ids-is-a-directory",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/ids.npy",
            "--out-ids",
            "{w}/a_dir",
            "--out-lengths",
            "{tmp}/l.npy",
        ],
        "a_dir is a directory",
    ),
    (
        "tag-same-out-files",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/ids.npy",
            "--out-ids",
            "{tmp}/x.npy",
            "--out-lengths",
            "{tmp}/x.npy",
        ],
        "--out-lengths and --out-ids are the same file",
    ),
    (
        "tag-out-ids-inside-the-dataset",
        ["fgrams", "tag", "{w}/fgrams", "{w}/ds", "--out-ids", "{w}/ds/tokens.bin"]
        + ["--out-lengths", "{tmp}/l.npy"],
        "tokens.bin is inside dataset",
    ),
    (
        "tag-out-lengths-inside-the-set",
        ["fgrams", "tag", "{w}/fgrams", "--token-ids", "{w}/ids.npy", "--out-ids", "{tmp}/i.npy"]
        + ["--out-lengths", "{w}/fgrams/keys.npy"],
        "keys.npy is inside the f-gram set",
    ),
    (
        "tag-doc-lengths-with-a-dataset",
        ["fgrams", "tag", "{w}/fgrams", "{w}/ds", "--doc-lengths", "{w}/ids.npy"],
        "--doc-lengths needs --token-ids",
    ),
    (
        "tag-bad-input-keeps-existing-outputs",
        [
            "fgrams",
            "tag",
            "{w}/fgrams",
            "--token-ids",
            "{w}/pickled.npy",
            "--out-ids",
            "{w}/old_ids.npy",
            "--out-lengths",
            "{w}/old_lengths.npy",
        ],
        "not a readable .npy array",
    ),
    # fgrams stats
    (
        "stats-json-below-a-file",
        ["fgrams", "stats", "{w}/fgrams", "--json", "{w}/plain_file/s.json"],
        "plain_file is not a directory",
    ),
    (
        "stats-plot-is-a-directory",
        ["fgrams", "stats", "{w}/fgrams", "--plot", "{w}/a_dir"],
        "a_dir is a directory",
    ),
    (
        "stats-json-inside-the-set",
        ["fgrams", "stats", "{w}/fgrams", "--json", "{w}/fgrams/keys.npy"],
        "keys.npy is inside the f-gram set",
    ),
    (
        "stats-plot-inside-the-dataset",
        ["fgrams", "stats", "{w}/fgrams", "{w}/ds", "--plot", "{w}/ds/tokens.bin"],
        "tokens.bin is inside dataset",
    ),
    (
        "stats-json-is-the-token-ids",
        ["fgrams", "stats", "{w}/fgrams", "--token-ids", "{w}/ids.npy", "--json", "{w}/ids.npy"],
        "ids.npy is an input file",
    ),
    (
        "stats-json-and-plot-one-file",
        ["fgrams", "stats", "{w}/fgrams", "--json", "{tmp}/s.png", "--plot", "{tmp}/s.png"],
        "--plot and --json are the same file",
    ),
    (
        "stats-plot-unknown-format",
        ["fgrams", "stats", "{w}/fgrams", "--plot", "{tmp}/s.jpg"],
        "no image format '.jpg'",
    ),
    ("stats-empty-dataset", ["fgrams", "stats", "{w}/fgrams", "{w}/empty_ds"], "corpus is empty"),
    (
        "stats-dataset-of-other-tokenizer",
        ["fgrams", "stats", "{w}/fgrams", "{w}/other_ds", "--no-progress"],
        "tokenized with tokenizer bbbbbbbbbbbb",
    ),
    # plan
    ("plan-missing-config", ["plan", "{w}/nope.yaml"], "nope.yaml' not found"),
    ("plan-empty-config", ["plan", ""], "'' (expected a YAML config path or a preset name"),
    ("train-empty-config", ["train", " "], "' ' (expected a YAML config path or a preset name"),
    ("plan-devices-beyond-any-mesh", ["plan", "tiny", "--devices", "99999999999"], "1..65536"),
    (
        "plan-device-memory-nan",
        ["plan", "tiny", "--device-memory", "nan"],
        "--device-memory nan (expected a finite size > 0 GiB)",
    ),
    ("plan-unknown-remat", ["plan", "tiny", "model.remat=most"], "model.remat='most'"),
    ("plan-mesh-does-not-divide", ["plan", "tiny", "mesh.data=3"], "mesh data=3"),
    (
        "plan-no-devices",
        ["plan", "tiny", "--devices", "-2"],
        "plan --devices -2 (expected 1..65536)",
    ),
    (
        "plan-zero-devices",
        ["plan", "tiny", "--devices", "0"],
        "plan --devices 0 (expected 1..65536)",
    ),
    (
        "plan-microbatches-do-not-divide",
        ["plan", "tiny", "train.microbatches=3"],
        "train.microbatches=3 (expected a divisor of train.batch_size=16)",
    ),
    # train
    ("train-missing-config", ["train", "{w}/nope.yaml"], "nope.yaml' not found"),
    ("train-unreadable-config", ["train", "{w}/unreadable.yaml"], "unreadable.yaml"),
    (
        "train-python-object-yaml",
        ["train", "{w}/python_object.yaml"],
        "could not determine a constructor",
    ),
    ("train-invalid-utf8-yaml", ["train", "{w}/latin1.yaml"], "not valid UTF-8"),
    ("train-yaml-not-a-mapping", ["train", "{w}/list.yaml"], "must be a mapping at the top level"),
    (
        "train-wrong-type-int",
        [*BASELINE, "train.steps=many"],
        "train.steps='many' has the wrong type (expected int)",
    ),
    (
        "train-wrong-type-float",
        [*BASELINE, "optim.lr=fast"],
        "optim.lr='fast' has the wrong type (expected float)",
    ),
    ("train-negative-steps", [*BASELINE, "train.steps=-1"], "train.steps=-1 (expected > 0)"),
    ("train-max-n-1", [*SCONE, "fgrams.max_n=1"], "fgrams.max_n=1 (expected 2..16)"),
    ("train-max-n-17", [*SCONE, "fgrams.max_n=17"], "fgrams.max_n=17 (expected 2..16)"),
    ("train-num-fgrams-0", [*SCONE, "fgrams.num_fgrams=0"], "fgrams.num_fgrams=0 (expected > 0)"),
    (
        "train-tokenizer-vocab-too-small",
        [*BASELINE, "data.tokenizer_vocab_size=100"],
        "expected >= 260",
    ),
    (
        "train-model-vocab-below-dataset",
        [*BASELINE, "model.vocab_size=10"],
        "smaller than the dataset's vocabulary",
    ),
    ("train-unknown-key", [*BASELINE, "train.stepz=3"], "unknown config key 'train.stepz'"),
    ("train-override-without-equals", [*BASELINE, "train.steps"], "not of the form key=value"),
    (
        "train-invalid-utf8-corpus",
        [*FROM_CORPUS, "data.corpus=[{w}/bad_utf8.txt]"],
        "invalid UTF-8",
    ),
    ("train-empty-corpus", [*FROM_CORPUS, "data.corpus=[{w}/blank.txt]"], "empty corpus"),
    (
        "train-garbage-tokenizer",
        [*FROM_CORPUS, "data.corpus=[{w}/corpus]", "data.tokenizer={w}/garbage.model"],
        "not a valid sentencepiece model",
    ),
    (
        "train-missing-dataset",
        [*BASELINE, "data.dataset={w}/nope"],
        "nope is not a tokenized dataset",
    ),
    ("train-empty-dataset", [*BASELINE, "data.dataset={w}/empty_ds"], "fewer than one window"),
    (
        "train-one-document-and-a-held-out-fraction",
        [*SCONE, "data.dataset={w}/one_doc_ds"],
        "has 1 document, so no whole document can be held out (data.eval_fraction=0.1); "
        "split the text into documents (data.doc_split=blank_line",
    ),
    (
        "train-held-out-split-below-one-eval-batch",
        [*SCONE, "data.eval_fraction=0.02", "train.batch_size=64"],
        "fewer than one eval batch of 64 windows (train.batch_size); raise data.eval_fraction",
    ),
    (
        "train-init-from-missing",
        [*SCONE, "model.init_from={w}/nope"],
        "model.init_from {w}/nope is not a directory",
    ),
    (
        "train-init-from-other-depth",
        [*SCONE, "model.init_from={w}/hf"],
        "n_layers=1 in its config.json, but this run has",
    ),
    (
        "train-init-from-unimplemented-rope",
        [*SCONE, "model.init_from={w}/hf_llama3_rope"],
        "rope_scaling has rope_type='llama3'",
    ),
    (
        "train-fgram-set-of-other-k",
        [*SCONE, "fgrams.fgram_set={w}/fgrams", "fgrams.max_n=5"],
        "has K=4, but fgrams.max_n=5",
    ),
    (
        "train-fgram-set-of-other-tokenizer",
        [*SCONE, "fgrams.fgram_set={w}/other_fgrams"],
        "built with tokenizer bbbbbbbbbbbb",
    ),
    (
        "train-eval-dataset-of-other-tokenizer",
        [*BASELINE, "data.eval_datasets=[{w}/other_ds]"],
        "tokenized with tokenizer bbbbbbbbbbbb",
    ),
    (
        "train-run-dir-below-a-file",
        [*BASELINE, "run_dir={w}/plain_file/run"],
        "plain_file is not a directory",
    ),
    (
        "train-run-dir-of-another-config",
        [*BASELINE, "run_dir={w}/run"],
        "holds a run with a different config",
    ),
    # eval
    ("eval-missing-run", ["eval", "{w}/nope"], "nope is not a run directory"),
    ("eval-file-as-run", ["eval", "{w}/plain_file"], "plain_file is not a run directory"),
    ("eval-tier-without-table", ["eval", RUN, "--tier", "disk"], "--tier disk applies only with"),
    (
        "eval-missing-step",
        ["eval", RUN, "--step", "7"],
        "no checkpoint at step 7 (expected one of [1, 2])",
    ),
    (
        "eval-step-not-a-step",
        ["eval", RUN, "--step", "last"],
        "--step: 'last' (expected a step number, or best",
    ),
    ("eval-best-never-kept", ["eval", RUN, "--step", "best"], "has no best checkpoint"),
    (
        "export-step-not-a-step",
        ["export", RUN, "--out", "{tmp}/table", "--step", "-3"],
        "--step: '-3' (expected a step number, or best",
    ),
    ("eval-unknown-tier", ["eval", RUN, "--tier", "gpu"], "invalid choice: 'gpu'"),
    (
        "eval-missing-dataset",
        ["eval", RUN, "--dataset", "{w}/nope"],
        "nope is not a tokenized dataset",
    ),
    (
        "eval-dataset-of-other-tokenizer",
        ["eval", RUN, "--dataset", "{w}/other_ds"],
        "tokenized with tokenizer bbbbbbbbbbbb",
    ),
    (
        "eval-dataset-too-short",
        ["eval", RUN, "--dataset", "{w}/short_ds"],
        "fewer than one eval batch of 8 windows (train.batch_size); use a larger eval dataset",
    ),
    ("eval-missing-table", ["eval", RUN, "--table", "{w}/nope"], "not a complete f-gram table"),
    (
        "eval-table-of-other-width",
        ["eval", RUN, "--table", "{w}/table_narrow"],
        "has width 16, but",
    ),
    (
        "eval-table-of-other-checkpoint",
        ["eval", RUN, "--table", "{w}/table_step1"],
        "was exported from checkpoint",
    ),
    # export
    (
        "export-missing-run",
        ["export", "{w}/nope", "--out", "{tmp}/table"],
        "nope is not a run directory",
    ),
    (
        "export-out-is-a-table-of-another-step",
        ["export", RUN, "--out", "{w}/table_step1"],
        "already exists, exported from another checkpoint",
    ),
    (
        "export-out-is-another-directory",
        ["export", RUN, "--out", "{w}/not_a_table", "--overwrite"],
        "exists and is not an f-gram table",
    ),
    (
        "export-out-below-a-file",
        ["export", RUN, "--out", "{w}/plain_file/table"],
        "plain_file is not a directory",
    ),
    ("export-out-unknown-scheme", ["export", RUN, "--out", "ftp://host/table"], "unknown scheme"),
    (
        "export-missing-step",
        ["export", RUN, "--out", "{tmp}/table", "--step", "9"],
        "no checkpoint at step 9",
    ),
    (
        "export-zero-batch-rows",
        ["export", RUN, "--out", "{tmp}/table", "--batch-rows", "0"],
        "--batch-rows=0 (expected 1..2**32",
    ),
    (
        "export-huge-shard-rows",
        ["export", RUN, "--out", "{tmp}/table", "--shard-rows", "99999999999"],
        "--shard-rows=99999999999 (expected 1..2**32",
    ),
    (
        "export-unknown-dtype",
        ["export", RUN, "--out", "{tmp}/table", "--dtype", "float64"],
        "invalid choice: 'float64'",
    ),
    (
        "export-backbone-out-exists",
        ["export", RUN, "--out", "{tmp}/table", "--backbone-out", "{w}/not_a_table"],
        "--backbone-out",
    ),
    (
        "export-overwrite-a-directory-not-a-backbone",
        ["export", RUN, "--out", "{tmp}/t", "--backbone-out", "{w}/not_a_table", "--overwrite"],
        "not_a_table exists and is not an exported backbone",
    ),
    (
        "export-overwrite-a-directory-not-hf",
        ["export", RUN, "--out", "{tmp}/t", "--hf-out", "{w}/ds", "--overwrite"],
        "ds exists and is not a Hugging Face checkpoint",
    ),
    (
        "export-backbone-out-contains-the-table",
        ["export", RUN, "--out", "{tmp}/serve/table", "--backbone-out", "{tmp}/serve"],
        "--out {tmp}/serve/table lies inside --backbone-out {tmp}/serve",
    ),
    (
        "export-hf-out-inside-the-table",
        ["export", RUN, "--out", "{tmp}/table", "--hf-out", "{tmp}/table/hf"],
        "--hf-out {tmp}/table/hf lies inside --out {tmp}/table",
    ),
    (
        "export-backbone-and-hf-out-the-same",
        [
            "export",
            RUN,
            "--out",
            "{tmp}/t",
            "--backbone-out",
            "{tmp}/same",
            "--hf-out",
            "{tmp}/same/",
        ],
        "--backbone-out and --hf-out are both {tmp}/same",
    ),
    ("train-negative-data-seed", [*BASELINE, "data.seed=-1"], "data.seed=-1 (expected 0 <="),
    (
        "train-seed-beyond-32-bits",
        [*BASELINE, "train.seed=4294967296"],
        "train.seed=4294967296 (expected 0 <= seed < 2**32)",
    ),
    # generate
    (
        "generate-seed-beyond-32-bits",
        ["generate", RUN, *TABLE, "--prompt", "the", "--seed", "4294967296"],
        "--seed=4294967296 (expected 0 <= seed < 2**32)",
    ),
    (
        "generate-seed-beyond-int64",
        ["generate", RUN, *TABLE, "--prompt", "the", "--seed", "9223372036854775808"],
        "--seed=9223372036854775808",
    ),
    (
        "generate-negative-seed",
        ["generate", RUN, *TABLE, "--prompt", "the", "--seed", "-1"],
        "--seed=-1",
    ),
    (
        "generate-missing-step",
        ["generate", RUN, *TABLE, "--step", "7", "--prompt", "the"],
        "no checkpoint at step 7 (expected one of [1, 2])",
    ),
    (
        "generate-step-with-backbone",
        ["generate", "--backbone", RUN, "--step", "2", "--prompt", "the"],
        "--step=2 with --backbone",
    ),
    (
        "generate-no-model",
        ["generate", "--prompt", "the cat"],
        "give either RUN_DIR or --backbone DIR",
    ),
    ("generate-scone-run-without-table", ["generate", RUN, "--prompt", "the cat"], "pass --table"),
    (
        "generate-negative-temperature",
        ["generate", RUN, *TABLE, "--prompt", "the", "--temperature", "-1"],
        "--temperature=-1.0 (expected a finite value >= 0)",
    ),
    (
        "generate-nan-temperature",
        ["generate", RUN, *TABLE, "--prompt", "the", "--temperature", "nan"],
        "--temperature=nan",
    ),
    (
        "generate-top-p-above-1",
        ["generate", RUN, *TABLE, "--prompt", "the", "--top-p", "1.5"],
        "--top-p=1.5",
    ),
    (
        "generate-negative-top-k",
        ["generate", RUN, *TABLE, "--prompt", "the", "--top-k", "-1"],
        "--top-k=-1",
    ),
    (
        "generate-top-k-while-greedy",
        ["generate", RUN, *TABLE, "--prompt", "the", "--top-k", "5", "--top-p", "0.5"],
        "--top-k=5 and --top-p=0.5 without --temperature",
    ),
    (
        "generate-zero-new-tokens",
        ["generate", RUN, *TABLE, "--prompt", "the", "--max-new-tokens", "0"],
        "--max-new-tokens=0",
    ),
    (
        "generate-new-tokens-not-an-int",
        ["generate", RUN, "--prompt", "the", "--max-new-tokens", "ten"],
        "invalid int value: 'ten'",
    ),
    (
        "generate-beyond-max-seq-len",
        ["generate", RUN, *TABLE, "--prompt", "the", "--max-new-tokens", "500"],
        "exceeds the model's max_seq_len=32",
    ),
    (
        "generate-empty-prompt",
        ["generate", RUN, *TABLE, "--prompt", "the", "--prompt", "", "--max-new-tokens", "2"],
        "prompt 2 of 2 has no tokens",
    ),
    (
        "generate-other-tokenizer",
        ["generate", RUN, *TABLE, "--prompt", "the", "--tokenizer", "{w}/other.model"],
        "is not the model's",
    ),
    (
        "generate-unreadable-tokenizer",
        ["generate", RUN, *TABLE, "--prompt", "the", "--tokenizer", "{w}/unreadable.model"],
        "unreadable.model",
    ),
    (
        "generate-table-of-other-width",
        ["generate", RUN, "--table", "{w}/table_narrow", "--prompt", "the"],
        "has width 16, but",
    ),
    (
        "generate-table-of-other-checkpoint",
        ["generate", RUN, "--table", "{w}/table_step1", "--prompt", "the"],
        "was exported from checkpoint",
    ),
    (
        "generate-missing-backbone",
        ["generate", "--backbone", "{w}/nope", "--prompt", "the"],
        "not a readable exported backbone",
    ),
    # demo
    (
        "demo-wrong-type",
        ["demo", "--out", "{tmp}/demo", "train.steps=many"],
        "train.steps='many' has the wrong type",
    ),
    (
        "demo-unknown-key",
        ["demo", "--out", "{tmp}/demo", "model.famly=llama"],
        "unknown config key 'model.famly'",
    ),
    (
        "demo-out-below-a-file",
        ["demo", "--out", "{w}/plain_file/demo"],
        "plain_file is not a directory",
    ),
]
PYTHON_OBJECT_YAML = "run_dir: !!python/object/apply:os.system ['touch {sentinel}']\n"
PACKAGE = Path(scone_jax.__file__).parent
UNSAFE_LOADER = re.compile(
    r"yaml\.(unsafe_|full_)?load\(|yaml\.(Unsafe|Full)?Loader\b|allow_pickle\s*=\s*True"
    r"|\b(pickle|cloudpickle|dill|marshal)\.loads?\("
)
# run again as real processes: exit status, stderr's last line, no traceback
SUBPROCESS_CASES = (
    "train-python-object-yaml",
    "build-pickled-token-ids",
    "eval-unknown-tier",
    "export-out-is-another-directory",
)


class Unpickled:
    """Pickled into an object array: unpickling it creates the file `sentinel`, which no command may
    do."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return Path.touch, (self.sentinel,)


def export_narrow_table(run_dir: Path, out: Path, width: int) -> None:
    """A complete table of rows narrower than the run's embeddings, as a model with a smaller
    d_model would export (without training one): the export sees that d_model and keeps that many
    columns."""

    def narrow_run(*args, **kwargs):
        run = real_load(*args, **kwargs)
        return dataclasses.replace(
            run,
            cfg=dataclasses.replace(
                run.cfg, model=dataclasses.replace(run.cfg.model, d_model=width)
            ),
        )

    def narrow_rows_fn(*args):
        rows = real_rows_fn(*args)
        return lambda *inputs: rows(*inputs)[:, :width]

    real_load, real_rows_fn = export_module.load_run_params, export_module.fgram_rows_fn
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export_module, "load_run_params", narrow_run)
        patch.setattr(export_module, "fgram_rows_fn", narrow_rows_fn)
        export_table(run_dir, str(out), progress=False)


def make_unreadable(path: Path, content: bytes) -> None:
    """A file the commands cannot read: mode 000, or for root (who reads anything) a directory."""
    if os.geteuid() == 0:
        path.mkdir()
    else:
        path.write_bytes(content)
        path.chmod(0)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    w = tmp_path_factory.mktemp("bad_inputs")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 300)) + "." for _ in range(60)]
    (w / "corpus").mkdir()
    for i, text in enumerate(texts):
        (w / "corpus" / f"{i:02d}.txt").write_text(text)
    tokenizer = Tokenizer.train(texts, 300, out_path=w / "tokenizer.model")
    dataset = tokenize_corpus(texts, tokenizer, w / "ds", progress=False)
    Tokenizer.train(["hello world, other words entirely"] * 20, 280, out_path=w / "other.model")
    build_fgram_set(  # on the run's training split, as `fgrams build --heldout-fraction` counts
        train_split_corpus(dataset, split_documents(dataset.num_docs, 0.1, 0)[0]),
        w / "fgrams",
        max_n=4,
        num_fgrams=500,
        min_count=2,
        with_stats=False,
        progress=False,
    )

    run_settings = tiny_overrides(
        w / "ds", w / "run", 2, **{"checkpoint.every": 1, "model.n_layers": 1}
    )
    train(
        load_config(
            "tiny_scone", run_settings + FGRAM_SETTINGS + [f"fgrams.fgram_set={w / 'fgrams'}"]
        )
    )
    export_table(w / "run", str(w / "table"), progress=False)
    export_table(w / "run", str(w / "table_step1"), step=1, progress=False)
    export_narrow_table(w / "run", w / "table_narrow", width=16)
    export_hf(w / "run", w / "hf", str(w / "table"))
    shutil.copytree(w / "hf", w / "hf_llama3_rope")  # a Llama 3.1-style config.json
    llama = hf_config(ModelConfig(family="llama", d_model=32, n_layers=1, n_heads=2), 300, 2, 1)
    rope = {"rope_type": "llama3", "factor": 32.0, "original_max_position_embeddings": 16}
    (w / "hf_llama3_rope" / "config.json").write_text(json.dumps({**llama, "rope_scaling": rope}))

    docs = [np.arange(60) % 50 + 3] * 10
    other = make_dataset(w / "other_ds", docs, 300, tokenizer_sha256="b" * 64)
    build_fgram_set(
        Corpus.from_dataset(other),
        w / "other_fgrams",
        max_n=4,
        num_fgrams=50,
        min_count=2,
        with_stats=False,
        progress=False,
    )
    sha = tokenizer.sha256
    make_dataset(w / "empty_ds", [], 300, tokenizer_sha256=sha)
    make_dataset(w / "short_ds", [np.array([5, 6, 7])] * 3, 300, tokenizer_sha256=sha)
    make_dataset(w / "one_doc_ds", [np.arange(3000) % 60 + 3], 300, tokenizer_sha256=sha)
    shutil.copytree(w / "other_ds", w / "pickled_ds")
    np.save(
        w / "pickled_ds" / "doc_offsets.npy",
        np.array([Unpickled(w / "UNPICKLED")], object),
        allow_pickle=True,
    )

    np.save(w / "pickled.npy", np.array([Unpickled(w / "UNPICKLED"), 1], object), allow_pickle=True)
    np.save(w / "ids.npy", np.arange(100) % 7)
    np.save(w / "short_lengths.npy", np.array([50, 49]))
    np.save(w / "empty.npy", np.zeros(0, np.int64))
    np.save(w / "ids_2d.npy", np.zeros((3, 4), np.int64))
    np.save(w / "float_ids.npy", np.array([1.0, 2.0]))
    np.save(w / "big_ids.npy", np.array([1, 2, 400_000]))
    np.save(w / "old_ids.npy", np.array([7, 7, 7], np.int32))
    np.save(w / "old_lengths.npy", np.array([1, 1, 1], np.uint8))
    (w / "bad_utf8.txt").write_bytes(b"fine text\n" * 20 + b"broken \xff\xfe here\n")
    (w / "blank.txt").write_text("  \n\n\t\n")
    (w / "bad.jsonl").write_text('{"text": "one"}\n{oops\n')
    (w / "nofield.jsonl").write_text('{"body": "one"}\n')
    (w / "surrogate.jsonl").write_text('{"text": "one"}\n{"text": "lone \\ud800 here"}\n')
    strings = pa.array([b"one", b"two", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": strings}), w / "bad_utf8.parquet")
    (w / "garbage.model").write_bytes(b"not a sentencepiece model")
    (w / "plain_file").write_text("a file where a directory is expected\n")
    os.mkfifo(w / "fifo")
    (w / "a_dir").mkdir()
    (w / "not_a_table").mkdir()
    (w / "not_a_table" / "precious.txt").write_text("keep me\n")
    (w / "python_object.yaml").write_text(PYTHON_OBJECT_YAML.format(sentinel=w / "YAML_RAN"))
    (w / "latin1.yaml").write_bytes(b"run_dir: caf\xe9\n")
    (w / "list.yaml").write_text("- train\n- steps\n")
    (w / "sweep_unknown_key.yaml").write_text("config: tiny\npoints: {a: {}}\nrepeat: 3\n")
    (w / "sweep_no_points.yaml").write_text("config: tiny\n")
    (w / "sweep_bad_value.yaml").write_text("config: tiny\npoints: {a: {train.steps: -1}}\n")
    (w / "sweep_bad_grid.yaml").write_text("config: tiny\ngrid: {fgrams.num_fgrams: 1000}\n")
    (w / "sweep_unset_variable.yaml").write_text(
        "config: tiny\neval_corpora: {x: '${SCONE_NEVER_SET_VARIABLE}/a.txt'}\npoints: {a: {}}\n"
    )
    make_unreadable(w / "unreadable.txt", b"text\n")
    make_unreadable(w / "unreadable.model", (w / "tokenizer.model").read_bytes())
    make_unreadable(w / "unreadable.yaml", b"train: {steps: 2}\n")
    make_unreadable(w / "unreadable.npy", (w / "ids.npy").read_bytes())
    return w


def tree_state(root: Path) -> dict[str, tuple]:
    """Every path under `root` with its kind and, for files, their bytes' hash (size and mtime when
    unreadable). Directory mtimes are left out: a temporary file made and removed is no change."""
    state = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        kind = stat.S_IFMT(info.st_mode)
        if stat.S_ISREG(info.st_mode):
            content = (
                hashlib.sha256(path.read_bytes()).hexdigest()
                if os.access(path, os.R_OK)
                else (info.st_size, info.st_mtime_ns)
            )
            state[str(path.relative_to(root))] = (kind, content)
        else:
            state[str(path.relative_to(root))] = (kind,)
    return state


def expand(argv: list[str], world: Path, tmp: Path) -> list[str]:
    return [a.replace("{w}", str(world)).replace("{tmp}", str(tmp)) for a in argv]


def assert_one_line_error(code, stderr: str, command: str, needle: str) -> None:
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert lines, "no error message"
    last = lines[-1]
    assert last.startswith(f"scone-jax {command}") and ": error: " in last and needle in last, last
    assert len(lines) == 1 or lines[0].startswith("usage:"), (
        stderr
    )  # argparse may print its usage first


@pytest.mark.parametrize(
    "argv, needle", [pytest.param(argv, needle, id=name) for name, argv, needle in CASES]
)
def test_bad_input_is_one_line_and_writes_nothing(
    world, tmp_path, monkeypatch, capsys, argv, needle
):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(scratch)  # anything written relative to the working directory is seen too
    before = tree_state(world)
    try:
        code = main(expand(argv, world, scratch))
    except SystemExit as e:  # argparse's errors
        code = e.code
    err = capsys.readouterr().err
    assert_one_line_error(code, err, argv[0], expand([needle], world, scratch)[0])
    assert tree_state(world) == before
    assert not list(scratch.iterdir())


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_in_a_real_process(world, tmp_path, name):
    argv, needle = next((argv, needle) for n, argv, needle in CASES if n == name)
    before = tree_state(world)
    result = cli_run(expand(argv, world, tmp_path), timeout=120)
    assert_one_line_error(result.returncode, result.stderr, argv[0], needle)
    assert tree_state(world) == before
    assert not list(tmp_path.iterdir())


def test_the_payloads_do_run_when_loaded_unsafely(tmp_path):
    """The control for the cases above: the same pickle and YAML payloads, loaded unsafely, run."""
    np.save(
        tmp_path / "p.npy", np.array([Unpickled(tmp_path / "UNPICKLED")], object), allow_pickle=True
    )
    np.load(tmp_path / "p.npy", allow_pickle=True)
    yaml.unsafe_load(PYTHON_OBJECT_YAML.format(sentinel=tmp_path / "YAML_RAN"))
    assert (tmp_path / "UNPICKLED").exists() and (tmp_path / "YAML_RAN").exists()


def test_no_loader_in_the_package_can_run_code_from_a_file():
    """YAML only through safe_load, arrays never with allow_pickle=True, no pickle or marshal."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if UNSAFE_LOADER.search(line)
    ]
    assert not offenders


def test_every_command_and_subcommand_has_cases():
    covered = {argv[0] if argv[0] != "fgrams" else f"fgrams {argv[1]}" for _, argv, _ in CASES}
    expected = {*COMMANDS, *(f"fgrams {sub}" for sub in ("build", "dump", "tag", "stats"))} - {
        "fgrams"
    }
    assert expected <= covered, expected - covered
    assert len({name for name, _, _ in CASES}) == len(CASES)


def test_a_failed_set_up_leaves_a_planned_run_dir_as_planned(world, tmp_path, capsys):
    """A run dir holding only its config (as `sweep` plans a point) keeps only that after a
    set-up that fails late (model.init_from is read after the dataset and f-grams): a corrected
    config may still use it."""
    run_dir = tmp_path / "run"
    argv = expand([*SCONE, "model.init_from={w}/hf"], world, tmp_path)
    planned = load_config("tiny_scone", argv[2:-1])
    run_dir.mkdir()
    save_config(planned, run_dir / "config.yaml")
    assert main(argv) == 2
    assert "n_layers=1 in its config.json" in capsys.readouterr().err
    assert [p.name for p in run_dir.iterdir()] == ["config.yaml"]
    check_run_dir(load_config("tiny_scone", [*argv[2:-1], "train.steps=3"]))  # still accepted
