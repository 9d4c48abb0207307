"""Small runs for the train tests: a tiny model over a synthetic tokenized dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# a small f-gram model and set for the tiny runs (SCONE's train tests)
SCONE_OVERRIDES = {
    "fgrams.enabled": "true",
    "fgrams.max_n": 4,
    "fgrams.num_fgrams": 3000,
    "fgrams.min_count": 2,
    "fgrams.n_layers": 1,
}


def tiny_overrides(dataset: Path, run_dir: Path, steps: int = 20, **extra) -> list[str]:
    base = {
        "run_dir": str(run_dir),
        "data.dataset": str(dataset),
        "model.d_model": 32,
        "model.n_layers": 2,
        "model.n_heads": 2,
        "model.max_seq_len": 32,
        "data.seq_len": 32,
        "data.eval_fraction": 0.1,
        "train.batch_size": 8,
        "train.steps": steps,
        "train.log_every": 5,
        "train.eval_every": 0,
        "train.eval_batches": 2,
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "optim.warmup_steps": 2,
        "optim.lr": 0.01,
        "checkpoint.every": 5,
        "checkpoint.async_save": "false",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def read_metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def cli(args: list[str], devices: int = 8, **kwargs) -> subprocess.Popen:
    """Start `scone-jax ARGS` in a fresh process with `devices` fake CPU devices."""
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "scone_jax.cli.main", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def cli_run(args: list[str], devices: int = 8, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = cli(args, devices)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for_step(run_dir, step, proc, timeout=240, output=None):
    """Block until `run_dir`'s metrics reach `step` (the process must still be running);
    `output()` is what a failure shows (default: the process's stderr)."""
    output = output or (lambda: proc.stderr.read())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process ended early:\n{output()[-3000:]}")
        try:
            if any(r["step"] >= step for r in read_metrics(run_dir)):
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached")
