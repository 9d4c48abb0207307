"""docs/fidelity.md in small: the shipped SCONE presets against their own baselines on the
embedded corpus (the standard library's docstrings: on every install, no ../shared/data), at
400 steps (under one epoch), for fresh seeds. Each pair shares its seed (initialization and data
order); the assertion is on the mean over seeds, since one 400-step run moves by a few percent
with nothing but the summation order changed. About 15 minutes on 2 cores: `make test-fidelity`."""

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = 3
COMMON = [
    "data.max_default_corpus_mb=12",
    "train.steps=400",
    "train.eval_every=0",
    "train.eval_batches=64",
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=100000",
]


def train(preset: str, run_dir: Path, overrides: list[str]) -> float:
    """Held-out perplexity of one run (one device, one XLA thread: two runs share 2 cores)."""
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
        "JAX_PLATFORMS": "cpu",
    }
    cmd = [sys.executable, "-m", "scone_jax.cli.main", "train", preset, *COMMON, *overrides]
    done = subprocess.run(
        [*cmd, f"run_dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((run_dir / "final_eval.json").read_text())["results"]
    return results["heldout"]["perplexity"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "baseline, scone", [("tiny", "tiny_scone"), ("tiny_llama", "tiny_llama_scone")]
)
def test_the_shipped_scone_preset_beats_its_baseline_on_the_embedded_corpus(
    baseline, scone, tmp_path
):
    seeds = [int(s) for s in np.random.SeedSequence().generate_state(SEEDS) % 2**31]
    print(f"train.seed in {seeds}")
    # the first run tokenizes the corpus into its run directory; every other run reads it there
    first = (baseline, seeds[0])
    ppl = {first: train(baseline, tmp_path / f"{baseline}_{seeds[0]}", [f"train.seed={seeds[0]}"])}
    dataset = tmp_path / f"{baseline}_{seeds[0]}" / "dataset"
    rest = [(p, s) for s in seeds for p in (baseline, scone) if (p, s) != first]

    def run(point):
        preset, seed = point
        overrides = [f"train.seed={seed}", f"data.dataset={dataset}"]
        return train(preset, tmp_path / f"{preset}_{seed}", overrides)

    with ThreadPoolExecutor(2) as pool:
        ppl.update(zip(rest, pool.map(run, rest), strict=True))
    ratios = [ppl[scone, s] / ppl[baseline, s] for s in seeds]
    for s, r in zip(seeds, ratios, strict=True):
        print(
            f"seed {s}: {baseline} {ppl[baseline, s]:.2f}, "
            f"{scone} {ppl[scone, s]:.2f} ({r - 1:+.1%})"
        )
    mean = math.exp(np.mean(np.log(ratios)))
    print(f"geometric mean change {mean - 1:+.1%}")
    assert mean <= 0.97
