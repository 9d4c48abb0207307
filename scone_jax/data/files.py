"""How corpus files become lines and records: plain or compressed UTF-8 lines, JSON lines,
parquet rows.

Everything streams: lines come through a buffered (decompressing) reader, parquet rows in
batches of `PARQUET_BATCH_ROWS`, so no file is ever held in memory whole. Every problem with a
file (unreadable, corrupt, truncated, no such column) is a one-line `UserError` naming it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from scone_jax.errors import UserError

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSONL_SUFFIXES = (".jsonl", *(f".jsonl{ext}" for ext in COMPRESSIONS))
PARQUET_SUFFIX = ".parquet"
PARQUET_BATCH_ROWS = 1024
_READ_BUFFER = 1 << 20


def record_format(path: Path) -> str | None:
    """ "jsonl" or "parquet" for record files (by name, compression included); None for text."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIX):
        return "parquet"
    return None


def utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, decoded line with its line break), checking UTF-8 strictly.

    `.gz` and `.zst` files are decompressed on the fly; offsets in errors count decompressed
    bytes.
    """
    compression = COMPRESSIONS.get(path.suffix.lower())
    offset = 0
    try:
        raw_file = (
            io.BufferedReader(pa.input_stream(str(path), compression=compression), _READ_BUFFER)
            if compression
            else open(path, "rb")
        )
    except OSError as e:
        raise UserError(f"cannot read corpus file {path}: {_os_reason(e)}") from None
    with raw_file as f:
        lines = enumerate(f, 1)
        while True:
            try:
                lineno, raw = next(lines)
            except StopIteration:
                return
            except OSError as e:  # a corrupt or truncated compressed stream
                raise UserError(
                    f"cannot read corpus file {path}: {_os_reason(e)} (expected a valid "
                    f"{compression} file)"
                ) from None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                where = "decompressed byte offset" if compression else "byte offset"
                raise UserError(
                    f"{path}: invalid UTF-8 at {where} {offset + e.start} "
                    f"(line {lineno}; expected UTF-8 text)"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(raw)
            yield lineno, line


def jsonl_documents(path: Path, field: str) -> Iterator[str]:
    """The string `field` of each JSON object line (blank lines skipped)."""
    for lineno, line in utf8_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}:{lineno}: not valid JSON ({e.msg}; expected one JSON object per line)"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise UserError(
                f"{path}:{lineno}: no string field {field!r} "
                f"(expected a JSON object with a {field!r} text field; see data.text_field)"
            )
        text = record[field]
        if "\\u" in line:  # an escaped lone surrogate is valid JSON but not text
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise UserError(
                    f"{path}:{lineno}: field {field!r} holds a lone surrogate "
                    f"({text[e.start]!r} at character {e.start}; expected text that UTF-8 can "
                    "encode)"
                ) from None
        yield text


def parquet_documents(path: Path, column: str) -> Iterator[str]:
    """The non-null values of the string `column`, one row group batch at a time."""
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise UserError(
            f"cannot read corpus file {path}: {_os_reason(e)} (expected a parquet file)"
        ) from None
    with parquet:
        schema = parquet.schema_arrow
        if column not in schema.names:
            shown = ", ".join(repr(n) for n in schema.names[:8])
            raise UserError(
                f"{path}: no column {column!r} (columns: {shown or 'none'}; expected a string "
                "column named by data.text_field)"
            )
        kind = schema.field(column).type
        if not _is_text(kind):
            raise UserError(f"{path}: column {column!r} has type {kind} (expected strings)")
        row = 0
        try:
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column]):
                try:
                    values = batch.column(0).to_pylist()
                except UnicodeDecodeError:
                    raise UserError(
                        f"{path}: row {row + _first_bad_utf8(batch.column(0))} of column "
                        f"{column!r} is not valid UTF-8 (expected text)"
                    ) from None
                for value in values:
                    if value is not None:
                        yield value
                row += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            raise UserError(f"cannot read corpus file {path}: {_os_reason(e)}") from None


def _first_bad_utf8(values: pa.Array) -> int:
    for i in range(len(values)):
        try:
            values[i].as_py()
        except UnicodeDecodeError:
            return i
    return 0


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _os_reason(error: Exception) -> str:
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text.strip().splitlines()[0]
