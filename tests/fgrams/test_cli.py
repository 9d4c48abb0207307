"""`scone-jax fgrams ...` end to end, and every bad input as a one-line error."""

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scone_jax import atomic
from scone_jax.cli import fgrams_cmd
from scone_jax.cli.main import main
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tag_tokens

from ..conftest import make_dataset, markov_documents
from .reference import brute_select

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = main(
        ["fgrams", *map(str, argv), "--no-progress"]
        if argv[0] in ("build", "tag", "stats")
        else ["fgrams", *map(str, argv)]
    )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def arrays(tmp_path, rng):
    docs = markov_documents(rng, 30, 12, 200)
    docs[3] = docs[3][:1]  # a single-token document
    docs.insert(5, np.zeros(0, np.int64))  # and an empty one
    tokens = np.concatenate(docs)
    np.save(tmp_path / "ids.npy", tokens)
    np.save(tmp_path / "lens.npy", np.array([len(d) for d in docs]))
    return tmp_path, docs, tokens


def test_register_gives_every_subcommand_help():
    parser = argparse.ArgumentParser(prog="scone-jax")
    fgrams_cmd.register(parser.add_subparsers(dest="command"))
    for sub in ("build", "dump", "tag", "stats"):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["fgrams", sub, "--help"])
        assert e.value.code == 0
    args = parser.parse_args(["fgrams", "build", "--token-ids", "x.npy", "--out", "o"])
    assert (args.max_n, args.num_fgrams, args.min_count) == (5, 100_000, 5)


def test_build_dump_tag_stats_from_arrays(arrays, capsys):
    tmp, docs, tokens = arrays
    code, out, _ = run(
        capsys,
        "build",
        "--token-ids",
        tmp / "ids.npy",
        "--doc-lengths",
        tmp / "lens.npy",
        "--out",
        tmp / "set",
        "--max-n",
        4,
        "--num-fgrams",
        200,
        "--min-count",
        3,
    )
    assert code == 0 and "coverage" in out and "cutoff count" in out
    want = brute_select(docs, 4, 200, 3)
    code, out, _ = run(capsys, "dump", tmp / "set")
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(want)
    for i, (line, (gram, count)) in enumerate(zip(lines, want)):
        assert line == f"{i}\t{count}\t{' '.join(map(str, gram))}"
    code, out, _ = run(
        capsys,
        "tag",
        tmp / "set",
        "--token-ids",
        tmp / "ids.npy",
        "--doc-lengths",
        tmp / "lens.npy",
        "--out-ids",
        tmp / "t_ids.npy",
        "--out-lengths",
        tmp / "t_lens.npy",
    )
    assert code == 0 and "matched" in out
    fs = FgramSet.load(tmp / "set")
    ids, lens = tag_tokens(fs, tokens, np.concatenate([[0], np.cumsum([len(d) for d in docs])]))
    assert np.array_equal(np.load(tmp / "t_ids.npy"), ids) and np.array_equal(
        np.load(tmp / "t_lens.npy"), lens
    )
    code, out, _ = run(
        capsys, "stats", tmp / "set", "--json", tmp / "s.json", "--plot", tmp / "s.png"
    )
    assert code == 0 and json.loads((tmp / "s.json").read_text())["coverage"]["num_tokens"] == len(
        tokens
    )
    assert (tmp / "s.png").is_file()
    code, out, _ = run(capsys, "stats", tmp / "set", "--token-ids", tmp / "ids.npy")
    assert code == 0 and "ids.npy" in out


def test_a_disk_without_room_for_the_tags_is_one_error_and_no_file(arrays, capsys, monkeypatch):
    """Tags are written through memory maps, which on a full disk die with SIGBUS mid-write; their
    blocks are reserved first, so a full disk is a one-line error and leaves no file behind."""
    tmp, _, tokens = arrays
    code, _, err = run(
        capsys,
        "build",
        "--token-ids",
        tmp / "ids.npy",
        "--doc-lengths",
        tmp / "lens.npy",
        "--out",
        tmp / "set",
        "--max-n",
        3,
        "--num-fgrams",
        100,
        "--min-count",
        2,
    )
    assert code == 0, err
    before = sorted(os.listdir(tmp))
    asked = []

    def no_space(fd, offset, length):
        asked.append((offset, length))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    code, _, err = run(
        capsys,
        "tag",
        tmp / "set",
        "--token-ids",
        tmp / "ids.npy",
        "--doc-lengths",
        tmp / "lens.npy",
        "--out-ids",
        tmp / "t_ids.npy",
        "--out-lengths",
        tmp / "t_lens.npy",
    )
    assert code == 2 and err.count("\n") == 1
    assert (
        f"cannot write {tmp / 't_ids.npy'} and {tmp / 't_lens.npy'}: [Errno 28] No space left on "
        "device" in err
    )
    assert (
        len(asked) == 1 and asked[0][0] == 0 and asked[0][1] >= 4 * len(tokens)
    )  # the whole ids file
    assert sorted(os.listdir(tmp)) == before


