"""One prepared run for a lent accelerator (`make gpu-check`): the model-level equivalence tests on
the accelerator, then SCONE's train step against the baseline (tiny, small, and a GPT-2 128M-shaped
backbone at 16 x 1024 tokens in bfloat16) and decoding with the table in host RAM or on disk
against the baseline. Writes OUT/gpu_check.md (and prints it) as soon as each part is done, so a
run cut short still leaves what it measured.

Accelerator time is scarce: `--parts` picks parts for a rerun, `--quick` is a smoke run (any
backend, a minute on CPU).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

from benchmarks import bench_scone, bench_serve
from benchmarks.common import ratio_text

REPO = Path(__file__).resolve().parents[1]
PARTS = ("tests", "plan", "scone", "serve")
# tests that need no mesh of fake devices: they run on whatever device jax picks
MODEL_TESTS = ("tests/model", "tests/metrics")
GPT2_128M_SHAPED = ("data.tokenizer_vocab_size=8192",)  # a vocabulary the default corpus can train


def device_line() -> str:
    devices = jax.devices()
    return (
        f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()}), jax "
        f"{jax.__version__}, Python {platform.python_version()}"
    )


def run_tests(quick: bool) -> list[str]:
    """The model tests in a fresh process on this backend, matmuls at full float32 precision (the
    equivalence tests compare float32 results; TF32 would blur them)."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS") or jax.default_backend(),
        "JAX_DEFAULT_MATMUL_PRECISION": "highest",
        "PYTHONUNBUFFERED": "1",
    }
    targets = [f"{MODEL_TESTS[1]}"] if quick else list(MODEL_TESTS)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    lines = [
        "## Model tests on the accelerator",
        "",
        f"`pytest {' '.join(targets)}` with JAX_PLATFORMS={env['JAX_PLATFORMS']}, matmul precision "
        f"highest: **{summary}** (exit {done.returncode}, {time.perf_counter() - start:.0f} s).",
    ]
    if done.returncode:
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        lines += ["", "```", *failed[:20], *done.stderr.strip().splitlines()[-10:], "```"]
    return lines


