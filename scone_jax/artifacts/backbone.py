"""The exported backbone's format: plain files a serving stack reads without orbax. `params.npz`
(numpy arrays named by their path, e.g. `blocks/0/attn/wq`), `config.yaml` (the run's model
section), the tokenizer (`tokenizer.model` or `tokenizer.json`, as the dataset had it) and
`meta.json` (fingerprints)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import yaml

from scone_jax.atomic import atomic_dir, atomic_write_json
from scone_jax.config.load import load_yaml
from scone_jax.errors import UserError

FORMAT_VERSION = 1
BACKBONE_MARKER = "params.npz"  # a file every exported backbone holds
BACKBONE_KIND = "an exported backbone"


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


def write_backbone(
    out: str | Path,
    params: dict,
    model_section: dict,
    tokenizer: Path | None,
    meta: dict,
    overwrite: bool,
) -> None:
    with atomic_dir(out, overwrite, marker=BACKBONE_MARKER, kind=BACKBONE_KIND) as tmp:
        buffer = io.BytesIO()
        np.savez(buffer, **flatten(params))
        (tmp / "params.npz").write_bytes(buffer.getvalue())
        (tmp / "config.yaml").write_text(yaml.safe_dump({"model": model_section}, sort_keys=False))
        if tokenizer is not None and tokenizer.is_file():  # serving needs it to turn text into ids
            (tmp / tokenizer.name).write_bytes(tokenizer.read_bytes())
        atomic_write_json(tmp / "meta.json", meta)


def load_backbone(directory: str | Path) -> tuple[dict, dict, dict]:
    """(params tree, model config dict, meta) of an exported backbone."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / "meta.json").read_text())
        model = load_yaml((directory / "config.yaml").read_text())["model"]
        with np.load(directory / "params.npz", allow_pickle=False) as data:
            flat = {k: data[k] for k in data.files}
    except (OSError, ValueError, KeyError) as e:
        raise UserError(
            f"{directory} is not a readable exported backbone: {str(e).splitlines()[0]}"
        ) from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(
            f"{directory}/meta.json: format_version={meta.get('format_version')!r} (expected "
            f"{FORMAT_VERSION})"
        )
    return unflatten(flat), model, meta
