"""Record files: parquet rows and compressed JSON lines give the same documents as plain
JSONL, stream in batches, and every bad file is one line naming it."""

from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scone_jax.config.schema import DataConfig
from scone_jax.data import files
from scone_jax.data.text import iter_documents
from scone_jax.data.tokenize import build_dataset, dataset_tokenizer
from scone_jax.errors import UserError


@pytest.fixture
def docs():
    rng = random.Random()
    alphabet = "abcdefgh ijklm\nnopq é中"
    return [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))).strip() or "x"
        for _ in range(rng.randint(20, 60))
    ]


def write_parquet(path, column: dict, row_group_size: int = 7) -> None:
    pq.write_table(pa.table(column), path, row_group_size=row_group_size)


def jsonl_bytes(docs, field="text") -> bytes:
    return "".join(json.dumps({field: d, "n": i}) + "\n" for i, d in enumerate(docs)).encode()


def test_parquet_rows_stream_in_batches_from_the_named_column(tmp_path, docs, monkeypatch):
    values = [*docs[:5], None, *docs[5:]]  # a null row is no document
    write_parquet(tmp_path / "a.parquet", {"body": values, "id": list(range(len(values)))})
    write_parquet(tmp_path / "b.parquet", {"body": ["last one"]})

    def whole_file(*_a, **_k):
        raise AssertionError("read a whole parquet file")

    monkeypatch.setattr(pq.ParquetFile, "read", whole_file)
    monkeypatch.setattr(pq, "read_table", whole_file)
    monkeypatch.setattr(files, "PARQUET_BATCH_ROWS", 3)
    got = list(iter_documents([str(tmp_path / "*.parquet")], text_field="body"))
    assert got == [*docs, "last one"]


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_compressed_jsonl_gives_the_plain_files_documents(tmp_path, docs, compression):
    data = jsonl_bytes(docs, "content")
    path = tmp_path / f"c.jsonl.{compression}"
    if compression == "gz":
        path.write_bytes(gzip.compress(data))
    else:
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(data)
    (tmp_path / "plain.jsonl").write_bytes(data)
    plain = list(iter_documents([str(tmp_path / "plain.jsonl")], text_field="content"))
    assert plain == docs
    assert list(iter_documents([str(path)], text_field="content")) == docs


def test_a_tokenized_parquet_corpus_round_trips(tmp_path, docs):
    write_parquet(tmp_path / "c.parquet", {"text": docs})
    cfg = DataConfig(corpus=[str(tmp_path / "c.parquet")], tokenizer_vocab_size=300)
    ds = build_dataset(cfg, tmp_path / "ds", progress=False)
    tok = dataset_tokenizer(ds)
    assert [tok.decode(ds.doc(i)[:-1]) for i in range(ds.num_docs)] == docs


def one_line_error(paths, field="text") -> str:
    with pytest.raises(UserError) as e:
        list(iter_documents([str(p) for p in paths], text_field=field))
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_files_are_one_line_naming_the_file(tmp_path, docs):
    write_parquet(tmp_path / "nocol.parquet", {"body": docs})
    msg = one_line_error([tmp_path / "nocol.parquet"])
    assert "nocol.parquet: no column 'text' (columns: 'body'" in msg and "text_field" in msg
    write_parquet(tmp_path / "ints.parquet", {"text": list(range(5))})
    assert "ints.parquet: column 'text' has type int64 (expected strings)" in one_line_error(
        [tmp_path / "ints.parquet"]
    )
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    msg = one_line_error([tmp_path / "junk.parquet"])
    assert msg.startswith(f"cannot read corpus file {tmp_path / 'junk.parquet'}: ")
    assert msg.endswith("(expected a parquet file)")
    (tmp_path / "junk.jsonl.gz").write_bytes(b"not gzip")
    msg = one_line_error([tmp_path / "junk.jsonl.gz"])
    assert msg.startswith(f"cannot read corpus file {tmp_path / 'junk.jsonl.gz'}: ")
    assert msg.endswith("(expected a valid gzip file)")
    (tmp_path / "cut.jsonl.zst").write_bytes(b"")
    with pa.CompressedOutputStream(str(tmp_path / "cut.jsonl.zst"), "zstd") as out:
        out.write(jsonl_bytes(docs * 50))
    data = (tmp_path / "cut.jsonl.zst").read_bytes()
    (tmp_path / "cut.jsonl.zst").write_bytes(data[: len(data) // 2])
    assert one_line_error([tmp_path / "cut.jsonl.zst"]).endswith("(expected a valid zstd file)")
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": "\xff"}\n'))
    assert "bad.jsonl.gz: invalid UTF-8 at decompressed byte offset 25 (line 2" in (
        one_line_error([tmp_path / "bad.jsonl.gz"])
    )