def test_a_refused_permission_for_the_tags_is_one_error_and_no_file(arrays, capsys, monkeypatch):
    """Permission is no storage error (training reads a read-only dataset in memory), yet a
    command writing tag files names the refused file in one line and leaves nothing behind; the
    refusal comes on the second temporary file, after the first was made."""
    tmp, _, _ = arrays
    code, _, err = run(
        capsys, "build", "--token-ids", tmp / "ids.npy", "--out", tmp / "set", "--min-count", 2
    )
    assert code == 0, err
    before = sorted(os.listdir(tmp))
    made = []
    real_mkstemp = atomic.tempfile.mkstemp

    def refuse_the_second(*args, **kwargs):
        if made:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp / "denied"))
        made.append(real_mkstemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refuse_the_second)
    code, _, err = run(
        capsys,
        "tag",
        tmp / "set",
        "--token-ids",
        tmp / "ids.npy",
        "--out-ids",
        tmp / "t_ids.npy",
        "--out-lengths",
        tmp / "t_lens.npy",
    )
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot write {tmp / 'denied'}: Permission denied" in err
    assert len(made) == 1 and sorted(os.listdir(tmp)) == before


def test_tagging_a_dataset_that_refuses_the_tags_is_an_error_not_a_claim(
    tmp_path, capsys, monkeypatch, rng
):
    """`fgrams tag SET DATASET` exists to store the tags: where the dataset refuses them it says
    so (exit 2) rather than tag in memory and report a store that never happened; training's
    own call still falls back to memory."""
    from scone_jax.fgrams import tag as tag_module

    ds = make_dataset(tmp_path / "ds", markov_documents(rng, 12, 20, 100), 12).path
    code, _, err = run(capsys, "build", ds, "--out", tmp_path / "set", "--min-count", 2)
    assert code == 0, err

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(ds / "tags"))

    monkeypatch.setattr(tag_module, "atomic_dir", refused)
    code, out, err = run(capsys, "tag", tmp_path / "set", ds)
    assert code == 2 and err.count("\n") == 1, err
    assert f"cannot write tags beside {ds}: Operation not permitted" in err and "stored" not in out
    assert not (ds / "tags").exists()
    ids, lengths = tag_module.tags_for_dataset(ds, FgramSet.load(tmp_path / "set"), progress=False)
    assert len(ids) == len(lengths) > 0


def test_dataset_workflow_with_text(tmp_path, capsys, rng):
    tok_mod = pytest.importorskip("scone_jax.data.tokenizer")
    from scone_jax.data.tokenize import tokenize_corpus

    words = ["the cat", "sat on", "the mat", "a dog", "ran far", "away", "and", "then"]
    texts = [" ".join(rng.choice(words, 60)) + "." for _ in range(30)]
    tok = tok_mod.Tokenizer.train(texts, 300, out_path=tmp_path / "tok.model")
    ds = tokenize_corpus(texts, tok, tmp_path / "ds", progress=False)
    code, out, err = run(capsys, "build", ds.path, "--out", tmp_path / "set", "--num-fgrams", 50)
    assert code == 0, err
    code, out, _ = run(capsys, "dump", tmp_path / "set", "--text", "--limit", 5)
    rows = [line.split("\t") for line in out.splitlines()]
    assert code == 0 and len(rows) == 5
    for _, _, ids, text in rows:
        assert text == tok.decode([int(x) for x in ids.split()]).replace("\n", "\\n")
    code, out, _ = run(capsys, "tag", tmp_path / "set", ds.path)
    assert code == 0 and "tags" in out
    fs = FgramSet.load(tmp_path / "set")
    assert (ds.path / "tags" / fs.fingerprint[:16] / "ids.npy").is_file()
    other = tok_mod.Tokenizer.train(texts[:10], 290, out_path=tmp_path / "other.model")
    code, _, err = run(capsys, "dump", tmp_path / "set", "--text", "--tokenizer", other.path)
    assert code == 2 and "not the one" in err


