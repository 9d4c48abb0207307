"""A trained tiny SCONE run (and its exported table), shared by the export and serve tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scone_jax.config import load_config
from scone_jax.train.loop import train
from tests.conftest import make_dataset, markov_documents
from tests.train.helpers import tiny_overrides


def train_scone_run(
    root: Path, seed: int, combine: str = "replace", steps: int = 8, **overrides
) -> Path:
    rng = np.random.default_rng(seed)
    dataset = make_dataset(root / "data", markov_documents(rng, 48, 60, 400), 48)
    run_dir = root / "run"
    cfg = load_config(
        "tiny_scone",
        tiny_overrides(
            dataset.path,
            run_dir,
            steps,
            **{
                "fgrams.max_n": 4,
                "fgrams.num_fgrams": 3000,
                "fgrams.min_count": 2,
                "fgrams.combine": combine,
                "fgrams.n_layers": 1,
                "mesh.data": 2,
                "mesh.fsdp": 2,
                "mesh.tensor": 2,
                **overrides,
            },
        ),
    )
    train(cfg)
    return run_dir
