"""Serving: decode tokens/s with the table in RAM or on disk against the same backbone without
SCONE, per-token lookup latency by batch size, bytes moved against measured memory bandwidth,
and export throughput against the f-gram model's FLOPs."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from flax import nnx

from benchmarks.common import interleaved_medians, matmul_peak
from scone_jax.config import load_config
from scone_jax.export.table_store import (
    FGRAM_SET_DIR,
    FORMAT_VERSION,
    META,
    combine_checksums,
    create_array,
    parse_location,
    quantize,
    range_checksum,
    write_json,
)
from scone_jax.fgrams.store import FgramSet
from scone_jax.model import Transformer
from scone_jax.serve.engine import Engine
from scone_jax.serve.generate import generate
from scone_jax.serve.input_layer import TableLookup
from scone_jax.serve.tables import open_table

PAPER = {"RAM, 100M rows, batch 16": 0.017, "NVMe, 10M rows, batch 1": 1.1, "NVMe, 1B rows, batch 1": 2.3}


def bigram_table(path: Path, rows: int, width: int, vocab: int, dtype: str = "bfloat16") -> str:
    """A synthetic table of `rows` distinct bigrams (closed under prefixes trivially) with random rows."""
    side = int(np.ceil(np.sqrt(rows)))
    assert side <= vocab, "vocab too small for that many bigrams"
    ids = np.arange(rows)
    tokens = np.full((rows, 2), -1, np.int64)
    tokens[:, 0], tokens[:, 1] = ids // side, ids % side
    fs = FgramSet.create(tokens, np.full(rows, 2), np.full(rows, 10), max_n=2, min_count=1, key_vocab=vocab,
                         vocab_size=vocab)
    loc = parse_location(str(path))
    rng = np.random.default_rng(0)
    arr = create_array(loc, "rows", (rows, width), dtype, 256, 65536)
    done = []
    for a in range(0, rows, 1 << 18):
        b = min(a + (1 << 18), rows)
        stored, scale = quantize(rng.normal(size=(b - a, width)).astype(np.float32) * 0.02, dtype)
        arr[a:b].write(stored).result()
        done.append((a, b, range_checksum(stored, scale)))
    fs.save(path / FGRAM_SET_DIR)
    write_json(loc, META, {"format_version": FORMAT_VERSION, "num_rows": rows, "width": width, "dtype": dtype,
                           "max_n": 2, "combine": "add", "tokenizer_sha256": None,
                           "fgram_set_fingerprint": fs.fingerprint, "checkpoint_fingerprint": None,
                           "checkpoint_step": 0, "range_rows": 1 << 18, "ranges": [[a, b] for a, b, _ in done],
                           "checksum": combine_checksums(done)})
    return str(path)


def memory_bandwidth() -> float:
    """Bytes/s of a large numpy copy (read + write counted)."""
    a = np.ones(1 << 27, np.uint8)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        b = a.copy()
        best = min(best, time.perf_counter() - t)
    del b
    return 2 * a.nbytes / best


def decode_rates(engines: dict[str, Engine], batch: int, side: int, new_tokens: int, rounds: int) -> dict:
    """Tokens/s of each engine on the same prompts (bigrams of the table, so most tokens match),
    medians of `rounds` interleaved runs."""
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, side, 32).tolist() for _ in range(batch)]
    runs = {}
    for name, engine in engines.items():
        generate(engine, prompts, new_tokens)  # compile every shape first
        runs[name] = lambda engine=engine: generate(engine, prompts, new_tokens)
    return {k: batch * new_tokens / v for k, v in interleaved_medians(runs, rounds).items()}


def lookup_latency(table, batch: int, rows: int, repeats: int = 200) -> float:
    """Seconds per token to fetch the rows of `batch` tokens (random ids, deduplicated)."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, rows, (repeats, batch))
    t = time.perf_counter()
    for r in range(repeats):
        table.gather(np.unique(ids[r]))
    return (time.perf_counter() - t) / (repeats * batch)


