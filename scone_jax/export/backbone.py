"""Export the backbone alone (what inference needs, without the f-gram model) as plain files
a serving stack reads without orbax: `params.npz` (numpy arrays named by their path, e.g.
`blocks/0/attn/wq`), `config.yaml` (the run's model section), `tokenizer.model` and
`meta.json` (fingerprints)."""

from __future__ import annotations

import io
from pathlib import Path

import jax
import numpy as np
import yaml

from scone_jax.atomic import atomic_dir, atomic_write_json
from scone_jax.config import to_dict
from scone_jax.errors import UserError
from scone_jax.export.checkpoint_params import RunParams, host_params, load_run_params
from scone_jax.runtime.distributed import barrier

FORMAT_VERSION = 1


def flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return tree


def export_backbone(run_dir: str | Path, out: str | Path, step: int | None = None, overwrite: bool = False) -> dict:
    """In a multi-process job every process takes part in the restore, and process 0 writes."""
    run = load_run_params(run_dir, step)
    params = host_params(run)
    backbone = params["backbone"] if run.cfg.fgrams.enabled else params
    meta = {"format_version": FORMAT_VERSION, "vocab_size": run.info["vocab_size"],
            "tokenizer_sha256": run.info["tokenizer_sha256"], "checkpoint_fingerprint": run.fingerprint,
            "checkpoint_step": run.step, "scone": run.cfg.fgrams.enabled,
            "combine": run.cfg.fgrams.combine if run.cfg.fgrams.enabled else None,
            "fgram_set_fingerprint": run.info.get("fgram_set_fingerprint"),
            "max_n": run.cfg.fgrams.max_n if run.cfg.fgrams.enabled else None}
    if jax.process_index() == 0:
        write_backbone(out, backbone, run, meta, overwrite)
    barrier("backbone-written")
    return meta


def write_backbone(out: str | Path, backbone: dict, run: RunParams, meta: dict, overwrite: bool) -> None:
    with atomic_dir(out, overwrite=overwrite) as tmp:
        buffer = io.BytesIO()
        np.savez(buffer, **flatten(backbone))
        (tmp / "params.npz").write_bytes(buffer.getvalue())
        (tmp / "config.yaml").write_text(yaml.safe_dump({"model": to_dict(run.cfg)["model"]}, sort_keys=False))
        tokenizer = Path(run.info["dataset"]) / "tokenizer.model"
        if tokenizer.is_file():  # serving needs it to turn text into ids
            (tmp / "tokenizer.model").write_bytes(tokenizer.read_bytes())
        atomic_write_json(tmp / "meta.json", meta)


def load_backbone(directory: str | Path) -> tuple[dict, dict, dict]:
    """(params tree, model config dict, meta) of an exported backbone."""
    import json

    directory = Path(directory)
    try:
        meta = json.loads((directory / "meta.json").read_text())
        model = yaml.safe_load((directory / "config.yaml").read_text())["model"]
        with np.load(directory / "params.npz", allow_pickle=False) as data:
            flat = {k: data[k] for k in data.files}
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{directory} is not a readable exported backbone: {str(e).splitlines()[0]}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{directory}/meta.json: format_version={meta.get('format_version')!r} (expected {FORMAT_VERSION})")
    return unflatten(flat), model, meta
