"""Baseline train step: tokens/s, step time, FLOPs per step, and achieved FLOP/s as a fraction
of a matmul peak measured in the same run (so the ratio survives a noisy shared machine)."""

from __future__ import annotations

import time

import jax
import numpy as np

from benchmarks.common import matmul_peak
from scone_jax.config import load_config
from scone_jax.metrics.flops import model_flops
from scone_jax.model import Transformer
from scone_jax.sharding.batch import batch_shardings
from scone_jax.sharding.mesh import make_mesh
from scone_jax.sharding.rules import make_rules
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import setup_train_state
from scone_jax.train.step import make_train_step


def time_train_step(preset: str, steps: int, vocab: int) -> dict:
    cfg = load_config(preset)
    mesh, rules = make_mesh(), make_rules()
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(lambda r: Transformer(cfg.model, vocab, rngs=r), tx, 0, mesh, rules)
    bsh = batch_shardings(mesh, rules, cfg.train.batch_size, cfg.data.seq_len)
    step = make_train_step(setup.handle, tx, schedule, mesh, rules, setup.shardings, bsh)
    state = setup.create()
    rng = np.random.default_rng(0)
    shape = (cfg.train.batch_size, cfg.data.seq_len)
    batch = {k: jax.device_put(rng.integers(0, vocab, shape).astype(np.int32), bsh[k]) for k in bsh}
    state, m = step(state, batch)  # compile
    jax.block_until_ready(m)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_time = float(np.median(times))
    flops = model_flops(cfg.model, vocab, cfg.data.seq_len)
    tokens = shape[0] * shape[1]
    return {
        "preset": preset,
        "params": flops.params_total,
        "tokens_per_step": tokens,
        "step_time": step_time,
        "tokens_per_s": tokens / step_time,
        "flops_per_step": flops.train_per_token * tokens,
        "flops_per_s": flops.train_per_token * tokens / step_time,
    }


def run(quick: bool = False) -> str:
    peak = matmul_peak(512 if quick else 1024)
    rows = [time_train_step("tiny", 3 if quick else 20, 2048)]
    if not quick:
        rows.append(time_train_step("small", 8, 8192))
    peak_after = matmul_peak(512 if quick else 1024)
    peak = max(peak, peak_after)
    lines = [
        "## Baseline train step (CPU)",
        "",
        f"Matmul peak measured in this run (float32, best of 20): {peak / 1e9:.1f} GFLOP/s on "
        f"{len(jax.devices())} device(s). FLOPs per step count matmuls only (6N per token plus "
        "attention).",
        "",
        "| preset | params | tokens/step | step time (median) | tokens/s | GFLOP/step | achieved "
        "GFLOP/s | fraction of matmul peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['params']:,} | {r['tokens_per_step']:,} | "
            f"{r['step_time'] * 1e3:.1f} ms | {r['tokens_per_s']:,.0f} | "
            f"{r['flops_per_step'] / 1e9:.2f} | {r['flops_per_s'] / 1e9:.1f} | "
            f"{r['flops_per_s'] / peak:.2f} |"
        )
    lines += [
        "",
        "The gap to the matmul peak is the non-matmul work (layer norms, softmax, the optimizer "
        "update, the embedding gather) and small matrices that do not fill the cores.",
    ]
    return "\n".join(lines)
