"""SCONE train step time over the same backbone's baseline, with and without deduplication,
on real text, with the distinct-f-gram ratio measured on the same batches."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import jax
import numpy as np

from benchmarks.common import interleaved_timings, ratio_text, real_text_dataset
from scone_jax.config import load_config
from scone_jax.data.pipeline import BatchStream, WindowSource, split_documents
from scone_jax.metrics.flops import fgram_forest_forward, model_flops
from scone_jax.model.build import build_model_fn
from scone_jax.sharding.batch import batch_shardings
from scone_jax.sharding.mesh import make_mesh
from scone_jax.sharding.rules import make_rules
from scone_jax.train.fgram_inputs import prepare_fgram_inputs
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import setup_train_state
from scone_jax.train.step import device_arrays, make_train_step

# glibc settings under which XLA's per-step temp buffer is reused instead of mapped afresh (and
# page-faulted in) every step: one arena, no mmap for large blocks, never trimmed.
NO_REFAULT_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 36),
}


def page_faults_per_call(fn, calls: int = 3) -> float:
    counts = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return float(np.median(counts))


# every f-gram of count >= 3 in the text (fewer than 100K exist): the most matches this text gives
EVERY_FGRAM = (
    "fgrams.max_n=5",
    "fgrams.num_fgrams=100000",
    "fgrams.min_count=3",
    "fgrams.model_size=1x",
)


def shipped_fgrams(scone_preset: str, preset: str) -> tuple[str, ...]:
    """The f-gram settings of a shipped SCONE preset, as overrides of its backbone's `preset`."""
    cfg = load_config(scone_preset)
    if cfg.model != load_config(preset).model:
        raise ValueError(f"{scone_preset}'s backbone differs from {preset}'s")
    f = cfg.fgrams
    return (
        f"fgrams.max_n={f.max_n}",
        f"fgrams.num_fgrams={f.num_fgrams}",
        f"fgrams.min_count={f.min_count}",
        f"fgrams.model_size={f.model_size}",
    )


def measure(
    preset: str,
    rounds: int,
    workdir,
    modes=("baseline", "dedup", "plain"),
    batch_size: int = 0,
    fgrams: tuple[str, ...] = EVERY_FGRAM,
    overrides: tuple[str, ...] = (),
) -> dict:
    """Step times of `modes` on `preset` with the f-gram settings `fgrams` (at `batch_size`
    windows per batch, when given; `overrides` apply to every mode)."""
    common = [*([f"train.batch_size={batch_size}"] if batch_size else []), *overrides]
    cfg = load_config(preset, ["fgrams.enabled=true", *fgrams, *common])
    dataset, source = real_text_dataset(cfg.data.tokenizer_vocab_size, workdir)
    vocab = dataset.vocab_size
    mesh, rules = make_mesh(), make_rules()
    train_ids, _ = split_documents(dataset.num_docs, cfg.data.eval_fraction, cfg.data.seed)
    positions = cfg.train.batch_size * cfg.data.seq_len
    window = WindowSource(dataset, train_ids, cfg.data.seq_len)
    out = {
        "preset": preset,
        "source": source,
        "block": cfg.fgrams.block_size,
        "positions": positions,
    }
    steps = {}
    for mode in modes:
        scone = mode != "baseline"
        run_cfg = load_config(
            preset,
            common
            if not scone
            else [
                "fgrams.enabled=true",
                *fgrams,
                f"fgrams.dedup={'true' if mode == 'dedup' else 'false'}",
                *common,
            ],
        )
        transform = None
        if scone:
            inputs = prepare_fgram_inputs(
                run_cfg.fgrams,
                dataset,
                train_ids,
                workdir / f"run_{preset}_{mode}",
                positions,
                groups=1,
                progress=False,
            )
            stream0 = BatchStream(window, cfg.train.batch_size, seed=0)
            inputs.batcher.calibrate(stream0.raw_batch(k) for k in range(8))
            transform = inputs.batcher
        stream = BatchStream(window, cfg.train.batch_size, seed=0, transform=transform)
        batches = [stream.batch(k) for k in range(4)]
        tx, schedule = make_optimizer(run_cfg.optim, 1000)
        setup = setup_train_state(build_model_fn(run_cfg, vocab), tx, 0, mesh, rules)
        bsh = batch_shardings(
            mesh,
            rules,
            cfg.train.batch_size,
            cfg.data.seq_len,
            run_cfg.fgrams.max_n if scone else None,
        )
        step = make_train_step(setup.handle, tx, schedule, mesh, rules, setup.shardings, bsh)
        device_batches = [
            {k: jax.device_put(np.asarray(v), bsh[k]) for k, v in device_arrays(b).items()}
            for b in batches
        ]
        holder = {"state": setup.create(), "i": 0}

        def run_step(step=step, holder=holder, device_batches=device_batches):
            holder["state"], m = step(
                holder["state"], device_batches[holder["i"] % len(device_batches)]
            )
            holder["i"] += 1
            jax.block_until_ready(m)

        run_step()  # compile
        steps[mode] = run_step
        if scone:
            stats = [b["fgram_stats"] for b in batches]
            out[mode] = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
            out["num_fgrams"], out["requested"] = (
                len(inputs.fgram_set.lengths),
                run_cfg.fgrams.num_fgrams,
            )
            fwd = fgram_forest_forward(
                run_cfg.fgrams,
                run_cfg.model,
                out[mode]["fgram_positions"],
                out[mode]["fgram_outputs"],
            )
            out[mode]["fgram_flops_fraction"] = fwd / (
                model_flops(run_cfg.model, vocab, cfg.data.seq_len).forward_per_token * positions
            )
            out[mode]["fgram_tokens"] = float(
                np.mean(
                    [  # the f-gram model's positions without prefix sharing
                        inputs.fgram_set.lengths[
                            np.unique(b["fgram_ids"][b["fgram_ids"] >= 0])
                        ].sum()
                        if mode == "dedup"
                        else (b["fgram_ids"] >= 0).sum()
                        for b in batches
                    ]
                )
            )
        del holder
    # each SCONE variant is timed against the baseline alone: a third, memory-heavier variant in
    # the same rotation slows the other two (its allocations and cache footprint)
    out["times"], out["ratios"], out["intervals"] = {}, {}, {}
    for mode in modes[1:]:
        times, ratios, intervals = interleaved_timings(
            {"baseline": steps["baseline"], mode: steps[mode]}, rounds
        )
        out["times"].setdefault("baseline", times["baseline"])
        out["times"][mode], out["ratios"][mode], out["intervals"][mode] = (
            times[mode],
            ratios[mode],
            intervals[mode],
        )
    out["page_faults"] = {mode: page_faults_per_call(fn) for mode, fn in steps.items()}
    return out


