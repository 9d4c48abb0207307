"""Export the backbone alone (what inference needs, without the f-gram model), in the format of
artifacts/backbone.py."""

from __future__ import annotations

from pathlib import Path

import jax

from scone_jax.artifacts.backbone import FORMAT_VERSION, write_backbone
from scone_jax.artifacts.restore import host_params, load_run_params
from scone_jax.artifacts.run_dir import CheckpointChoice
from scone_jax.config import to_dict
from scone_jax.data.tokenizer import find_tokenizer_file
from scone_jax.runtime.distributed import barrier


def export_backbone(
    run_dir: str | Path,
    out: str | Path,
    step: CheckpointChoice = None,
    overwrite: bool = False,
) -> dict:
    """In a multi-process job every process takes part in the restore, and process 0 writes."""
    run = load_run_params(run_dir, step)
    params = host_params(run)
    backbone = params["backbone"] if run.cfg.fgrams.enabled else params
    meta = {
        "format_version": FORMAT_VERSION,
        "vocab_size": run.info["vocab_size"],
        "tokenizer_sha256": run.info["tokenizer_sha256"],
        "checkpoint_fingerprint": run.fingerprint,
        "checkpoint_step": run.step,
        "scone": run.cfg.fgrams.enabled,
        "combine": run.cfg.fgrams.combine if run.cfg.fgrams.enabled else None,
        "fgram_set_fingerprint": run.info.get("fgram_set_fingerprint"),
        "max_n": run.cfg.fgrams.max_n if run.cfg.fgrams.enabled else None,
    }
    if jax.process_index() == 0:
        write_backbone(
            out,
            backbone,
            to_dict(run.cfg)["model"],
            find_tokenizer_file(run.info["dataset"]),
            meta,
            overwrite,
        )
    barrier("backbone-written")
    return meta
