"""Counting and tagging out of core as the corpus grows, within a 4 GiB memory budget.

The corpus is bench_fgrams' Zipf-like text with phrase structure, generated 16M tokens at a
time (one phrase lexicon for all pieces) and written as tokenized datasets of 16M, 64M, 256M
and 1,024M tokens (`--quick`: 2M and 4M);
each is counted with `--memory-budget 4G`, forced onto the out-of-core path so that every
size takes the same one, then tagged into the `.npy` memmaps of the tags (also within the
budget), each in a fresh process. Measured: time, peak resident memory, and the bytes the
process moved through the file system (read: corpus and scratch; written: scratch and tags).
The largest size is measured; a log-log fit of time against tokens extrapolates to 200B.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_fgrams import VOCAB, K, run_child, zipf_phrase_corpus

BUDGET = 4 << 30
# At min count 5 the survivors of the 1B-token corpus outgrow half the budget before pass 5
# (2,226 MiB, measured 2026-12-02) and the count stops, asking for a higher min count; 10 fits.
# S's cutoff count is far above either at every size here, so the selected set is the same.
MIN_COUNT = 10
S = 100_000
WORKERS = 2

_TAG_CHILD = r"""
import json, os, sys, time
from scone_jax.fgrams.corpus import Corpus
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tag_corpus
args = json.loads(sys.argv[1])
corpus = Corpus.from_dataset(args["dataset"])
fs = FgramSet.load(args["set"])
rss0 = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
io0 = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
t = time.perf_counter()
tag_corpus(fs, corpus, args["ids"], args["lengths"], workers=args["workers"], progress=False,
           memory_budget=args["budget"])
dt = time.perf_counter() - t
io1 = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"seconds": dt, "peak_rss": peak, "base_rss": rss0,
                  "io": {k: int(io1[k]) - int(io0[k]) for k in io1}}))
