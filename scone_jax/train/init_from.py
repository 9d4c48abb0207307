"""`model.init_from: DIR`: the backbone starts from a Hugging Face checkpoint instead of random
weights (one `scone-jax export --hf-out` wrote, or a GPT-2 / Llama one saved locally).

In a SCONE run only the backbone is loaded; the f-gram model starts fresh (with the gated
combine, from a zero gate), so SCONE is added to a pretrained model. The checkpoint must match
the run's model section field by field, and a tokenizer file in DIR must be the one the
dataset was tokenized with: otherwise one line names the difference. A resumed run restores its
own checkpoint and never reads DIR again.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding

from scone_jax.artifacts.hf_checkpoint import (
    check_compatible,
    from_hf_tensors,
    model_fields,
    read_checkpoint,
)
from scone_jax.config import Config
from scone_jax.data.tokenizer import find_tokenizer_file, load_tokenizer
from scone_jax.errors import UserError
from scone_jax.model.stack import stack_layers
from scone_jax.train.state import TrainSetup


def initial_state(setup: TrainSetup, cfg: Config, vocab: int, tokenizer_sha256: str):
    """A fresh state, with the backbone's parameters from `model.init_from` when set."""
    state = setup.create()
    source = cfg.model.init_from
    if not source:
        return state
    where = f"model.init_from {source}"
    tree = backbone_from_hf(source, cfg, vocab, tokenizer_sha256)
    if cfg.model.scan_layers:
        tree = stack_layers(tree)
    scone = cfg.fgrams.enabled
    params = state["params"]
    target = params["backbone"] if scone else params
    shardings = setup.shardings["params"]["backbone"] if scone else setup.shardings["params"]
    if jax.tree.structure(tree) != jax.tree.structure(target):
        raise UserError(f"{where}: its tensors do not form this run's backbone")

    def place(ref: jax.Array, value: np.ndarray, sharding: NamedSharding) -> jax.Array:
        if value.shape != ref.shape:
            raise UserError(f"{where}: a tensor of shape {value.shape} where {ref.shape} belongs")
        value = value.astype(ref.dtype)
        return jax.make_array_from_callback(ref.shape, sharding, lambda index: value[index])

    loaded = jax.tree.map(place, target, tree, shardings)
    params = {**params, "backbone": loaded} if scone else loaded
    return {**state, "params": params}


def backbone_from_hf(source: str, cfg: Config, vocab: int, tokenizer_sha256: str) -> dict:
    """The checkpoint at `source` as our backbone's numpy tree, checked against the run."""
    where = f"model.init_from {source}"
    if not Path(source).is_dir():
        raise UserError(f"{where} is not a directory (expected a Hugging Face checkpoint)")
    tokenizer = find_tokenizer_file(source)
    if tokenizer.is_file() and load_tokenizer(tokenizer).sha256 != tokenizer_sha256:
        raise UserError(
            f"{where}: its tokenizer {tokenizer.name} is not the one the dataset was tokenized "
            f"with (sha256 {tokenizer_sha256[:12]}; expected `scone-jax tokenize --tokenizer "
            f"{tokenizer}`)"
        )
    config, tensors = read_checkpoint(source)
    check_compatible(model_fields(config, where), cfg.model, vocab, where)
    return from_hf_tensors(tensors, cfg.model, where)