def scone_steps(quick: bool, work: Path) -> list[str]:
    """SCONE dedup and plain train steps against the baseline, with each setting's distinct ratio
    and the f-gram model's share of the FLOPs."""
    settings = [("tiny", "tiny", 16, ()), ("small", "small", 16, ())]
    if not quick:
        settings.append(
            (
                "GPT-2 128M-shaped (d 1024, 6 layers, bf16), 16 x 1024",
                "paper/gpt2_128m",
                16,
                GPT2_128M_SHAPED,
            )
        )
    lines = [
        "## SCONE train step vs the baseline on the accelerator",
        "",
        "F-gram model 1x, K = 5, every f-gram of count >= 3 in the text (up to 100K), as in "
        "BENCHMARKS.md; ratios are medians of per-round ratios in lockstep, with bootstrap 90% "
        "intervals.",
        "",
        "| setting | f-grams | baseline step | dedup | ratio | plain | ratio | distinct ratio | "
        "prefix nodes per position | f-gram FLOPs / backbone FLOPs (dedup) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, preset, batch, overrides in settings:
        folder = work / preset.replace("/", "_")
        folder.mkdir(parents=True)
        r = bench_scone.measure(
            preset, 3 if quick else 30, folder, batch_size=batch, overrides=overrides
        )
        t = r["times"]
        shown = {m: ratio_text(r["ratios"][m], r["intervals"][m], "x") for m in ("dedup", "plain")}
        d = r["dedup"]
        lines.append(
            f"| {name} | {r['num_fgrams']:,} | {t['baseline'] * 1e3:.2f} ms | "
            f"{t['dedup'] * 1e3:.2f} ms | {shown['dedup']} | {t['plain'] * 1e3:.2f} ms | "
            f"{shown['plain']} | {d['distinct_ratio']:.2f} | "
            f"{d['fgram_nodes'] / r['positions']:.2f} | {d['fgram_flops_fraction']:.2f} |"
        )
    return lines


def plan_on_device(quick: bool, work: Path) -> list[str]:
    """`scone-jax plan` on this accelerator against its real memory: one device's share of the
    GPT-2 128M preset's run on 8 (64 sequences of 1024, in the preset's microbatches), baseline
    and SCONE, with the attention `auto` picks here."""
    from scone_jax.config import load_config
    from scone_jax.model.layers import attention_implementation
    from scone_jax.train.plan import GIB, plan_train_step

    share = ["train.batch_size=8", "train.microbatches=1"] if quick else ["train.batch_size=64"]
    settings = [("tiny", "tiny")] if quick else [("paper/gpt2_128m", "gpt2_128m")]
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    lines = [
        "## Memory plan against the device",
        "",
        f"Device memory: {limit / GIB:.1f} GiB (`memory_stats()['bytes_limit']`)."
        if limit
        else "Device memory: not reported by this backend.",
        "",
        "| preset | SCONE | attention | microbatches | remat | peak per device (XLA) | fits | "
        "compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset, name in settings:
        for scone in (False, True):
            extra = ["fgrams.enabled=true", "fgrams.num_fgrams=1000000"] if scone else []
            cfg = load_config(preset, [*share, "mesh.data=1", *extra])
            plan = plan_train_step(cfg, jax.devices()[:1], (limit or 80 * GIB) / GIB)
            peak = plan["per_device_bytes"]["peak"] / GIB
            attention = attention_implementation(cfg.model.attention, cfg.model.dtype)
            lines.append(
                f"| {name} | {scone} | {attention} | {plan['microbatches']} | {plan['remat']} | "
                f"{peak:.1f} GiB | {plan['fits']} | {plan['compile_s']:.1f} |"
            )
    return lines


def serve_decode(quick: bool, work: Path) -> list[str]:
    """Decode tok/s with the table in host RAM and on disk against the baseline (bench_serve's
    method), where the device step is fast and the host-side lookup weighs most."""
    from scone_jax.config import load_config

    rows, new_tokens = (100_000, 16) if quick else (1_000_000, 64)
    side, base, tiers = bench_serve.table_engines(work / "table", rows, load_config("small").model)
    lines = [
        "## Decoding with the table off the accelerator",
        "",
        f"Small preset backbone, vocabulary {side:,}, a table of {rows:,} bigram rows (bfloat16), "
        f"32-token prompts, {new_tokens} new tokens sampled; each tier in lockstep with the "
        "baseline.",
        "",
        "| batch | tier | baseline tok/s | tier tok/s | tier / baseline |",
        "|---|---|---|---|---|",
    ]
    for batch in (1, 16):
        measured = bench_serve.tier_rates(base, tiers, batch, side, new_tokens, 2 if quick else 15)
        lines += [
            f"| {batch} | {tier} | {base_rate:,.0f} | {rate:,.0f} | {ratio} |"
            for tier, (base_rate, rate, ratio) in measured.items()
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown} (expected some of {PARTS})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "gpu_check.md"
    lines = ["# Accelerator check", "", f"{datetime.date.today().isoformat()}: {device_line()}."]
    work = Path(tempfile.mkdtemp(prefix="scone-gpu-check-"))
    for part in parts:
        start = time.perf_counter()
        print(f"== {part}", file=sys.stderr, flush=True)
        try:
            if part == "tests":
                section = run_tests(args.quick)
            else:
                section = {"plan": plan_on_device, "scone": scone_steps, "serve": serve_decode}[
                    part
                ](args.quick, work / part)
        except Exception as e:  # keep the other parts' results
            section = [
                f"## {part}",
                "",
                f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
            ]
        lines += ["", *section, "", f"({part}: {time.perf_counter() - start:.0f} s)"]
        report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
