"""F-gram table tiers behind one interface: `device` (gather inside jit), `host` (RAM), `disk`
(tensorstore reads through a bounded cache). All return float32 rows for row ids.

Opening checks that the table is complete (meta.json present), that its shapes agree with
its metadata, and, for tiers that read everything (device, host), its checksum; the disk
tier relies on per-chunk crc32c checks as rows are read. Every failure is a one-line error.
"""

from __future__ import annotations

import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from scone_jax.artifacts.backbone import BACKBONE_MARKER
from scone_jax.artifacts.table_store import (
    FGRAM_SET_DIR,
    FORMAT_VERSION,
    META,
    META_CHECKSUM,
    SHARED_CONTEXT,
    Location,
    combine_checksums,
    dequantize,
    kvstore,
    meta_digest,
    open_array,
    parse_location,
    range_checksum,
    read_json,
)
from scone_jax.errors import UserError
from scone_jax.fgrams.store import FILES as FGRAM_SET_FILES
from scone_jax.fgrams.store import FgramSet
from scone_jax.serve.shard_reader import ShardReader

TIERS = ("device", "host", "disk")


def read_meta(url: str) -> tuple[Location, dict]:
    loc = parse_location(url)
    meta = read_json(loc, META)
    if meta is None:
        raise UserError(
            f"{url} is not a complete f-gram table (no {META}; an export may be unfinished)"
        )
    if loc.local_path is not None and (loc.local_path / BACKBONE_MARKER).is_file():
        raise UserError(
            f"{url} is an exported backbone, not an f-gram table (expected the --out of "
            "`scone-jax export`, not its --backbone-out)"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{url}/{META}: format_version={meta.get('format_version')!r} (expected "
            f"{FORMAT_VERSION}; export the table again)"
        )
    if meta.get(META_CHECKSUM) != meta_digest(meta):
        raise UserError(
            f"{url}/{META} fails its checksum ({META_CHECKSUM}); the table's metadata is corrupt"
        )
    return loc, meta


def _read(array, what: str, url: str, index=None) -> np.ndarray:
    try:
        view = array if index is None else array.oindex[index]
        return np.asarray(view.read().result())
    except UserError:
        raise
    except (
        Exception
    ) as e:  # tensorstore reports missing or corrupt chunks as ValueError-like errors
        raise UserError(
            f"table {url}: reading {what} failed: {str(e).splitlines()[0][:300]}"
        ) from None


@dataclass
class Table(ABC):
    """Common state: metadata, the key index, and `gather(ids) -> float32 [n, d]`."""

    url: str
    meta: dict[str, Any]
    fgram_set: FgramSet  # the rows' f-grams and the key index, for finding matches

    @property
    def num_rows(self) -> int:
        return int(self.meta["num_rows"])

    @property
    def width(self) -> int:
        return int(self.meta["width"])

    @abstractmethod
    def gather(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows [*ids.shape, d] for row ids (all >= 0)."""

    def gather_stored(self, ids) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows [n, d] for row ids (all >= 0) as the tier holds them, and int8's per-row scales
        (else None): a decode step converts them on the device, saving the host a pass."""
        return self.gather(np.asarray(ids, np.int64)), None

    def check_compatible(
        self,
        width: int,
        tokenizer_sha256: str | None = None,
        checkpoint_fingerprint: str | None = None,
    ) -> None:
        if self.width != width:
            raise UserError(
                f"table {self.url} has width {self.width}, but the model's embeddings have width "
                f"{width}"
            )
        if tokenizer_sha256 and self.meta.get("tokenizer_sha256") != tokenizer_sha256:
            raise UserError(
                f"table {self.url} was made with tokenizer "
                f"{str(self.meta.get('tokenizer_sha256'))[:12]}, not {tokenizer_sha256[:12]}"
            )
        if (
            checkpoint_fingerprint
            and self.meta.get("checkpoint_fingerprint") != checkpoint_fingerprint
        ):
            raise UserError(
                f"table {self.url} was exported from checkpoint "
                f"{str(self.meta.get('checkpoint_fingerprint'))[:12]} (step "
                f"{self.meta.get('checkpoint_step')}), not the one asked for, "
                f"{checkpoint_fingerprint[:12]} (export that checkpoint's table, or give the "
                "run and --step this table came from)"
            )


def _load_fgram_set(loc: Location, meta: dict, url: str) -> FgramSet:
    """The table's copy of its f-gram set (fetched to a temporary directory when remote)."""
    if loc.local_path is not None:
        fgram_set = FgramSet.load(loc.local_path / FGRAM_SET_DIR)
    else:
        store = kvstore(loc)
        with tempfile.TemporaryDirectory(prefix="scone-table-fgrams-") as tmp:
            for name in FGRAM_SET_FILES:
                value = store.read(f"{FGRAM_SET_DIR}/{name}").result()
                if value.state != "value":
                    raise UserError(f"table {url}: {FGRAM_SET_DIR}/{name} is missing")
                (Path(tmp) / name).write_bytes(bytes(value.value))
            fgram_set = FgramSet.load(tmp)
            fgram_set.path = None
    if (
        fgram_set.fingerprint != meta["fgram_set_fingerprint"]
        or fgram_set.num_fgrams != meta["num_rows"]
    ):
        raise UserError(
            f"table {url}: its f-gram set does not match the table (fingerprint or size)"
        )
    return fgram_set


def _read_all_verified(loc: Location, meta: dict, url: str) -> tuple[np.ndarray, np.ndarray | None]:
    rows_arr = open_array(loc, "rows")
    if tuple(rows_arr.shape) != (meta["num_rows"], meta["width"]):
        raise UserError(
            f"table {url}: rows have shape {tuple(rows_arr.shape)}, meta says "
            f"({meta['num_rows']}, {meta['width']})"
        )
    stored = _read(rows_arr, "rows", url)
    scale = _read(open_array(loc, "scales"), "scales", url) if meta["dtype"] == "int8" else None
    ranges = []
    for a, b in meta["ranges"]:
        ranges.append((a, b, range_checksum(stored[a:b], None if scale is None else scale[a:b])))
    if combine_checksums(ranges) != meta["checksum"]:
        raise UserError(f"table {url} fails its checksum (the rows differ from what was exported)")
    return stored, scale


class HostTable(Table):
    """The whole table in host RAM (stored dtype; int8 rows are dequantized per gather)."""

    def __init__(self, url: str):
        loc, meta = read_meta(url)
        super().__init__(url, meta, _load_fgram_set(loc, meta, url))
        self.stored, self.scale = _read_all_verified(loc, meta, url)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        return dequantize(*self.gather_stored(ids))

    def gather_stored(self, ids) -> tuple[np.ndarray, np.ndarray | None]:
        # `take`, not fancy indexing: several times cheaper for the few rows of a decode step
        return self.stored.take(ids, axis=0), None if self.scale is None else self.scale.take(ids)


class DeviceTable(HostTable):
    """A small table on the accelerator: `device_rows` is gathered inside jit."""

    def __init__(self, url: str):
        super().__init__(url)
        self.device_rows = jax.device_put(jnp.asarray(self.gather(np.arange(self.num_rows))))


class DiskTable(Table):
    """Rows read from storage on demand, within `cache_bytes` of memory: tensorstore's chunk
    cache, and in front of it a direct-mapped cache of recently read rows.

    The row cache is for decoding, which reads a few rows per step: one tensorstore read costs
    ~0.05-0.1 ms even when its chunk is cached, a row-cache hit a few numpy calls. Local tables
    skip tensorstore for rows altogether (`ShardReader`: a pread and a crc32c per chunk).
    """

    ROW_CACHE_SHARE = (
        8  # through tensorstore: 1/8 of cache_bytes holds recent rows, the rest its chunks
    )
    FEW_ROWS = (
        32  # up to this many ids (a decode step), a row-by-row loop beats whole-array numpy calls
    )

    def __init__(self, url: str, cache_bytes: int = 256 << 20):
        loc, meta = read_meta(url)
        super().__init__(url, meta, _load_fgram_set(loc, meta, url))
        row_bytes = int(cache_bytes) // self.ROW_CACHE_SHARE
        context = ts.Context(
            ts.Context.Spec({"cache_pool": {"total_bytes_limit": int(cache_bytes) - row_bytes}}),
            parent=SHARED_CONTEXT,
        )  # the parent keeps memory:// stores visible
        self.rows = open_array(loc, "rows", context)
        if tuple(self.rows.shape) != (meta["num_rows"], meta["width"]):
            raise UserError(
                f"table {url}: rows have shape {tuple(self.rows.shape)}, meta says "
                f"({meta['num_rows']}, {meta['width']})"
            )
        # local tables: rows read with pread, so the row cache gets the whole budget
        # (shard_reader.py)
        self.direct = ShardReader.for_array(
            self.rows, loc.local_path / "rows" if loc.local_path else None
        )
        slots = max((int(cache_bytes) if self.direct else row_bytes) // (4 * self.width), 1)
        self.scale = (
            _read(open_array(loc, "scales"), "scales", url) if meta["dtype"] == "int8" else None
        )
        self._slot_ids = np.full(slots, -1, np.int64)  # row id held by each slot (-1: empty)
        self._slot_rows = np.zeros((slots, self.width), np.float32)
        self._lock = threading.Lock()  # slot ids and rows change together

    def gather(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        if self.direct and ids.size <= self.FEW_ROWS:
            return self._gather_few(ids)
        flat = ids.reshape(-1)
        slots = flat % len(self._slot_ids)
        with self._lock:
            rows = self._slot_rows.take(slots, axis=0)
            miss = self._slot_ids.take(slots) != flat
            if miss.any():
                unique, inverse = np.unique(flat[miss], return_inverse=True)  # each row read once
                fetched = self._read_rows(unique)
                rows[miss] = fetched[inverse]
                kept, first = np.unique(
                    unique % len(self._slot_ids), return_index=True
                )  # one id per slot
                self._slot_ids[kept] = unique[first]
                self._slot_rows[kept] = fetched[first]
        return rows.reshape(*ids.shape, self.width)

    def _gather_few(self, ids: np.ndarray) -> np.ndarray:
        """`gather` for a decode step's few rows: a loop of scalar steps and one `pread` per row
        missed, which costs a fraction of the whole-array path's numpy calls on cold caches."""
        out = np.empty((ids.size, self.width), np.float32)
        slot_ids, slot_rows = self._slot_ids, self._slot_rows
        with self._lock:
            for j, row in enumerate(ids.reshape(-1).tolist()):
                slot = row % len(slot_ids)
                if slot_ids[slot] != row:
                    stored = self.direct.read_row(row)
                    slot_rows[slot] = stored if self.scale is None else stored * self.scale[row]
                    slot_ids[slot] = row
                out[j] = slot_rows[slot]
        return out.reshape(*ids.shape, self.width)

    def _read_rows(self, unique: np.ndarray) -> np.ndarray:
        stored = (
            self.direct.read(unique)
            if self.direct
            else _read(self.rows, "rows", self.url, (unique,))
        )
        return dequantize(stored, None if self.scale is None else self.scale[unique])


def open_table(url: str, tier: str = "host", cache_bytes: int = 256 << 20) -> Table:
    if tier == "host":
        return HostTable(url)
    if tier == "device":
        return DeviceTable(url)
    if tier == "disk":
        return DiskTable(url, cache_bytes)
    raise UserError(f"table tier {tier!r} (expected one of {TIERS})")
