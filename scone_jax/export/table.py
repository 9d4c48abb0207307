"""`scone-jax export`: run the f-gram model over every f-gram and write the [S, d] table.

F-grams are processed in row ranges (the unit of resumption); inside a range they are grouped
by length, so each batch is [N, n] with no padding to K. Batches are sharded over the data
axes of the mesh. In replace mode the stored row is F(w) - T(last token of w), so the input
layer at inference is the same lookup-and-add in both modes (SCONE.md section 3).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from tqdm import tqdm

from scone_jax.dist.rules import activation_sharding, logical_to_spec
from scone_jax.errors import UserError
from scone_jax.export.checkpoint_params import RunParams, load_run_params
from scone_jax.export.table_store import (
    FGRAM_SET_DIR,
    FORMAT_VERSION,
    META,
    PROGRESS,
    ROW_DTYPES,
    combine_checksums,
    create_array,
    kvstore,
    parse_location,
    quantize,
    range_checksum,
    read_json,
    write_json,
)
from scone_jax.fgrams.store import FgramSet


def fgram_rows_fn(run: RunParams, combine: str):
    """jit: (params, tokens [N, n], lengths [N]) -> the table rows [N, d] in float32."""
    handle, mesh, rules = run.handle, run.mesh, run.rules

    def rows(params, tokens, lengths):
        with activation_sharding(mesh, rules):
            model = handle.merge(params)
            out = model.fgram_embeddings(tokens, lengths).astype(jnp.float32)
            if combine == "replace":
                last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
                out = out - jnp.take(model.backbone.embed_table[...], last, axis=0).astype(jnp.float32)
        return out

    return jax.jit(rows)


def compute_range(fn, params, fgram_set: FgramSet, a: int, b: int, batch_rows: int, sharding) -> np.ndarray:
    lengths = np.asarray(fgram_set.lengths[a:b])
    out = None
    for n in np.unique(lengths):
        idx = np.flatnonzero(lengths == n)
        for c in range(0, len(idx), batch_rows):
            part = idx[c:c + batch_rows]
            tokens = np.zeros((batch_rows, int(n)), np.int32)
            tokens[:len(part)] = fgram_set.tokens[a + part, :n]
            lens = np.full(batch_rows, n, np.int32)
            rows = np.asarray(jax.device_get(fn(params, jax.device_put(tokens, sharding[0]),
                                                jax.device_put(lens, sharding[1]))))
            if out is None:
                out = np.empty((b - a, rows.shape[1]), np.float32)
            out[part] = rows[:len(part)]
    return out


def export_table(run_dir: str | Path, url: str, dtype: str = "float32", step: int | None = None,
                 batch_rows: int = 1024, range_rows: int = 65536, chunk_rows: int = 256,
                 shard_rows: int = 65536, progress: bool = True, overwrite: bool = False) -> dict:
    """Export the table of run `run_dir` to `url`; resumes an unfinished export of the same checkpoint."""
    if dtype not in ROW_DTYPES:
        raise UserError(f"table dtype {dtype!r} (expected one of {ROW_DTYPES})")
    if jax.process_count() > 1:
        # a per-process split of the ranges needs process-local meshes for the f-gram model
        raise UserError("export runs as a single process for now (its mesh may span all local devices); "
                        f"this job has {jax.process_count()} processes")
    final = parse_location(url)
    if read_json(final, META) is not None and not overwrite:
        raise UserError(f"table {url} already exists (remove it or pass --overwrite)")
    run = load_run_params(run_dir, step)
    if not run.cfg.fgrams.enabled:
        raise UserError(f"run {run_dir} is a baseline (fgrams.enabled=false): it has no f-gram model to export")
    fgram_set = FgramSet.load(run.info["fgram_set"])
    if fgram_set.fingerprint != run.info["fgram_set_fingerprint"]:
        raise UserError(f"f-gram set {fgram_set.path} changed since run {run_dir} was trained "
                        f"(fingerprint {fgram_set.fingerprint[:12]}, expected {run.info['fgram_set_fingerprint'][:12]})")
    num_rows, width = len(fgram_set.lengths), run.cfg.model.d_model
    dp = run.mesh.shape["data"] * run.mesh.shape["fsdp"]
    batch_rows = -(-batch_rows // dp) * dp
    header = {
        "format_version": FORMAT_VERSION, "num_rows": num_rows, "width": width, "dtype": dtype,
        "max_n": fgram_set.max_n, "combine": run.cfg.fgrams.combine,
        "tokenizer_sha256": run.info["tokenizer_sha256"], "fgram_set_fingerprint": fgram_set.fingerprint,
        "checkpoint_fingerprint": run.fingerprint, "checkpoint_step": run.step,
        "range_rows": range_rows,
    }
    work = parse_location(str(final.local_path) + ".partial") if final.local_path else final
    if final.local_path and final.local_path.exists() and overwrite:
        shutil.rmtree(final.local_path)
    state = read_json(work, PROGRESS)
    if state is not None and state["header"] != header:
        raise UserError(f"an unfinished export at {work.url} is of something else (another checkpoint, dtype "
                        "or f-gram set); remove it to start over")
    state = state or {"header": header, "done": []}
    rows_arr = create_array(work, "rows", (num_rows, width), dtype, chunk_rows, shard_rows)
    scales_arr = create_array(work, "scales", (num_rows,), "float32", chunk_rows * 64, shard_rows) \
        if dtype == "int8" else None
    spec = logical_to_spec(("fgram/batch",), run.rules)
    shardings = (NamedSharding(run.mesh, jax.sharding.PartitionSpec(spec[0], None)), NamedSharding(run.mesh, spec))
    fn = fgram_rows_fn(run, run.cfg.fgrams.combine)
    ranges = [(a, min(a + range_rows, num_rows)) for a in range(0, num_rows, range_rows)]
    done = {(a, b) for a, b, _ in state["done"]}
    start = time.perf_counter()
    bar = tqdm(total=num_rows, initial=sum(b - a for a, b in done), desc="export", unit="row",
               file=sys.stderr, disable=not progress, dynamic_ncols=True)
    computed = 0
    for a, b in ranges:
        if (a, b) in done:
            continue
        rows = compute_range(fn, run.params, fgram_set, a, b, batch_rows, shardings)
        stored, scale = quantize(rows, dtype)
        rows_arr[a:b].write(stored).result()
        if scales_arr is not None:
            scales_arr[a:b].write(scale).result()
        state["done"].append([a, b, range_checksum(stored, scale)])
        write_json(work, PROGRESS, state)  # after the data: a range is done only once written
        computed += b - a
        bar.update(b - a)
    bar.close()
    elapsed = time.perf_counter() - start
    # the f-gram set (tokens, keys and their ids: the key index) travels with the table
    store = kvstore(work)
    for path in sorted(Path(fgram_set.path).iterdir()):
        if path.is_file() and (path.suffix == ".npy" or path.name == "meta.json"):
            store.write(f"{FGRAM_SET_DIR}/{path.name}", path.read_bytes()).result()
    done = [tuple(r) for r in state["done"]]
    meta = {**header, "ranges": [[a, b] for a, b, _ in sorted(done)], "checksum": combine_checksums(done),
            "rows_per_s": computed / elapsed if elapsed > 0 and computed else None}
    write_json(work, META, meta)  # the commit point for object stores
    if final.local_path:
        (work.local_path / PROGRESS).unlink(missing_ok=True)
        os.replace(work.local_path, final.local_path)
    return meta
