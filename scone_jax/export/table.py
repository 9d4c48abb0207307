"""`scone-jax export`: run the f-gram model over every f-gram and write the [S, d] table.

F-grams are processed in row ranges (the unit of resumption); inside a range they are taken in
lexicographic order, `batch_rows` at a time, as prefix forests (scone_jax/forest/), so a prefix
shared by many f-grams is computed once, as in training: one forest per data shard of the mesh, of
its consecutive rows. In replace mode the stored row is F(w) - T(last token of w), so the input
layer at inference is the same lookup-and-add in both modes (SCONE.md section 3).

In a multi-process job each process restores the checkpoint onto its own devices, computes and
writes its own blocks of rows (whole shards, so no two processes write one file) and records them
in its own progress file; process 0 commits the table when every process is done.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from jax.sharding import NamedSharding

from scone_jax.artifacts.restore import (
    RunParams,
    agreed_checkpoint,
    load_run_params,
    on_local_devices,
    run_fingerprint,
)
from scone_jax.artifacts.run_dir import CheckpointChoice, CheckpointRef
from scone_jax.artifacts.table_store import (
    FGRAM_SET_DIR,
    FORMAT_VERSION,
    META,
    META_CHECKSUM,
    ROW_DTYPES,
    Location,
    combine_checksums,
    create_array,
    default_chunk_rows,
    kvstore,
    meta_digest,
    parse_location,
    progress_key,
    progress_keys,
    quantize,
    range_checksum,
    read_json,
    write_json,
)
from scone_jax.atomic import replace_dir, storage_errors
from scone_jax.checksums import MANIFEST, manifest
from scone_jax.errors import UserError
from scone_jax.fgrams.store import FILES as FGRAM_SET_FILES
from scone_jax.fgrams.store import FgramSet
from scone_jax.forest.layout import forest_layout, grow_blocks, round_up
from scone_jax.forest.prefix import prefix_forest
from scone_jax.forest.suffixes import suffix_chains
from scone_jax.model.scone import sum_of_links
from scone_jax.progress import progress_bar
from scone_jax.runtime.distributed import barrier
from scone_jax.sharding.batch import fgram_groups, node_shardings
from scone_jax.sharding.rules import activation_sharding, logical_to_spec


def fgram_rows_fn(run: RunParams, combine: str):
    """jit: (params, node tokens [G, N, B], paths [G, N, B, K], output slots [G, O], each row's
    outputs [R, L], last tokens [R]) -> the table rows [R] x d in float32, from G prefix forests
    of f-grams (`group_forests`). A row is the sum of its L outputs (its f-gram's, then with
    suffix rows its suffixes', -1 past the chain's end), summed as training sums them."""
    handle, mesh, rules = run.handle, run.mesh, run.rules

    def rows(params, node_tokens, paths, outputs, row_outputs, last_tokens):
        with activation_sharding(mesh, rules):
            model = handle.merge(params)
            nodes = model.fgram.forest(model.backbone.table_rows(node_tokens), paths, outputs)
            out = sum_of_links(nodes.reshape(-1, nodes.shape[-1]), row_outputs).astype(jnp.float32)
            if combine == "replace":
                out = out - model.backbone.table_rows(last_tokens).astype(jnp.float32)
        return out

    return jax.jit(rows)


def compute_range(
    fn,
    params,
    fgram_set: FgramSet,
    a: int,
    b: int,
    batch_rows: int,
    groups: int,
    block: int,
    shardings,
    suffix_parent: np.ndarray | None = None,
) -> np.ndarray:
    """The rows of f-grams a..b-1, `batch_rows` at a time in lexicographic order, so that f-grams
    sharing a prefix meet in one group's forest and the prefix is computed once there. With
    `suffix_parent` (suffix rows) a row sums F over its f-gram's suffix chain, each chain's
    f-grams computed in its row's group, wherever in the set they are."""
    tokens, lengths = np.asarray(fgram_set.tokens[a:b]), np.asarray(fgram_set.lengths[a:b])
    all_tokens, all_lengths = np.asarray(fgram_set.tokens), np.asarray(fgram_set.lengths)
    order = np.lexsort(tokens.T[::-1])
    out = None
    for c in range(0, len(order), batch_rows):
        part = order[c : c + batch_rows]
        ids = a + part
        chains = (
            ids[:, None]
            if suffix_parent is None
            else suffix_chains(ids, suffix_parent, fgram_set.max_n - 1)
        )
        buffers, row_outputs = group_forests(
            all_tokens, all_lengths, chains, groups, -(-batch_rows // groups), block
        )
        last = np.zeros(batch_rows, np.int32)
        last[: len(part)] = tokens[part, lengths[part] - 1]
        padded_outputs = np.zeros((batch_rows, chains.shape[1]), np.int32)
        padded_outputs[: len(part)] = row_outputs
        rows = np.asarray(
            jax.device_get(
                fn(
                    params,
                    *(
                        jax.device_put(x, sh)
                        for x, sh in zip((*buffers, padded_outputs, last), shardings, strict=True)
                    ),
                )
            )
        )
        if out is None:
            out = np.empty((b - a, rows.shape[1]), np.float32)
        out[part] = rows[: len(part)]
    return out


def group_forests(
    tokens: np.ndarray,
    lengths: np.ndarray,
    chains: np.ndarray,
    groups: int,
    rows_per_group: int,
    block: int,
):
    """Each group's own forest, of its `rows_per_group` consecutive rows: (node tokens, paths,
    output slots) for the f-gram model and each row's places in the outputs [R, L]. A row is
    its chain of f-gram ids [L] (-1 past its end; one id without suffix rows) into the set's
    `tokens` and `lengths`. A row's blocks then depend only on the rows of its group, so a
    process exporting with fewer groups (and as many rows per group) lays every row out as the
    whole mesh does (the block count N, the fullest group's rounded up to a granule, can still
    differ between process counts)."""
    layouts, members = [], []
    for i in range(0, groups * rows_per_group, rows_per_group):
        group = chains[i : i + rows_per_group]
        ids, first = np.unique(group[group >= 0].astype(np.int64), return_index=True)
        in_order = ids[np.argsort(first)]  # the rows' order, each suffix after its first row
        rank = np.empty(len(ids), np.int64)
        rank[np.argsort(first)] = np.arange(len(ids))
        members.append((ids, rank))
        layouts.append(
            forest_layout(
                prefix_forest(tokens[in_order], lengths[in_order], True),
                1,
                block,
                min_outputs=round_up(rows_per_group * chains.shape[1], block),
            )
        )
    granule = max(rows_per_group // (4 * block), 1)  # few distinct shapes: few compiles
    blocks = round_up(max(layout.tokens.shape[1] for layout in layouts), granule)
    grown = [grow_blocks(layout.tokens, layout.paths, blocks) for layout in layouts]
    node_tokens, paths = (np.concatenate(parts) for parts in zip(*grown, strict=True))
    outputs = np.concatenate([layout.outputs for layout in layouts])
    row_outputs = np.full(chains.shape, -1, np.int32)
    for g, (layout, (ids, rank)) in enumerate(zip(layouts, members, strict=True)):
        group = chains[g * rows_per_group : (g + 1) * rows_per_group]
        member = rank[np.minimum(np.searchsorted(ids, np.maximum(group, 0)), len(ids) - 1)]
        place = layout.output[member] + g * outputs.shape[1]
        row_outputs[g * rows_per_group : (g + 1) * rows_per_group] = np.where(group >= 0, place, -1)
    return (node_tokens, paths, outputs), row_outputs


def row_ranges(num_rows: int, range_rows: int) -> list[tuple[int, int]]:
    """The resumable units of an export: the same for any number of processes."""
    return [(a, min(a + range_rows, num_rows)) for a in range(0, num_rows, range_rows)]


def assigned_ranges(
    ranges: list[tuple[int, int]], block_rows: int, process_index: int, process_count: int
) -> list[tuple[int, int]]:
    """One process's share of `ranges`: whole blocks of `block_rows` rows, dealt round-robin. A
    block is whole shards of the arrays, so no two processes ever write the same file."""
    return [(a, b) for a, b in ranges if a // block_rows % process_count == process_index]


def data_parallel(mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def read_progress(work: Location, header: dict) -> dict[tuple[int, int], str]:
    """{(a, b): checksum} of the finished ranges, from the progress files of every process."""
    done = {}
    for key in progress_keys(work):
        state = read_json(work, key)
        if state["header"] != header:
            changed = sorted(k for k in header if state["header"].get(k) != header[k])
            raise UserError(
                f"an unfinished export at {work.url} has another {', '.join(changed)} (checkpoint, "
                "dtype, f-gram set or layout); rerun with the same options to resume, or remove it "
                "to start over"
            )
        done.update({(a, b): digest for a, b, digest in state["done"]})
    return done


def clear_leftover(work: Location) -> None:
    """Remove a local `.partial` with no progress files (process 0, before the others look)."""
    if work.local_path and work.local_path.exists() and not progress_keys(work):
        shutil.rmtree(
            work.local_path
        )  # nothing to resume: a table swapped out by an interrupted replace


def take_down(work: Location) -> None:
    """Remove a table that an export on an object store replaces, meta.json (what makes it a
    table) first: there is no rename there, so a reader finds the old table or none, never one of
    old and new rows. An interrupted replace leaves no table, and the rerun resumes the new one."""
    store = kvstore(work)
    store.write(META, None).result()  # None: delete
    store.delete_range(ts.KvStore.KeyRange()).result()


def create_arrays(
    work: Location, num_rows: int, width: int, dtype: str, chunk_rows: int, shard_rows: int
):
    """The rows array and, for int8, the scales array (both cut into shards of `shard_rows`
    rows)."""
    rows = create_array(work, "rows", (num_rows, width), dtype, chunk_rows, shard_rows)
    scales = (
        create_array(
            work,
            "scales",
            (num_rows,),
            "float32",
            math.gcd(chunk_rows * 64, shard_rows),
            shard_rows,
        )
        if dtype == "int8"
        else None
    )
    return rows, scales


def write_ranges(ranges, compute, arrays, dtype: str, work: Location, state: dict, bar) -> None:
    """Compute and write each range, then record it in this process's progress file."""
    rows_arr, scales_arr = arrays
    key = progress_key(jax.process_index())
    for a, b in ranges:
        stored, scale = quantize(compute(a, b), dtype)
        rows_arr[a:b].write(stored).result()
        if scales_arr is not None:
            scales_arr[a:b].write(scale).result()
        state["done"].append([a, b, range_checksum(stored, scale)])
        write_json(work, key, state)  # after the data: a range is done only once written
        bar.update(b - a)


def copy_fgram_set(work: Location, fgram_set: FgramSet) -> None:
    """The f-gram set (tokens, keys and their ids: the key index) travels with the table."""
    store, copied = kvstore(work), {}
    for name in FGRAM_SET_FILES:
        if (
            name != MANIFEST
        ):  # the copy gets a manifest of the bytes copied (the source may predate them)
            data = (Path(fgram_set.path) / name).read_bytes()
            store.write(f"{FGRAM_SET_DIR}/{name}", data).result()
            copied[name] = (len(data), zlib.crc32(data))
    store.write(
        f"{FGRAM_SET_DIR}/{MANIFEST}", json.dumps(manifest(copied), indent=2).encode()
    ).result()


def commit(
    work: Location,
    final: Location,
    header: dict,
    fgram_set: FgramSet,
    ranges: list[tuple[int, int]],
    rows_per_s: float | None,
) -> dict:
    """Process 0, once every process has written its rows: check that all ranges are there, write
    meta.json (the commit point for object stores) and move a local table into place."""
    done = read_progress(work, header)
    missing = [r for r in ranges if r not in done]
    if missing:
        raise UserError(
            f"table {work.url} lacks {len(missing)} of {len(ranges)} row ranges (first: rows "
            f"{missing[0][0]}-{missing[0][1]}) after every process finished (expected storage "
            "that every process shares)"
        )
    copy_fgram_set(work, fgram_set)
    meta = {
        **header,
        "ranges": [[a, b] for a, b in ranges],
        "checksum": combine_checksums([(a, b, done[a, b]) for a, b in ranges]),
        "rows_per_s": rows_per_s,
    }
    meta[META_CHECKSUM] = meta_digest(meta)
    write_json(work, META, meta)
    if final.local_path:
        keys = progress_keys(work)
        replace_dir(work.local_path, final.local_path)
        for key in keys:
            (final.local_path / key).unlink(missing_ok=True)
    return meta


def export_table(
    run_dir: str | Path,
    url: str,
    dtype: str = "float32",
    step: CheckpointChoice = None,
    batch_rows: int = 1024,
    range_rows: int = 65536,
    chunk_rows: int = 0,
    shard_rows: int = 65536,
    progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Export the table of run `run_dir` to `url`; resumes an unfinished export of the same
    checkpoint, and returns the meta of a finished one, with `rows_per_s` None (nothing computed).

    A local table is written into `url.partial` and renamed into place when complete; an existing
    table replaced with `overwrite` stays intact until then. On an object store (no rename) the
    table replaced is removed first (`take_down`). A write the storage refuses is a
    one-line UserError, and the finished ranges in `url.partial` are kept for the next try.

    In a multi-process job every process computes and writes its own blocks of whole shards on
    its own devices and records them in its own progress file; process 0 commits the table once
    all are done. The table is bitwise the one a single process writes."""
    pid, nproc = jax.process_index(), jax.process_count()
    if dtype not in ROW_DTYPES:
        raise UserError(f"table dtype {dtype!r} (expected one of {ROW_DTYPES})")
    if shard_rows <= 0 or chunk_rows < 0 or (chunk_rows and shard_rows % chunk_rows):
        raise UserError(
            f"shard_rows={shard_rows} (expected a positive multiple of chunk_rows={chunk_rows})"
        )
    final = parse_location(url)
    if nproc > 1 and final.kvstore["driver"] == "memory":
        raise UserError(
            f"table {url} would live in one process's memory (expected a path or URL that "
            f"all {nproc} processes can write)"
        )
    existing = read_json(final, META)
    replacing = existing is not None
    checkpoint = step if isinstance(step, CheckpointRef) else agreed_checkpoint(run_dir, step)
    if replacing and not overwrite:  # decided before the checkpoint is restored
        same = {"checkpoint_fingerprint": run_fingerprint(run_dir, checkpoint), "dtype": dtype}
        if all(existing.get(k) == v for k, v in same.items()):
            return {**existing, "rows_per_s": None}  # this checkpoint's table, in this dtype
        raise UserError(
            f"table {url} already exists, exported from another checkpoint or in another dtype "
            f"(step {existing.get('checkpoint_step')}, {existing.get('dtype')}; remove it or pass "
            "--overwrite)"
        )
    run = load_run_params(run_dir, checkpoint)
    if not run.cfg.fgrams.enabled:
        raise UserError(
            f"run {run_dir} is a baseline (fgrams.enabled=false): it has no f-gram model to export"
        )
    if run.cfg.fgrams.permute_rows:
        raise UserError(
            f"run {run_dir} is a control run (fgrams.permute_rows=true): its rows are not the "
            f"f-grams' own, so it is not exported"
        )
    fgram_set = FgramSet.load(run.info["fgram_set"])
    if fgram_set.fingerprint != run.info["fgram_set_fingerprint"]:
        raise UserError(
            f"f-gram set {fgram_set.path} changed since run {run_dir} was trained (fingerprint "
            f"{fgram_set.fingerprint[:12]}, expected {run.info['fgram_set_fingerprint'][:12]})"
        )
    num_rows, width = len(fgram_set.lengths), run.cfg.model.d_model
    batch_rows = min(batch_rows, num_rows)  # the buffers are sized by it
    chunk_rows = chunk_rows or default_chunk_rows(width, dtype, shard_rows)
    rows_per_device = -(-batch_rows // data_parallel(run.mesh))
    run = on_local_devices(run)
    batch_rows = rows_per_device * data_parallel(
        run.mesh
    )  # as many rows per device as on the whole mesh
    header = {
        "format_version": FORMAT_VERSION,
        "num_rows": num_rows,
        "width": width,
        "dtype": dtype,
        "max_n": fgram_set.max_n,
        "combine": run.cfg.fgrams.combine,
        "suffix_rows": run.cfg.fgrams.suffix_rows,
        "tokenizer_sha256": run.info["tokenizer_sha256"],
        "fgram_set_fingerprint": fgram_set.fingerprint,
        "checkpoint_fingerprint": run.fingerprint,
        "checkpoint_step": run.step,
        "range_rows": range_rows,
        "chunk_rows": chunk_rows,
        "shard_rows": shard_rows,
    }
    work = parse_location(str(final.local_path) + ".partial") if final.local_path else final
    ranges = row_ranges(num_rows, range_rows)
    mine = assigned_ranges(ranges, math.lcm(range_rows, shard_rows), pid, nproc)
    with storage_errors(f"table {work.url}"):
        if pid == 0 and final.local_path is None and replacing:
            take_down(work)
        elif pid == 0:
            clear_leftover(work)
        barrier("export-started")
        done = read_progress(work, header)
        state = read_json(work, progress_key(pid)) or {"header": header, "done": []}
        arrays = create_arrays(
            work, num_rows, width, dtype, chunk_rows, shard_rows
        )  # or opens them
        rows_sharding = NamedSharding(run.mesh, logical_to_spec(("fgram/batch",), run.rules))
        links_sharding = NamedSharding(run.mesh, logical_to_spec(("fgram/batch", None), run.rules))
        nodes_sharding = node_shardings(run.mesh, run.rules)
        shardings = (
            nodes_sharding["fgram_nodes"],
            nodes_sharding["fgram_paths"],
            nodes_sharding["fgram_outputs"],
            links_sharding,
            rows_sharding,
        )
        suffix_parent = fgram_set.backoff_ids() if run.cfg.fgrams.suffix_rows else None
        groups = fgram_groups(run.mesh, run.rules)
        fn = fgram_rows_fn(run, run.cfg.fgrams.combine)
        start = time.perf_counter()
        bar = progress_bar(
            "export",
            total=sum(b - a for a, b in mine),
            initial=sum(b - a for a, b in mine if (a, b) in done),
            unit="row",
            disable=not progress or pid != 0,
        )
        write_ranges(
            [r for r in mine if r not in done],
            lambda a, b: compute_range(
                fn,
                run.params,
                fgram_set,
                a,
                b,
                batch_rows,
                groups,
                run.cfg.fgrams.block_size,
                shardings,
                suffix_parent,
            ),
            arrays,
            dtype,
            work,
            state,
            bar,
        )
        bar.close()
        barrier("export-rows-written")
        elapsed, computed = (
            time.perf_counter() - start,
            num_rows - sum(b - a for a, b in done),
        )  # by all processes
        rows_per_s = computed / elapsed if elapsed > 0 and computed else None
        meta = commit(work, final, header, fgram_set, ranges, rows_per_s) if pid == 0 else None
        barrier("export-committed")
    return meta or read_json(final, META)
