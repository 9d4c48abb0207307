"""Make sure a run has a tokenized dataset: reuse `data.dataset`, or tokenize into the run dir."""

from __future__ import annotations

from pathlib import Path

from scone_jax.config.schema import DataConfig
from scone_jax.data.dataset import META_FILE, TokenizedDataset
from scone_jax.data.tokenize import build_dataset


def dataset_path(cfg: DataConfig, run_dir: str | Path) -> Path:
    """Where a run's dataset is: `data.dataset`, or RUN_DIR/dataset."""
    return Path(cfg.dataset) if cfg.dataset else Path(run_dir) / "dataset"


def prepare_dataset(
    cfg: DataConfig, run_dir: str | Path, progress: bool = True
) -> TokenizedDataset:
    """`data.dataset` if given; else RUN_DIR/dataset, tokenized on first use (tokenizer inside
    it)."""
    if cfg.dataset:
        return TokenizedDataset.open(cfg.dataset)
    out = dataset_path(cfg, run_dir)
    if (out / META_FILE).is_file():
        return TokenizedDataset.open(out)
    return build_dataset(cfg, out, progress=progress)
