"""The run directory's layout: resolved config, run info, checkpoints, final evaluation.

A run directory belongs to one config. Restarting with the same config resumes; a config
that differs in anything but logging, eval and checkpoint cadence is refused, so an
existing run is never overwritten by a different one. The directory's own path may differ:
a run moved or copied elsewhere resumes there.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from scone_jax.atomic import check_output_path
from scone_jax.config import Config, load_config, save_config, to_dict
from scone_jax.errors import UserError

CONFIG_FILE = "config.yaml"
RUN_INFO_FILE = "run_info.json"  # what later stages need without the data pipeline (export, serve)
CHECKPOINTS_DIR = "checkpoints"  # orbax's step directories (artifacts/checkpoint.py)
FINAL_EVAL_FILE = "final_eval.json"  # held-out results at the last step: a finished run has one
PROFILE_DIR = "profile"  # jax.profiler traces of train.profile_steps (train/profile.py)
BEST_CHECKPOINT_DIR = "best_checkpoint"  # checkpoint.keep_best's one step (artifacts/best.py)
BEST_RECORD_FILE = "best_checkpoint.json"  # the eval losses that chose it
BEST = "best"  # names the best checkpoint where a step number is expected
# keys that may change between restarts of the same run
MUTABLE_PREFIXES = (
    "run_dir",
    "logging.",
    "train.eval_every",
    "train.eval_batches",
    "train.log_every",
    "train.profile_",
    "checkpoint.every",
    "checkpoint.keep",  # and keep_best: its record names its eval set and eval_batches, so a
    # resume that measures otherwise starts the best afresh rather than comparing across them
    "checkpoint.async_save",
    "data.eval_datasets",
)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "rules":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def run_id(run_dir: str | Path) -> str:
    """The run's own identity, drawn at its first start and kept in run_info.json through
    restarts and copies: two runs of one config (another directory, or retrained after a
    delete) are two runs, whose exports must not mix."""
    try:
        kept = json.loads((Path(run_dir) / RUN_INFO_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        kept = None
    return kept or uuid.uuid4().hex


def run_identity(cfg: Config) -> dict[str, Any]:
    """The config's keys that a restart of the same run may not change, flattened."""
    flat = _flatten(to_dict(cfg))
    return {k: v for k, v in flat.items() if not k.startswith(MUTABLE_PREFIXES)}


def config_differences(old: Config, new: Config) -> list[str]:
    a, b = run_identity(old), run_identity(new)
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def final_eval_record(cfg: Config, step: int, results: dict) -> dict:
    """FINAL_EVAL_FILE's contents: the results, the step, and the eval settings that made them
    (a rerun with other eval sets or batches evaluates again)."""
    return {
        "step": int(step),
        "results": results,
        "eval_datasets": [str(Path(p).absolute()) for p in cfg.data.eval_datasets],
        "eval_batches": cfg.train.eval_batches,
    }


def final_results(run_dir: str | Path, cfg: Config, step: int | None = None) -> dict | None:
    """The final evaluation's results, if RUN_DIR holds one made with `cfg`'s eval sets and
    batches (and at `step`, when given); None otherwise (a record of older settings included)."""
    try:
        record = json.loads((Path(run_dir) / FINAL_EVAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("results"), dict):
        return None
    if step is not None and record.get("step") != step:
        return None
    current = final_eval_record(cfg, 0, {})
    if any(record.get(k) != current[k] for k in ("eval_datasets", "eval_batches")):
        return None
    return record["results"]


def check_run_dir(cfg: Config) -> Path:
    """The run dir of `cfg`, after checking that an existing one holds the same run (or one
    that never started: a config saved and nothing else, as a sweep plans its points)."""
    run_dir = Path(cfg.run_dir)
    check_output_path(run_dir, "run_dir")
    saved = run_dir / CONFIG_FILE
    if saved.is_file():
        differs = config_differences(load_config(saved), cfg)
        never_started = {p.name for p in run_dir.iterdir()} == {CONFIG_FILE}
        if differs and not never_started:  # a run that wrote nothing yet may take a new config
            raise UserError(
                f"run_dir {run_dir} holds a run with a different config (differs in "
                f"{', '.join(differs[:5])}); use a new run_dir or the same config to resume"
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(
            f"run_dir {run_dir} exists and is not a scone_jax run directory (no {CONFIG_FILE}); "
            "expected a new or empty directory"
        )
    return run_dir


def save_run_config(cfg: Config) -> None:
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    save_config(cfg, Path(cfg.run_dir) / CONFIG_FILE)


def load_run_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return load_config(path)


def profile_dir(run_dir: str | Path, process_index: int = 0) -> Path:
    """Where a process writes its trace: `profile/`, or `profile/process_I` for I > 0."""
    base = Path(run_dir) / PROFILE_DIR
    return base / f"process_{process_index}" if process_index else base


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def best_checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / BEST_CHECKPOINT_DIR


def committed_steps(directory: str | Path) -> list[int]:
    """The steps of an orbax checkpoint directory, read from the names of its step directories
    (orbax commits a save by renaming it to its step; a missing directory has none)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


class CheckpointRef(NamedTuple):
    directory: Path  # an orbax checkpoint directory: checkpoints/ or best_checkpoint/
    step: int


# what a command may name a checkpoint by: the latest (None), a step number, "best", or a
# CheckpointRef already resolved, so that every read of one command is of the same step
CheckpointChoice = int | str | CheckpointRef | None


def require_checkpoint(run_dir: str | Path, step: int | str | None = None) -> CheckpointRef:
    """Where the checkpoint of a run to read is (the latest when `step` is None, the one that
    checkpoint.keep_best kept when it is "best"), checked before any setup.

    Reads the step directories' names rather than opening orbax, which would create
    RUN_DIR/checkpoints in a run that has none.
    """
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        raise UserError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    directory = best_checkpoint_dir(run_dir) if step == BEST else checkpoints_dir(run_dir)
    steps = committed_steps(directory)
    if step == BEST:
        if not steps:
            raise UserError(
                f"run {run_dir} has no best checkpoint (expected {directory}/<step>, kept by "
                "training with checkpoint.keep_best=heldout)"
            )
        return CheckpointRef(directory, steps[-1])
    if not steps:
        raise UserError(
            f"run {run_dir} has no checkpoint (expected {directory}/<step> written by `scone-jax "
            "train`)"
        )
    if step is not None and step not in steps:
        raise UserError(f"run {run_dir} has no checkpoint at step {step} (expected one of {steps})")
    return CheckpointRef(directory, steps[-1] if step is None else step)