BAD = {
    "empty corpus": (["--token-ids", "empty.npy"], "empty"),
    "S = 0": (["--token-ids", "ids.npy", "--num-fgrams", "0"], "at least 1"),
    "K < 2": (["--token-ids", "ids.npy", "--max-n", "1"], "K must be >= 2"),
    "negative ids": (["--token-ids", "neg.npy"], "negative token id -4"),
    "out of vocabulary": (["--token-ids", "ids.npy", "--vocab-size", "5"], "out of vocabulary"),
    "doc lengths": (["--token-ids", "ids.npy", "--doc-lengths", "short.npy"], "sum to"),
    "float ids": (["--token-ids", "float.npy"], "integer"),
    "missing file": (["--token-ids", "nope.npy"], "does not exist"),
    "no input": ([], "no input"),
    "budget": (["--token-ids", "ids.npy", "--memory-budget", "lots"], "not a size"),
    "workers": (["--token-ids", "ids.npy", "--workers", "0"], "--workers 0"),
    "K too large": (["--token-ids", "ids.npy", "--max-n", "65"], "maximum K"),
    "min count": (["--token-ids", "ids.npy", "--min-count", "1000000"], "no n-gram"),
    "both inputs": (["ds", "--token-ids", "ids.npy"], "not both"),
    "not a dataset": (["nowhere"], "not a tokenized dataset"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_build_input_is_one_line_and_leaves_nothing(arrays, capsys, case):
    tmp, _, tokens = arrays
    np.save(tmp / "empty.npy", np.zeros(0, np.int64))
    np.save(tmp / "neg.npy", np.array([1, 2, -4]))
    np.save(tmp / "float.npy", np.array([1.0, 2.0]))
    np.save(tmp / "short.npy", np.array([len(tokens) - 1]))
    argv, message = BAD[case]
    before = set(os.listdir(tmp))
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        code, out, err = run(capsys, "build", *argv, "--out", tmp / "set")
    finally:
        os.chdir(cwd)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert set(os.listdir(tmp)) == before  # no output directory, no temporary sibling


def test_tagging_with_another_tokenizer_is_refused(tmp_path, capsys, rng):
    docs = markov_documents(rng, 20, 5, 200)
    a = make_dataset(tmp_path / "a", docs, 20, tokenizer_sha256="a" * 64)
    b = make_dataset(tmp_path / "b", docs, 20, tokenizer_sha256="b" * 64)
    assert run(capsys, "build", a.path, "--out", tmp_path / "set", "--min-count", 2)[0] == 0
    code, _, err = run(capsys, "tag", tmp_path / "set", b.path)
    assert code == 2 and "tokenizer" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b" / "tags").exists()
    code, _, err = run(
        capsys,
        "tag",
        tmp_path / "set",
        b.path,
        "--out-ids",
        tmp_path / "i.npy",
        "--out-lengths",
        tmp_path / "l.npy",
    )
    assert code == 2 and not (tmp_path / "i.npy").exists() and not (tmp_path / "l.npy").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "set"]


def test_real_subprocess_prints_one_line(arrays):
    tmp, _, _ = arrays
    np.save(tmp / "neg.npy", np.array([3, -1]))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scone_jax.cli.main",
            "fgrams",
            "build",
            "--token-ids",
            str(tmp / "neg.npy"),
            "--out",
            str(tmp / "set"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=300,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "scone-jax fgrams: error: "
        + f"{tmp / 'neg.npy'}: negative token id -1 at position 1 (expected ids >= 0)"
    )
    assert not (tmp / "set").exists()
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "scone_jax.cli.main",
            "fgrams",
            "build",
            "--token-ids",
            str(tmp / "ids.npy"),
            "--doc-lengths",
            str(tmp / "lens.npy"),
            "--out",
            str(tmp / "set"),
            "--min-count",
            "2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    dump = subprocess.run(
        [sys.executable, "-m", "scone_jax.cli.main", "fgrams", "dump", str(tmp / "set")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=300,
    )
    assert dump.returncode == 0 and dump.stdout.startswith("0\t")


def test_bad_tag_and_stats_input(arrays, capsys):
    tmp, _, _ = arrays
    assert (
        run(
            capsys, "build", "--token-ids", tmp / "ids.npy", "--out", tmp / "set", "--min-count", 2
        )[0]
        == 0
    )
    assert (
        run(capsys, "build", "--token-ids", tmp / "ids.npy", "--out", tmp / "set")[2].count(
            "already exists"
        )
        == 1
    )
    np.save(tmp / "neg.npy", np.array([1, -1]))
    before = set(os.listdir(tmp))
    cases = [
        (["tag", tmp / "set", "--token-ids", tmp / "ids.npy"], "--out-ids"),
        (["tag", tmp / "set", "--token-ids", tmp / "ids.npy", "--out-ids", tmp / "x.npy"], "both"),
        (
            [
                "tag",
                tmp / "set",
                "--token-ids",
                tmp / "neg.npy",
                "--out-ids",
                tmp / "x.npy",
                "--out-lengths",
                tmp / "y.npy",
            ],
            "negative",
        ),
        (
            [
                "tag",
                tmp / "set",
                "--token-ids",
                tmp / "ids.npy",
                "--out-ids",
                tmp / "no" / "x.npy",
                "--out-lengths",
                tmp / "y.npy",
            ],
            "does not exist",
        ),
        (["tag", tmp / "nothere", "--token-ids", tmp / "ids.npy"], "not an f-gram set"),
        (["stats", tmp, "--token-ids", tmp / "ids.npy"], "not an f-gram set"),
        (["stats", tmp / "set", "--token-ids", tmp / "neg.npy"], "negative"),
        (["dump", tmp / "set", "--limit", "-1"], "--limit"),
        (["dump", tmp / "set", "--text"], "--tokenizer"),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert set(os.listdir(tmp)) == before


@pytest.mark.parametrize("split", [False, True], ids=["whole", "training-split"])
def test_a_set_counted_on_a_moved_dataset_decodes_with_the_moved_tokenizer(
    tmp_path, capsys, monkeypatch, split
):
    """The dataset's meta records where its tokenizer was at tokenizing; a set counted after the
    dataset moved must point at the copy the dataset holds now, by an absolute path (the set is
    read from anywhere)."""
    corpus = tmp_path / "corpus.txt"
    words = "the cat sat on a mat and then ran far away".split()
    corpus.write_text("\n\n".join(" ".join(words[i % 7 :] + words[: i % 7]) for i in range(60)))
    assert (
        main(
            ["tokenize", "--corpus", str(corpus), "--doc-split", "blank_line"]
            + ["--vocab-size", "280", "--out", str(tmp_path / "first"), "--no-progress"]
        )
        == 0
    )
    (tmp_path / "first").rename(tmp_path / "moved")
    held_out = ["--heldout-fraction", "0.1"] if split else []
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "build", "moved", "--min-count", 2, "--out", "set", *held_out)
    assert code == 0, err
    meta = json.loads((tmp_path / "set" / "meta.json").read_text())
    assert meta["tokenizer_path"] == str(tmp_path / "moved" / "tokenizer.model")
    code, out, err = run(capsys, "dump", tmp_path / "set", "--text", "--limit", 3)
    assert code == 0 and len(out.splitlines()) == 3, err  # decoded: no missing-tokenizer error


def test_the_plot_takes_the_format_its_name_asks_and_plain_permissions(arrays, capsys):
    tmp, _, _ = arrays
    code, _, err = run(
        capsys, "build", "--token-ids", tmp / "ids.npy", "--out", tmp / "set", "--min-count", 2
    )
    assert code == 0, err
    old = os.umask(0o022)
    try:
        for name, magic in (("s.pdf", b"%PDF"), ("s.svg", b"<?xml"), ("s.png", b"\x89PNG")):
            code, _, err = run(capsys, "stats", tmp / "set", "--plot", tmp / name)
            assert code == 0, err
            assert (tmp / name).read_bytes().startswith(magic), name
            assert os.stat(tmp / name).st_mode & 0o777 == 0o644, name
    finally:
        os.umask(old)