def run(quick: bool = False) -> str:
    work = Path(tempfile.mkdtemp(prefix="scone-bench-serve-"))
    cfg = load_config("small")
    width, vocab = cfg.model.d_model, cfg.data.tokenizer_vocab_size
    sizes = [100_000] if quick else [1_000_000, 10_000_000]
    new_tokens = 16 if quick else 64
    backbone = Transformer(cfg.model, vocab, rngs=nnx.Rngs(0))
    base = Engine(backbone, None)
    bandwidth = memory_bandwidth()
    lines = ["## Serving: decode with the table off the accelerator (CPU)", "",
             f"Backbone: the small preset (d {width}, {cfg.model.n_layers} layers, vocab {vocab}); tables of "
             "synthetic bigram f-grams with random bfloat16 rows (the lookup cost does not depend on the "
             "values). Decode = `generate` with the KV cache (32-token prompts, "
             f"{new_tokens} new tokens, medians of interleaved runs): per token one jitted step plus the "
             f"host-side match and row fetch. Measured memory bandwidth (numpy copy): {bandwidth / 1e9:.1f} GB/s.", "",
             "| rows | batch | baseline tok/s | RAM tok/s | RAM / baseline | disk tok/s | disk / baseline |",
             "|---|---|---|---|---|---|---|"]
    latency_rows = []
    for rows in sizes:
        url = bigram_table(work / f"t{rows}", rows, width, vocab)
        host = Engine(backbone, TableLookup(open_table(url, "host")))
        disk = Engine(backbone, TableLookup(open_table(url, "disk", cache_bytes=64 << 20)))
        side = int(np.ceil(np.sqrt(rows)))
        for batch in (1, 16):
            r = decode_rates({"base": base, "host": host, "disk": disk}, batch, side, new_tokens, 2 if quick else 5)
            b, h, d = r["base"], r["host"], r["disk"]
            lines.append(f"| {rows:,} | {batch} | {b:,.0f} | {h:,.0f} | {h / b:.2f} | {d:,.0f} | {d / b:.2f} |")
        for tier, engine in (("RAM", host), ("disk", disk)):
            latency_rows.append((rows, tier, [lookup_latency(engine.lookup.table, bs, rows) for bs in (1, 2, 4, 8, 16)]))
    row_bytes = width * 2
    lines += ["", "Targets (issue): RAM >= 0.95x and disk >= 0.85x the baseline's tokens/s.", "",
              "Per-token row fetch latency (random rows, deduplicated per batch):", "",
              "| rows | tier | batch 1 | 2 | 4 | 8 | 16 | bytes/token | bytes/s at batch 16 / bandwidth |",
              "|---|---|---|---|---|---|---|---|---|"]
    for rows, tier, lat in latency_rows:
        lines.append(f"| {rows:,} | {tier} | " + " | ".join(f"{x * 1e3:.4f} ms" for x in lat)
                     + f" | {row_bytes} | {row_bytes / lat[-1] / bandwidth:.1e} |")
    lines += ["", "The paper's figures for comparison (A100 host, d 2048, 16-bit rows): "
              + "; ".join(f"{k}: {v} ms/token" for k, v in PAPER.items()) + ".", ""]
    lines += export_throughput(quick)
    return "\n".join(lines)


def export_throughput(quick: bool) -> list[str]:
    """Rows/s of `export_table` on a trained tiny SCONE run, against the f-gram model's FLOPs."""
    from scone_jax.export.table import export_table
    from scone_jax.metrics.flops import fgram_forward_per_row
    from scone_jax.train.loop import train

    work = Path(tempfile.mkdtemp(prefix="scone-bench-export-"))
    cfg = load_config("tiny_scone", [f"run_dir={work / 'run'}", "train.steps=2", "logging.progress=false",
                                     "logging.tensorboard=false", "data.max_default_corpus_mb=1.0",
                                     "train.eval_every=0", "fgrams.num_fgrams=20000"])
    train(cfg)
    meta = export_table(work / "run", str(work / "table"), progress=False)
    from scone_jax.fgrams.store import FgramSet

    fs = FgramSet.load(work / "run" / "fgrams")
    flops = float(np.mean([fgram_forward_per_row(cfg.fgrams, cfg.model, int(n)) for n in fs.lengths]))
    peak = matmul_peak(512)
    achieved = meta["rows_per_s"] * flops
    return ["Export throughput (tiny SCONE run, 1x f-gram model, float32 rows, this CPU):", "",
            "| rows | rows/s | f-gram model FLOPs/row | achieved GFLOP/s | fraction of matmul peak |",
            "|---|---|---|---|---|",
            f"| {meta['num_rows']:,} | {meta['rows_per_s']:,.0f} | {flops / 1e6:.2f} M | {achieved / 1e9:.2f} | "
            f"{achieved / peak:.2f} |", "",
            "Export is a forward pass over short sequences (2..K tokens): small matmuls, so far from the peak "
            "on CPU; on an accelerator the batch of f-grams per call is what to raise."]
