"""Corpus reading: globs, document splitting, JSONL, errors, the default corpus, fingerprints."""

from __future__ import annotations

import json
import random

import pytest

from scone_jax.data.text import (
    FingerprintingIterator,
    corpus_fingerprint,
    default_corpus,
    iter_documents,
    resolve_corpus_files,
)
from scone_jax.errors import UserError


@pytest.fixture
def rng():
    seed = random.randrange(2**32)
    print(f"seed={seed}")  # shown by pytest when a test fails
    return random.Random(seed)


def random_text(rng: random.Random, words: int) -> str:
    """Words of letters and some non-ASCII characters, with single spaces and line breaks."""
    alphabet = "abcdefghijklmnopqrstuvwxyzéßж漢字🙂"
    out = []
    for _ in range(words):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
        out.append(rng.choice("   \n"))
    return "".join(out).strip()


def test_glob_matches_are_sorted_and_entries_keep_their_order(tmp_path, rng):
    names = [f"f{i:03d}.txt" for i in rng.sample(range(1000), 12)]
    for name in rng.sample(names, len(names)):  # created in random order
        (tmp_path / name).write_text(name, encoding="utf-8")
    (tmp_path / "z_first.md").write_text("z", encoding="utf-8")
    files = resolve_corpus_files([str(tmp_path / "z_first.md"), str(tmp_path / "f*.txt")])
    assert [f.name for f in files] == ["z_first.md", *sorted(names)]
    # A file named twice is read once, where it first appears.
    again = resolve_corpus_files([str(tmp_path / "f*.txt"), str(tmp_path / sorted(names)[0])])
    assert [f.name for f in again] == sorted(names)


def test_directory_expands_to_its_sorted_non_hidden_files(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_text("two", encoding="utf-8")
    (tmp_path / "a.txt").write_text("one", encoding="utf-8")
    (tmp_path / ".hidden").write_text("no", encoding="utf-8")
    assert list(iter_documents([str(tmp_path)])) == ["one", "two"]


def test_doc_split_file_and_blank_line(tmp_path, rng):
    blocks = [
        [random_text(rng, rng.randint(1, 30)).replace("\n", " ") for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(2, 8))
    ]
    docs = ["\n".join(lines) for lines in blocks]
    separators = [rng.choice(["\n\n", "\n \n", "\n\n\n\t\n"]) for _ in docs]
    text = "\n\n" + "".join(d + s for d, s in zip(docs, separators))
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "b.txt").write_text("last\n", encoding="utf-8")
    paths = [str(tmp_path / "*.txt")]
    assert list(iter_documents(paths, doc_split="blank_line")) == [*docs, "last"]
    assert list(iter_documents(paths, doc_split="file")) == [text, "last\n"]


def test_jsonl_one_document_per_line_from_the_named_field(tmp_path, rng):
    docs = [random_text(rng, rng.randint(1, 20)) for _ in range(rng.randint(3, 10))]
    lines = [
        json.dumps({"body": d, "id": i}, ensure_ascii=rng.random() < 0.5)
        for i, d in enumerate(docs)
    ]
    lines.insert(1, "")  # blank lines are skipped
    lines.append(json.dumps({"body": "  \n"}))  # an empty document is skipped
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(iter_documents([str(tmp_path / "c.jsonl")], text_field="body")) == docs
    with pytest.raises(UserError, match=r"c\.jsonl:1: no string field 'text'"):
        list(iter_documents([str(tmp_path / "c.jsonl")]))


def test_jsonl_line_that_is_not_json_names_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    docs = iter_documents([str(tmp_path / "d.jsonl")])
    assert next(docs) == "fine"
    with pytest.raises(UserError, match=r"d\.jsonl:2: not valid JSON"):
        next(docs)


def test_missing_path_and_empty_glob_are_named(tmp_path):
    with pytest.raises(UserError, match="nope.txt does not exist"):
        list(iter_documents([str(tmp_path / "nope.txt")]))
    with pytest.raises(UserError, match=r"glob '.*\*\.zzz' matches no file"):
        resolve_corpus_files([str(tmp_path / "*.zzz")])
    with pytest.raises(UserError, match="no corpus paths"):
        resolve_corpus_files([])


@pytest.mark.parametrize("doc_split", ["file", "blank_line"])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path, rng, doc_split):
    good = random_text(rng, rng.randint(1, 40)).encode("utf-8")
    (tmp_path / "bad.txt").write_bytes(good + b"\n\xff\xfe tail")
    with pytest.raises(
        UserError, match=rf"bad\.txt: invalid UTF-8 at byte offset {len(good) + 1} "
    ):
        list(iter_documents([str(tmp_path / "bad.txt")], doc_split=doc_split))


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "blank.txt").write_text(" \n\n\t\n", encoding="utf-8")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(UserError, match="empty corpus"):
        list(iter_documents([str(tmp_path / "blank.txt"), str(tmp_path / "empty.jsonl")]))


def test_unknown_doc_split_is_an_error(tmp_path):
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match="doc_split='lines'"):
        list(iter_documents([str(tmp_path / "a.txt")], doc_split="lines"))


def test_default_corpus_is_deterministic_and_capped():
    small = default_corpus(max_mb=0.3)
    assert small == default_corpus(max_mb=0.3)
    assert len(small) > 5 and all(d.strip() for d in small)
    assert sum(len(d.encode("utf-8")) for d in small) <= 300_000
    tiny = default_corpus(max_mb=0.001)
    assert tiny and sum(len(d.encode("utf-8")) for d in tiny) <= 1000
    assert small[: len(tiny) - 1] == tiny[:-1]  # a smaller cap gives a prefix, the last one cut


def test_default_corpus_at_the_default_cap_has_real_text():
    docs = default_corpus()
    total = sum(len(d.encode("utf-8")) for d in docs)
    assert 500_000 < total <= 4_000_000
    assert len(docs) > 100


def test_fingerprint_sees_content_and_document_boundaries(rng):
    docs = [random_text(rng, rng.randint(1, 10)) for _ in range(5)]
    fp = FingerprintingIterator(docs)
    assert list(fp) == docs
    assert fp.num_docs == 5 and fp.num_bytes == sum(len(d.encode()) for d in docs)
    assert fp.sha256 == corpus_fingerprint(list(docs))
    assert corpus_fingerprint(["ab", "c"]) != corpus_fingerprint(["a", "bc"])
    assert corpus_fingerprint(docs) != corpus_fingerprint(docs[:-1])
