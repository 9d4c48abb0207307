"""Corpus -> dataset on disk: contents, metadata, atomicity, and the `tokenize` command."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scone_jax.cli.main as cli_main
from scone_jax.config.schema import DataConfig
from scone_jax.data.dataset import TOKENS_FILE, TokenizedDataset
from scone_jax.data.text import corpus_fingerprint, default_corpus, iter_documents
from scone_jax.data.tokenize import (
    TOKENIZER_FILE,
    build_dataset,
    dataset_tokenizer,
    prepare_tokenizer,
    tokenize_corpus,
)
from scone_jax.data.tokenizer import Tokenizer
from scone_jax.errors import UserError
from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
# Run only the tokenize command through main's dispatch and error handling, so these tests
# do not depend on the other command modules.
ONLY_TOKENIZE = (
    "import sys, scone_jax.cli.main as m; m.COMMANDS = ('tokenize',); "
    "sys.exit(m.main(sys.argv[1:]))"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.train(
        default_corpus(max_mb=0.2), 400, "bpe", tmp_path_factory.mktemp("tok") / "t.model"
    )


@pytest.fixture
def rng():
    seed = random.randrange(2**32)
    print(f"seed={seed}")  # shown by pytest when a test fails
    return random.Random(seed)


@pytest.fixture
def main(monkeypatch):
    monkeypatch.setattr(cli_main, "COMMANDS", ("tokenize",))
    return cli_main.main


def random_docs(rng: random.Random, n: int) -> list[str]:
    words = ["the", "data", "SCONE", "n-gram", "embedding", "über", "naïve", "数据", "🙂", "x" * 9]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) + rng.choice(["", "\n", "."])
        for _ in range(n)
    ]


def write_files(root: Path, docs: list[str]) -> list[Path]:
    paths = []
    for i, doc in enumerate(docs):
        paths.append(root / f"doc{i:03d}.txt")
        paths[-1].write_text(doc, encoding="utf-8")
    return paths


def test_tokens_per_document_are_encode_plus_eos(tokenizer, tmp_path, rng):
    docs = random_docs(rng, rng.randint(300, 700))  # more than one encode batch
    ds = tokenize_corpus(docs, tokenizer, tmp_path / "ds", progress=False)
    assert ds.num_docs == len(docs) and ds.vocab_size == tokenizer.vocab_size
    for i, doc in enumerate(docs):
        assert ds.doc(i).tolist() == tokenizer.encode(doc) + [tokenizer.eos_id]
    meta = ds.meta
    assert meta["tokenizer_sha256"] == tokenizer.sha256
    assert meta["corpus_sha256"] == corpus_fingerprint(docs)
    assert meta["num_bytes"] == sum(len(d.encode("utf-8")) for d in docs)
    assert meta["append_eos"] is True and meta["eos_id"] == tokenizer.eos_id
    assert Path(meta["tokenizer_path"]) == (tmp_path / "ds" / TOKENIZER_FILE).absolute()
    np.testing.assert_array_equal(ds.token_bytes, tokenizer.token_byte_lengths())
    # Bits-per-byte accounting: token bytes = text bytes + one dummy-prefix space per document.
    assert int(ds.token_bytes[np.asarray(ds.tokens)].sum()) == meta["num_bytes"] + len(docs)
    assert dataset_tokenizer(ds).sha256 == tokenizer.sha256
    tokens_sha256 = hashlib.sha256((tmp_path / "ds" / TOKENS_FILE).read_bytes()).hexdigest()
    assert tokens_sha256 == meta["tokens_sha256"]  # the dataset's fingerprint


def test_no_eos_and_given_corpus_fingerprint(tokenizer, tmp_path, rng):
    docs = random_docs(rng, 5)
    ds = tokenize_corpus(
        iter(docs),
        tokenizer,
        tmp_path / "ds",
        corpus_sha256="abc",
        append_eos=False,
        progress=False,
    )
    assert [ds.doc(i).tolist() for i in range(5)] == tokenizer.encode_batch(docs)
    assert ds.meta["corpus_sha256"] == "abc" and ds.meta["append_eos"] is False


def test_existing_output_directory_is_refused_and_untouched(tokenizer, tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("precious", encoding="utf-8")
    with pytest.raises(UserError, match="already exists"):
        tokenize_corpus(["a doc"], tokenizer, out, progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text(encoding="utf-8") == "precious"


def test_failure_midway_leaves_no_output(tokenizer, tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    write_files(src, random_docs(rng, 3))
    (src / "doc001.txt").write_bytes(b"fine start \xc3\x28 broken")
    with pytest.raises(UserError, match=r"doc001\.txt: invalid UTF-8 at byte offset 11"):
        tokenize_corpus(
            iter_documents([str(src / "*.txt")]), tokenizer, tmp_path / "out" / "ds", progress=False
        )
    assert not (tmp_path / "out" / "ds").exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temporary directory left behind
    with pytest.raises(UserError, match="empty corpus"):
        tokenize_corpus([], tokenizer, tmp_path / "empty", progress=False)
    assert not (tmp_path / "empty").exists()


def test_build_dataset_trains_a_tokenizer_and_keeps_it(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    docs = random_docs(rng, 30)
    (src / "all.txt").write_text("\n\n".join(d.strip() for d in docs), encoding="utf-8")
    cfg = DataConfig(
        corpus=[str(src / "all.txt")], doc_split="blank_line", tokenizer_vocab_size=300
    )
    ds = build_dataset(cfg, tmp_path / "ds", progress=False)
    tok = dataset_tokenizer(ds)
    assert tok.vocab_size == 300 and ds.num_docs == len(docs)
    assert [tok.decode(ds.doc(i)) for i in range(ds.num_docs)] == [d.strip() for d in docs]
    # The same config loading that tokenizer gives the same tokens.
    cfg2 = DataConfig(corpus=cfg.corpus, doc_split="blank_line", tokenizer=str(tok.path))
    assert prepare_tokenizer(cfg2, lambda: iter(()), tmp_path / "unused.model").sha256 == tok.sha256
    ds2 = build_dataset(cfg2, tmp_path / "ds2", progress=False)
    np.testing.assert_array_equal(np.asarray(ds2.tokens), np.asarray(ds.tokens))
    assert not (tmp_path / "unused.model").exists()


def test_cli_tokenizes_and_prints_a_summary(main, tmp_path, rng, capsys):
    src = tmp_path / "src"
    src.mkdir()
    docs = random_docs(rng, 12)
    (src / "d.jsonl").write_text(
        "".join(json.dumps({"body": d}) + "\n" for d in docs), encoding="utf-8"
    )
    out = tmp_path / "ds"
    code = main(
        [
            "tokenize",
            "--corpus",
            str(src / "*.jsonl"),
            "--jsonl-field",
            "body",
            "--vocab-size",
            "300",
            "--out",
            str(out),
            "--no-eos",
            "--no-progress",
        ]
    )
    summary = capsys.readouterr().out.strip()
    assert code == 0
    ds = TokenizedDataset.open(out)
    assert ds.num_docs == 12 and ds.meta["append_eos"] is False
    assert (
        summary.startswith("tokenized 12 docs")
        and ds.tokenizer_sha256[:12] in summary
        and str(out) in summary
    )
    tok = dataset_tokenizer(ds)
    assert [tok.decode(ds.doc(i)) for i in range(12)] == docs


def _check_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("scone-jax tokenize: error:"), err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


def test_cli_bad_inputs_exit_2_with_one_line(main, tmp_path, tokenizer, capsys):
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"ok\n\x80")
    cases = [
        (["--corpus", str(tmp_path / "missing.txt")], ["missing.txt", "does not exist"]),
        (["--corpus", str(tmp_path / "*.nothing")], ["*.nothing", "matches no file"]),
        (["--corpus", str(tmp_path / "blank.txt")], ["empty corpus"]),
        (["--corpus", str(tmp_path / "bad.txt")], ["bad.txt", "invalid UTF-8 at byte offset 3"]),
        (
            ["--corpus", str(tmp_path / "bad.txt"), "--tokenizer", str(tokenizer.path)],
            ["bad.txt", "byte offset 3"],
        ),
        (["--tokenizer", str(tmp_path / "none.model")], ["none.model"]),
        (["--tokenizer", str(tokenizer.path), "--vocab-size", "300"], ["--tokenizer"]),
        (
            ["--corpus", str(tmp_path / "blank.txt"), "--vocab-size", "10"],
            ["tokenizer_vocab_size=10"],
        ),
    ]
    for args, needles in cases:
        out = tmp_path / "ds"
        code = main(["tokenize", *args, "--out", str(out)])
        assert code == 2, args
        _check_one_line_error(capsys.readouterr().err, *needles)
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "blank.txt"]


def test_cli_subprocess_invalid_utf8_and_success(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    write_files(src, random_docs(rng, 4))
    (src / "doc002.txt").write_bytes(b"abc\xffdef")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-c",
        ONLY_TOKENIZE,
        "tokenize",
        "--corpus",
        str(src / "*.txt"),
        "--vocab-size",
        "300",
    ]
    bad = subprocess.run(
        [*cmd, "--out", str(tmp_path / "ds")], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2
    _check_one_line_error(bad.stderr, "doc002.txt", "invalid UTF-8 at byte offset 3")
    assert not (tmp_path / "ds").exists()
    (src / "doc002.txt").write_text("fixed now", encoding="utf-8")
    good = subprocess.run(
        [*cmd, "--out", str(tmp_path / "ds")], capture_output=True, text=True, env=env, timeout=120
    )
    assert good.returncode == 0, good.stderr
    assert "[tokenize ds] done: 4 docs" in good.stderr  # progress went to stderr, off a
    assert "\r" not in good.stderr  # terminal as whole lines
    assert TokenizedDataset.open(tmp_path / "ds").num_docs == 4


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
def test_real_text_slice_round_trips(tmp_path):
    shakespeare = (SHARED_DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[
        :150_000
    ]
    wiki = (SHARED_DATA / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:150_000]
    (tmp_path / "shakespeare.txt").write_text(shakespeare, encoding="utf-8")
    (tmp_path / "wiki.txt").write_text(wiki, encoding="utf-8")
    cfg = DataConfig(
        corpus=[str(tmp_path / "*.txt")], doc_split="blank_line", tokenizer_vocab_size=1024
    )
    ds = build_dataset(cfg, tmp_path / "ds", progress=False)
    docs = list(iter_documents(cfg.corpus, "blank_line"))
    tok = dataset_tokenizer(ds)
    assert ds.num_docs == len(docs) > 100
    assert all(tok.decode(ds.doc(i)) == doc for i, doc in enumerate(docs))
    assert ds.meta["num_bytes"] == sum(len(d.encode("utf-8")) for d in docs)
    assert 2.0 < ds.meta["num_bytes"] / (ds.num_tokens - ds.num_docs) < 8.0  # real compression
