"""F-gram counting on Beam worker processes against the local backend, side by side.

The same Zipf-like corpus as bench_fgrams; the local backend with 2 worker threads against the
Beam pipeline on the FnApi runner with 2 SDK worker processes (the driver runs the stages and
the shuffle), each run in a fresh process, in turns, in a random order per round. Reported:
the time of each, Beam's over local's per round (median and bootstrap 90% interval), tokens
per second per worker, and the bytes of partial counts the workers sent into the shuffle.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_fgrams import (
    MIN_COUNT,
    VOCAB,
    K,
    run_child,
    write_dataset,
    zipf_phrase_corpus,
)
from benchmarks.common import median_interval, ratio_text

WORKERS = 2


def run(quick: bool = False) -> str:
    from scone_jax.fgrams.beam_runner import local_args

    # 64M, as bench_fgrams: Beam's fixed cost (starting its worker processes, ~K stages) is a
    # few seconds, which would dominate a corpus that local counts in one
    n_tokens = 2_000_000 if quick else 64_000_000
    rounds = 1 if quick else 2
    s = 100_000
    load_before = os.getloadavg()[0]
    tokens, offsets = zipf_phrase_corpus(n_tokens)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-beam-") as tmp:
        ds = Path(tmp) / "ds"
        write_dataset(ds, tokens, offsets, VOCAB)
        common = {"dataset": str(ds), "k": K, "s": s, "m": MIN_COUNT, "workers": WORKERS}
        configs = {
            "local": common,
            "beam": {**common, "backend": "beam", "beam_options": local_args(WORKERS)},
        }
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(rounds):
            for name in rng.permutation(list(configs)):
                runs[name].append(run_child(**configs[name]))
    fingerprints = {r["fingerprint"] for rs in runs.values() for r in rs}
    assert len(fingerprints) == 1, f"Beam and local sets differ: {fingerprints}"
    local_s = np.array([r["seconds"] for r in runs["local"]])
    beam_s = np.array([r["seconds"] for r in runs["beam"]])
    ratios = beam_s / local_s
    ratio, interval = float(np.median(ratios)), median_interval(ratios, rng)
    beam = runs["beam"][int(np.argmin(beam_s))]
    shuffle = beam["beam_shuffle_bytes"]
    workers = beam["beam_worker_tokens"]
    local_rate = n_tokens / float(np.median(local_s)) / WORKERS
    beam_rate = n_tokens / float(np.median(beam_s)) / WORKERS
    load_after = os.getloadavg()[0]
    verdict = "within" if ratio <= 4 else "OVER"
    lines = [
        "## F-gram counting on Beam worker processes",
        "",
        f"Corpus: {n_tokens:,} tokens of bench_fgrams' Zipf-like text (vocab {VOCAB:,}); K = {K}, "
        f"min count {MIN_COUNT}, S = {s:,}. Local: `--backend local --workers {WORKERS}` "
        "(threads). "
        f"Beam: the same counting as a pipeline on Beam's FnApi runner with {WORKERS} SDK worker "
        "processes (`--runner=FnApiRunner --direct_running_mode=multi_processing "
        f"--direct_num_workers={WORKERS}`); the driver process runs the stages and the shuffle, "
        "the workers count shards of 1M tokens with the local kernels and send packed partial "
        "counts. Each run is a fresh process (Beam's time includes starting its workers), "
        f"{rounds} rounds, both configurations per round in a random order. Load average at the "
        f"start and end: {load_before:.1f}, {load_after:.1f} (on {os.cpu_count()} cores).",
        "",
        "| counting | time (median) | tokens/s | tokens/s per worker | Beam / local |",
        "|---|---|---|---|---|",
        f"| local, {WORKERS} threads | {np.median(local_s):.2f} s | "
        f"{n_tokens / np.median(local_s) / 1e6:.2f} M | {local_rate / 1e6:.2f} M | 1x |",
        f"| Beam, {WORKERS} worker processes | {np.median(beam_s):.2f} s | "
        f"{n_tokens / np.median(beam_s) / 1e6:.2f} M | {beam_rate / 1e6:.2f} M | "
        f"{ratio_text(ratio, interval, 'x')} |",
        "",
        f"Beam's time is {ratio:.2f}x local's ({verdict} the 4x goal): per worker "
        f"{beam_rate / local_rate:.2f}x the local per-core rate. Same set from both (fingerprint "
        f"{fingerprints.pop()[:12]}). Shuffle: the workers sent {shuffle / 2**20:,.0f} MiB of "
        f"partial counts, {shuffle / n_tokens:.2f} bytes per token over all {K - 1} lengths "
        "(uint32 keys, counts in the narrowest unsigned type, one array pair per shard and "
        f"partition); tokens counted per worker process, all lengths: "
        f"{', '.join(f'{v / 1e6:.0f}M' for v in workers.values())}.",
        "",
        f"**200B tokens on a Beam cluster**, at this per-worker rate: "
        f"{200e9 / beam_rate / 3600:,.0f} worker-hours (one core each; e.g. "
        f"{200e9 / beam_rate / 3600 / 400:,.1f} hours on 50 machines of 8 cores), and "
        f"{shuffle / n_tokens * 200e9 / 2**40:,.1f} TiB of partial counts through the shuffle "
        "(at 1M-token shards; the 16M-token shards used above 4G tokens send fewer bytes per "
        "token, as more n-grams repeat within a shard). The same counting on local machines: "
        "the out-of-core section below.",
        "",
        "**Where Beam's time goes.** A worker recomputes a shard's ids of every shorter length "
        "(the local passes read them back instead), so at length n it probes n-2 tables per "
        "position; the shuffle then sorts each partition's partial counts again to merge them; "
        "and the runner moves every partial through its gRPC data plane and pickles it, on the "
        "same 2 cores as the workers. Starting the worker processes and running three stages "
        "per length are a fixed cost, which is why this corpus is 64M tokens.",
    ]
    return "\n".join(lines) + "\n"