def measure_without_refaults(preset: str, rounds: int, workdir) -> dict:
    """`measure` of the baseline and dedup in a fresh process under NO_REFAULT_ENV (glibc reads
    it at start-up)."""
    code = (
        "import json, sys, pathlib; from benchmarks.bench_scone import measure; "
        f"print(json.dumps(measure({preset!r}, {rounds}, pathlib.Path({str(workdir)!r}), "
        "('baseline', 'dedup'))))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **NO_REFAULT_ENV},
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_interval(result: dict) -> str:
    return ratio_text(result["ratios"]["dedup"], result["intervals"]["dedup"], "x")


def run(quick: bool = False) -> str:
    import tempfile
    from pathlib import Path

    workdir = Path(tempfile.mkdtemp(prefix="scone-bench-scone-"))
    presets = ["tiny"] if quick else ["tiny", "small"]
    rounds = {p: 3 if quick else {"tiny": 20}.get(p, 10) for p in presets}
    (workdir / "tiny_scone").mkdir()
    results = [
        measure(
            "tiny",
            rounds["tiny"],
            workdir / "tiny_scone",
            fgrams=shipped_fgrams("tiny_scone", "tiny"),
        )
    ]
    results[0]["preset"] = "tiny (tiny_scone)"
    results += [measure(p, rounds[p], workdir) for p in presets]
    (workdir / "no_refaults").mkdir()
    fresh = measure_without_refaults("tiny", rounds["tiny"], workdir / "no_refaults")
    (workdir / "batch_64").mkdir()
    larger = measure(
        "tiny", 3 if quick else 10, workdir / "batch_64", ("baseline", "dedup"), batch_size=64
    )
    lines = [
        "## SCONE train step vs the baseline (CPU)",
        "",
        f"Text: {results[0]['source']}. F-gram model 1x (same depth as the backbone), K = 5, "
        "f-grams counted on the training split: the first row with the f-gram settings of the "
        f"shipped `tiny_scone` preset (S = {results[0]['requested']:,}), the others with every "
        'f-gram of count 3 or more (up to 100K; the "f-grams" column says how many that is), the '
        "hardest setting this text gives. The same 4 batches for every variant. Dedup and plain "
        "are each timed against the baseline in their own rotation (a third, memory-heavier "
        "variant in the same rotation slowed the other two and moved their ratio, in a trial by "
        "+0.1x): each round runs one step of both in a fresh random order; step times are medians "
        "over rounds, ratios the medians of each round's ratio to the baseline.",
        "",
        "| preset | f-grams | baseline step | SCONE dedup | ratio | SCONE plain | ratio | match "
        "rate | distinct ratio | mean match length | tokens of the distinct f-grams | prefix nodes "
        "| slots computed (dedup / plain) | output slots (dedup) | f-gram FLOPs / backbone FLOPs "
        "(dedup) | page faults per step (baseline / dedup) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t, ratio, faults = r["times"], r["ratios"], r["page_faults"]
        d, p = r["dedup"], r["plain"]
        lines.append(
            f"| {r['preset']} | {r['num_fgrams']:,} | {t['baseline'] * 1e3:.0f} ms | "
            f"{t['dedup'] * 1e3:.0f} ms | {ratio['dedup']:.2f}x | {t['plain'] * 1e3:.0f} ms | "
            f"{ratio['plain']:.2f}x | {d['match_rate']:.2f} | {d['distinct_ratio']:.2f} | "
            f"{d['mean_match_length']:.2f} | {d['fgram_tokens']:.0f} | {d['fgram_nodes']:.0f} | "
            f"{d['fgram_positions']:.0f} / {p['fgram_positions']:.0f} | {d['fgram_outputs']:.0f} | "
            f"{d['fgram_flops_fraction']:.2f} | {faults['baseline']:,.0f} / {faults['dedup']:,.0f} "
            "|"
        )
    ft, ff = fresh["times"], fresh["page_faults"]
    lines += [
        "",
        "Target (issue): at most 1.5x the baseline with deduplication on the tiny and small "
        f"presets; here {with_interval(results[0])} at the tiny_scone preset's settings, "
        + "".join(f"{with_interval(r)} on {r['preset']}, " for r in results[2:])
        + f"and {with_interval(results[1])} on tiny with every f-gram (bootstrap 90% intervals of "
        "the median "
        "over this run's rounds; separate runs drift further). What sets the ratio is the f-gram "
        "model's FLOPs relative to the backbone's: each position the f-gram model computes costs "
        "about one backbone position without the output layer (1x), so the overhead is about "
        "(f-gram positions computed / batch positions) x (f-gram model FLOPs per position / "
        "backbone FLOPs per position). Deduplication computes each distinct f-gram once, and "
        "because the f-gram model is causal with start-aligned positions, f-grams sharing a prefix "
        "share its positions too: the batch's f-grams form a prefix forest and each distinct "
        'prefix is one node ("tokens of the distinct f-grams" is what computing each distinct '
        'f-gram alone would cost, "prefix nodes" what the forest costs). Nodes are laid out '
        f"depth-first in blocks of {results[0]['block']} slots, attention dense within a block: a "
        "first token's nodes that fit a block are packed with others' into shared blocks, larger "
        "ones are cut with their ancestors copied at the cut; slots add those copies and the "
        "static buffer's headroom. The last layer's output projection and MLP run on the output "
        'nodes only ("output slots"). Plain computes one chain per matched position. On these '
        "small CPU batches the distinct ratio stays high (few repeats within 16 windows); it falls "
        "as batches grow, which is where the paper's setting (512 x 1024 tokens per batch) sits. "
        f"Tiny with every f-gram at 64 windows ({larger['positions']:,} tokens per batch): "
        f"distinct ratio {larger['dedup']['distinct_ratio']:.2f}, "
        f"{larger['dedup']['fgram_nodes'] / larger['positions']:.2f} prefix nodes per position (at "
        f"16 windows: {results[1]['dedup']['fgram_nodes'] / results[1]['positions']:.2f}), f-gram "
        f"FLOPs / backbone FLOPs {larger['dedup']['fgram_flops_fraction']:.2f}, step time "
        f"{larger['ratios']['dedup']:.2f}x the baseline's.",
        "",
        "**Page faults.** XLA on CPU allocates each step's temporaries as one buffer; glibc maps a "
        "block that large afresh on every call and unmaps it after, so every step page-faults (and "
        "the kernel zeroes) all of it: the last column. Those faults cost the baseline relatively "
        "more than SCONE. Run in a fresh process under "
        f"`{' '.join(f'{k}={v}' for k, v in NO_REFAULT_ENV.items())}` (the buffer is then reused), "
        f"tiny with every f-gram measures: baseline {ft['baseline'] * 1e3:.0f} ms, SCONE dedup "
        f"{ft['dedup'] * 1e3:.0f} ms, ratio {fresh['ratios']['dedup']:.2f}x, page faults per step "
        f"{ff['baseline']:,.0f} / {ff['dedup']:,.0f}. Those settings make CPU training steps "
        "faster (docs/training.md has when they do not pay off); the ratio without faults is the "
        "one to hold against the FLOP fraction.",
    ]
    return "\n".join(lines)