"""


def write_growing(directory: Path, sizes: list[int], piece: int) -> dict[int, Path]:
    """One dataset per size (multiples of `piece`), each a prefix of the next: pieces of
    `piece` tokens, generated once and appended to every dataset that still wants them."""
    from scone_jax.data.dataset import DatasetWriter

    writers = {}
    for n in sizes:
        (directory / f"ds{n}").mkdir(parents=True)
        writers[n] = DatasetWriter(directory / f"ds{n}", VOCAB)
    for i in range(max(sizes) // piece):
        tokens, offsets = zipf_phrase_corpus(piece, seed=1 + i, lexicon_seed=0)
        for n, w in writers.items():
            if i * piece < n:
                for a, b in zip(offsets[:-1], offsets[1:]):
                    w.add(tokens[a:b])
    for w in writers.values():
        w.finish(np.ones(VOCAB, np.int32), tokenizer_sha256="bench", corpus_sha256="bench")
    return {n: directory / f"ds{n}" for n in sizes}


def loglog_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(exponent, log10 prefactor) of y ~ c * x^e, least squares in log-log."""
    e, c = np.polyfit(np.log10(x), np.log10(y), 1)
    return float(e), float(c)


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def run(quick: bool = False) -> str:
    sizes = [2_000_000, 4_000_000] if quick else [16_000_000 << (2 * i) for i in range(4)]
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tmp = Path(tmp)
        datasets = write_growing(tmp, sizes, piece=min(sizes))
        for n in sizes:
            counted = run_child(
                dataset=str(datasets[n]),
                k=K,
                s=S,
                m=MIN_COUNT,
                workers=WORKERS,
                budget=BUDGET,
                force_disk=True,
                tmp=str(tmp / "scratch"),
                save=str(tmp / f"set{n}"),
            )
            tagged = run_child(
                _TAG_CHILD,
                dataset=str(datasets[n]),
                set=str(tmp / f"set{n}"),
                ids=str(tmp / "ids.npy"),
                lengths=str(tmp / "lengths.npy"),
                workers=WORKERS,
                budget=BUDGET,
            )
            assert counted["plan"] == "disk"
            rows.append({"n": n, "count": counted, "tag": tagged})
    load_after = os.getloadavg()[0]
    tokens = np.array([r["n"] for r in rows], float)
    t_count = np.array([r["count"]["seconds"] for r in rows])
    t_tag = np.array([r["tag"]["seconds"] for r in rows])
    e_count, c_count = loglog_fit(tokens, t_count)
    e_tag, c_tag = loglog_fit(tokens, t_tag)
    e_mem, c_mem = loglog_fit(tokens, np.array([r["count"]["peak_rss"] for r in rows], float))
    if not quick:
        _plot(rows, Path(__file__).resolve().parent / "scale.png")

    def at(n: float, e: float, c: float) -> float:
        return 10 ** (c + e * np.log10(n))

    last = rows[-1]
    written = last["count"]["io"]["wchar"] / last["n"]
    read = last["count"]["io"]["rchar"] / last["n"]
    rate = last["n"] / last["count"]["seconds"]
    lines = [
        "## Counting and tagging out of core as the corpus grows",
        "",
        f"bench_fgrams' Zipf-like corpus (vocab {VOCAB:,}) written as tokenized datasets of "
        f"{', '.join(f'{n / 1e6:.0f}M' for n in sizes)} tokens (each a prefix of the next); "
        f"K = {K}, min count {MIN_COUNT} (at 5, the 1B corpus's survivors outgrow half the budget "
        "before pass 5 and the count stops asking for a higher min count; the cutoff "
        f"column shows that S = {S:,} never reaches down to either), {WORKERS} workers, "
        "memory budget "
        f"{gib(BUDGET)}, counting forced onto its out-of-core path at every size (left to "
        f"itself, the plan keeps it in RAM up to {_ram_limit() / 1e6:.0f}M tokens at this "
        "budget) and tagging into the `.npy` memmaps of the tags. "
        "Each run is a fresh process; peak RSS is the process's high-water mark (VmHWM); I/O "
        "is what the process moved through the file system (`/proc/self/io` rchar/wchar: the "
        "corpus read by pread, the scratch files, the tags). Tagging's peak RSS includes the "
        "pages of the tag memmaps it wrote (5 bytes per token, file-backed: the kernel writes "
        "them back and drops them under memory pressure). Load average at the start and "
        f"end: {load_before:.1f}, {load_after:.1f} (on {os.cpu_count()} cores).",
        "",
        "| tokens | count | tokens/s | peak RSS | read / written per token | cutoff count | "
        "tag (memmaps) | tokens/s | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, t, n = r["count"], r["tag"], r["n"]
        lines.append(
            f"| {n / 1e6:.0f}M | {c['seconds']:.1f} s | {n / c['seconds'] / 1e6:.2f} M | "
            f"{gib(c['peak_rss'])} | {c['io']['rchar'] / n:.0f} B / {c['io']['wchar'] / n:.0f} B | "
            f"{c['cutoff']:,} | {t['seconds']:.1f} s | {n / t['seconds'] / 1e6:.2f} M | "
            f"{gib(t['peak_rss'])} |"
        )
    lines += [
        "",
        f"Fit over these runs: counting time ~ tokens^{e_count:.2f}, tagging ~ tokens^{e_tag:.2f} "
        "(`benchmarks/scale.png`: time and peak memory against tokens, log-log). "
        + (
            f"The largest run, {last['n'] / 1e9:.2f}B tokens, was measured, not extrapolated: "
            f"counting {last['count']['seconds'] / 60:.1f} min and tagging "
            f"{last['tag']['seconds'] / 60:.1f} min, peak RSS {gib(last['count']['peak_rss'])} "
            f"and {gib(last['tag']['peak_rss'])}, "
            f"{read * last['n'] / 2**30:,.0f} GiB read and {written * last['n'] / 2**30:,.0f} GiB "
            "written through the file system while counting. "
            if last["n"] >= 1e9
            else "**1B tokens was not run here**; extrapolated: counting "
            f"{at(1e9, e_count, c_count) / 60:.0f} min, tagging {at(1e9, e_tag, c_tag) / 60:.0f} "
            f"min, and, read and written per token as at the largest run, "
            f"{read * 1e9 / 2**30:,.0f} GiB read and {written * 1e9 / 2**30:,.0f} GiB written "
            "through the file system. "
        )
        + "Peak memory grows with the survivor tables only "
        "(per-position ids and candidate keys live in scratch files), as tokens^"
        f"{e_mem:.2f} here: {gib(at(1e9, e_mem, c_mem))} by the fit at 1B, "
        f"{'within' if at(1e9, e_mem, c_mem) <= BUDGET else 'OVER'} the budget (the tables "
        "must fit half of it, or the count stops with a message saying to raise the min count).",
        "",
        f"**200B tokens.** One 2-core machine at the largest run's rate ({rate / 1e6:.2f}M "
        f"tokens/s) would count for {200e9 / rate / 3600:,.0f} hours, i.e. "
        f"{200e9 / rate / 3600 * WORKERS:,.0f} core-hours, and move "
        f"{(read + written) * 200e9 / 2**40:,.0f} TiB through its disk; the survivors at min "
        "count 10 would outgrow a 4 GiB budget long before (raise the min count, or the budget "
        "on a bigger machine). The Beam section above gives the cluster side: per-worker rate "
        "and shuffle bytes per token, from which core-hours and shuffle volume at 200B follow.",
    ]
    return "\n".join(lines) + "\n"


def _ram_limit() -> int:
    """The largest corpus that `outofcore.plan` counts in RAM at BUDGET (bisection)."""
    from scone_jax.fgrams.outofcore import plan

    lo, hi = 1, 1 << 40
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if plan(mid, BUDGET, WORKERS).mode == "memory" else (lo, mid)
    return lo


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["n"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.loglog(n, [r["count"]["seconds"] for r in rows], "o-", label="count (out of core)")
    a.loglog(n, [r["tag"]["seconds"] for r in rows], "s-", label="tag (memmaps)")
    a.set_ylabel("seconds")
    a.legend()
    b.loglog(n, [r["count"]["peak_rss"] / 2**30 for r in rows], "o-", label="count")
    b.loglog(n, [r["tag"]["peak_rss"] / 2**30 for r in rows], "s-", label="tag")
    b.axhline(BUDGET / 2**30, color="gray", ls="--", label="budget")
    b.set_ylabel("peak RSS (GiB)")
    b.legend()
    for ax in (a, b):
        ax.set_xlabel("tokens")
        ax.set_xticks(n, [f"{x / 1e6:.0f}M" for x in n])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
