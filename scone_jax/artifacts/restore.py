"""Restore a run's parameters (no data pipeline, no optimizer) for export, serving and
evaluation."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.run_dir import (
    RUN_INFO_FILE,
    CheckpointChoice,
    CheckpointRef,
    load_run_config,
    require_checkpoint,
    run_identity,
)
from scone_jax.config import Config
from scone_jax.errors import UserError
from scone_jax.model.build import ModelHandle, build_model_fn, split_model
from scone_jax.sharding.mesh import make_mesh
from scone_jax.sharding.rules import make_rules
from scone_jax.sharding.state import state_shardings


@dataclass
class RunParams:
    cfg: Config
    info: dict[str, Any]
    step: int
    handle: ModelHandle
    params: Any  # pure dict, sharded over `mesh`
    mesh: Mesh
    rules: dict
    fingerprint: str  # identifies (run, step): `checkpoint_fingerprint`

    def model(self):
        return self.handle.merge(self.params)


def agreed_checkpoint(run_dir: str | Path, step: int | str | None = None) -> CheckpointRef:
    """`require_checkpoint`, with every process of a job taking process 0's step: a run still
    training may commit a newer step between two processes' looks, and a restore is collective.
    A command that reads a checkpoint more than once (a table and a backbone) resolves it here
    once and passes the CheckpointRef on, so each read is of the same step."""
    checkpoint = require_checkpoint(run_dir, step)
    if jax.process_count() == 1:
        return checkpoint
    chosen = int(multihost_utils.broadcast_one_to_all(np.int64(checkpoint.step)))
    return CheckpointRef(checkpoint.directory, chosen)


def load_run_params(
    run_dir: str | Path,
    step: CheckpointChoice = None,
    mesh: Mesh | None = None,
) -> RunParams:
    """The params of a run's checkpoint: the latest, a step number, "best", or one already
    resolved (`agreed_checkpoint`)."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    info = read_run_info(run_dir)
    directory, step = step if isinstance(step, CheckpointRef) else agreed_checkpoint(run_dir, step)
    mesh = mesh or make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    rules = make_rules(cfg.mesh.rules)
    handle, abstract_params = split_model(build_model_fn(cfg, info["vocab_size"]), cfg.train.seed)
    ckpt = Checkpointer(directory, cfg.checkpoint.every, cfg.checkpoint.keep, async_save=False)
    try:
        # optimizer moments shaped like the params are sharded like them
        params = ckpt.restore_params(
            step,
            abstract_params,
            lambda shapes: state_shardings(shapes, handle.logical_axes, mesh, rules),
        )
    finally:
        ckpt.close()
    return RunParams(
        cfg=cfg,
        info=info,
        step=step,
        handle=handle,
        params=params,
        mesh=mesh,
        rules=rules,
        fingerprint=checkpoint_fingerprint(cfg, info, step),
    )


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    info_path = Path(run_dir) / RUN_INFO_FILE
    if not info_path.is_file():
        raise UserError(
            f"{run_dir} has no {RUN_INFO_FILE} (expected a run directory made by `scone-jax train`)"
        )
    return json.loads(info_path.read_text())


def run_fingerprint(run_dir: str | Path, checkpoint: CheckpointRef) -> str:
    """`checkpoint_fingerprint` of a run's checkpoint, without restoring it."""
    return checkpoint_fingerprint(load_run_config(run_dir), read_run_info(run_dir), checkpoint.step)


def checkpoint_fingerprint(cfg: Config, info: dict[str, Any], step: int) -> str:
    """What an export records of the checkpoint it came from, so a table is never served with
    another run's backbone: the config less what a restart may change, the run info less where
    its inputs lie (its `run_id` tells two runs of one config apart), and the step. A no-op
    rerun, a cadence change or a copied run directory keeps it; a regular and a best checkpoint
    of one step share it, as they share their parameters."""
    # absolute paths (a copied run's differ), and the dataset's hash, which runs before it was
    # recorded lack (the tokenizer's and the f-gram set's fingerprints stand for the inputs)
    located = {"dataset", "fgram_set", "dataset_tokens_sha256"}
    identity = {
        "config": run_identity(cfg),
        "info": {k: v for k, v in info.items() if k not in located},
        "step": int(step),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def host_params(run: RunParams) -> Any:
    """The params as numpy arrays on every process (in a multi-process job, gathered from all of
    them)."""
    return multihost_utils.process_allgather(run.params, tiled=True)


def on_local_devices(run: RunParams) -> RunParams:
    """In a multi-process job, the run with its params copied onto a mesh of this process's devices,
    for work each process does alone (its rows of the exported table) without collectives.

    The tensor axis keeps its size where the local devices allow: with the same split of every
    matmul (and as many rows per device), each row comes out bitwise as on the whole mesh."""
    if jax.process_count() == 1:
        return run
    devices = jax.local_devices()
    tensor = math.gcd(run.mesh.shape["tensor"], len(devices))
    mesh = make_mesh(len(devices) // tensor, 1, tensor, devices=devices)
    shardings = jax.tree.map(lambda x: NamedSharding(mesh, x.sharding.spec), run.params)
    return replace(run, params=jax.device_put(host_params(run), shardings), mesh=mesh)
