"""Where text comes from: files, globs, JSONL and parquet, or an embedded default corpus.

A corpus is an iterator of documents (non-empty strings), read lazily and in a fixed
order, so the same inputs always give the same documents and the same fingerprint.

* Plain text: one document per file (`doc_split="file"`) or per block of lines separated by
  blank lines (`doc_split="blank_line"`).
* Records (`files.py`): `.jsonl` (also `.jsonl.gz`, `.jsonl.zst`) gives one document per line,
  `.parquet` one per row, taken from the string field or column `text_field` (default `text`).
* No corpus given: `default_corpus()`, the docstrings and comments of the installed Python
  standard library, read from its `.py` sources with `ast` (nothing is imported or downloaded).
"""

from __future__ import annotations

import ast
import glob
import hashlib
import os
import sysconfig
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from scone_jax.data.files import jsonl_documents, parquet_documents, record_format, utf8_lines
from scone_jax.errors import UserError

DOC_SPLITS = ("file", "blank_line")
_GLOB_CHARS = "*?["
# Standard-library folders that hold tests or third-party code rather than documentation.
_SKIP_STDLIB_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def resolve_corpus_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, directories and globs into a sorted, de-duplicated file list.

    Each entry expands in place (a glob's matches and a directory's files sorted by path;
    hidden files under a directory are skipped), so the order depends only on the arguments.
    """
    entries = [os.path.expanduser(os.fspath(p)) for p in paths]
    if not entries:
        raise UserError("no corpus paths given (expected at least one file, directory or glob)")
    out: list[Path] = []
    seen: set[Path] = set()
    for entry in entries:
        if any(c in entry for c in _GLOB_CHARS):
            matches = [Path(m) for m in sorted(glob.glob(entry, recursive=True))]
            files = [f for m in matches for f in _files_under(m)]
            if not files:
                raise UserError(
                    f"corpus glob {entry!r} matches no file (expected at least one match)"
                )
        else:
            p = Path(entry)
            if not p.exists():
                raise UserError(
                    f"corpus path {entry} does not exist (expected a file, directory or glob)"
                )
            files = _files_under(p)
            if not files and not p.is_dir():
                raise UserError(
                    f"corpus path {entry} is neither a regular file nor a directory (expected "
                    "text, .jsonl or .parquet files)"
                )
            if not files:
                raise UserError(
                    f"corpus directory {entry} contains no file (expected text, .jsonl or "
                    ".parquet files)"
                )
        for f in files:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _files_under(p: Path) -> list[Path]:
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(
            f
            for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
    return []


def iter_documents(
    paths: list[str], doc_split: str = "file", text_field: str = "text"
) -> Iterator[str]:
    """Yield the non-empty documents of `paths` in order; raise `UserError` on bad input.

    Files are checked lazily: an error in the second file surfaces after the first file's
    documents. A corpus that yields no non-empty document raises "empty corpus" at the end.
    """
    if doc_split not in DOC_SPLITS:
        raise UserError(f"doc_split={doc_split!r} (expected one of {DOC_SPLITS})")
    files = resolve_corpus_files(paths)
    count = 0
    for path in files:
        kind = record_format(path)
        if kind == "jsonl":
            docs = jsonl_documents(path, text_field)
        elif kind == "parquet":
            docs = parquet_documents(path, text_field)
        elif doc_split == "file":
            docs = iter(["".join(line for _, line in utf8_lines(path))])
        else:
            docs = _blank_line_documents(path)
        for doc in docs:
            if doc.strip():
                count += 1
                yield doc
    if count == 0:
        shown = ", ".join(str(f) for f in files[:3]) + (", ..." if len(files) > 3 else "")
        raise UserError(
            f"empty corpus: {len(files)} file(s) ({shown}) yield no non-empty document (expected "
            "some text)"
        )


def _blank_line_documents(path: Path) -> Iterator[str]:
    """Blocks of lines separated by whitespace-only lines; a block keeps its inner line breaks."""
    block: list[str] = []
    for _, line in utf8_lines(path):
        if line.strip():
            block.append(line)
        elif block:
            yield "".join(block).rstrip("\r\n")
            block = []
    if block:
        yield "".join(block).rstrip("\r\n")


def default_corpus(max_mb: float = 4.0) -> list[str]:
    """The embedded corpus: one document per standard-library module, at most `max_mb` MB.

    Modules come in sorted dotted-name order (test packages and site-packages skipped); a
    module's document is its docstrings and full-line comment blocks in source order. The
    total is capped at `max_mb * 10**6` UTF-8 bytes, the last document cut to fit.
    Deterministic for a given Python installation; reads sources with `ast`, imports nothing.
    """
    if max_mb <= 0:
        raise UserError(f"max_default_corpus_mb={max_mb} (expected > 0)")
    budget = int(max_mb * 1_000_000)
    docs: list[str] = []
    for _, path in _stdlib_modules():
        doc = _module_text(path)
        if not doc:
            continue
        data = doc.encode("utf-8")
        if len(data) >= budget:
            doc = data[:budget].decode("utf-8", errors="ignore").rstrip()
            if doc:
                docs.append(doc)
            break
        docs.append(doc)
        budget -= len(data)
    if not docs:
        raise UserError(
            f"empty corpus: no docstrings found in the Python standard library at "
            f"{sysconfig.get_paths()['stdlib']} (expected its .py sources; pass a corpus instead)"
        )
    return docs


def _stdlib_modules() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d for d in dirnames if d not in _SKIP_STDLIB_DIRS and not d.startswith("test")
        ]
        for name in filenames:
            if name.endswith(".py"):
                rel = (Path(dirpath) / name).relative_to(root).with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                modules.append((".".join(parts), Path(dirpath) / name))
    return sorted(modules)


def _module_text(path: Path) -> str:
    """Docstrings and comment blocks of one source file, in source order, blank-line separated."""
    try:
        source = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ""
    chunks: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node)
            if text and text.strip():
                chunks.append((node.body[0].lineno, text.strip()))
    block: list[str] = []
    for lineno, line in enumerate([*source.splitlines(), ""], 1):  # "" flushes the last block
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith(("#!", "# -*-")):
            block.append(stripped.lstrip("#").strip())
            continue
        text = "\n".join(block).strip()
        if text:
            chunks.append((lineno - len(block), text))
        block = []
    chunks.sort(key=lambda c: c[0])
    return "\n\n".join(text for _, text in chunks)


class FingerprintingIterator:
    """Pass documents through while hashing them: `sha256`, `num_docs`, `num_bytes` once done.

    Each document contributes its UTF-8 byte length (8 bytes, little-endian) and its bytes,
    so document boundaries are part of the fingerprint.
    """

    def __init__(self, docs: Iterable[str]):
        self._docs = docs
        self._hash = hashlib.sha256()
        self.num_docs = 0
        self.num_bytes = 0

    def __iter__(self) -> Iterator[str]:
        for doc in self._docs:
            data = doc.encode("utf-8")
            self._hash.update(len(data).to_bytes(8, "little"))
            self._hash.update(data)
            self.num_docs += 1
            self.num_bytes += len(data)
            yield doc

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def corpus_fingerprint(docs: Iterable[str]) -> str:
    """sha256 of a corpus's documents (see `FingerprintingIterator`); consumes `docs`."""
    fp = FingerprintingIterator(docs)
    for _ in fp:
        pass
    return fp.sha256
