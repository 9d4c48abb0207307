"""`model.init_from` in a SCONE run: the backbone comes from the checkpoint, sharded as the
state's, and the f-gram model and optimizer state are left as created (the baseline case and
the command line: tests/cli/test_bring_your_own.py)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from scone_jax.artifacts.hf_checkpoint import CONFIG, hf_config, to_hf_tensors, write_weights
from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.model.transformer import Transformer
from scone_jax.sharding.mesh import make_mesh
from scone_jax.train.init_from import initial_state
from scone_jax.train.state import TrainSetup

VOCAB = 40
OVERRIDES = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=16"]


def test_a_scone_run_takes_only_its_backbone_from_the_checkpoint(tmp_path, rng):
    cfg = load_config("tiny_scone", [*OVERRIDES, "data.seq_len=16"])
    shapes = nnx.eval_shape(lambda: Transformer(cfg.model, VOCAB, rngs=nnx.Rngs(0)))
    checkpoint = jax.tree.map(
        lambda x: rng.normal(size=x.shape).astype(np.float32),
        nnx.to_pure_dict(nnx.state(shapes, nnx.Param)),
    )
    (tmp_path / "hf").mkdir()
    write_weights(tmp_path / "hf", to_hf_tensors(checkpoint, cfg.model))
    (tmp_path / "hf" / CONFIG).write_text(json.dumps(hf_config(cfg.model, VOCAB, None, None)))

    mesh = make_mesh(-1, 2, 1)
    sharded = NamedSharding(mesh, PartitionSpec("fsdp"))
    fresh = {
        "params": {
            "backbone": jax.tree.map(np.zeros_like, checkpoint),
            "fgram": {"output_gate": np.full(32, 7.0, np.float32)},
        },
        "opt_state": np.full(3, 5.0, np.float32),
        "step": np.int32(0),
    }
    shardings = jax.tree.map(lambda x: sharded if x.ndim and x.shape[0] % 2 == 0 else None, fresh)
    setup = TrainSetup(None, None, shardings, lambda: jax.tree.map(jax.numpy.asarray, fresh))
    config = load_config(
        "tiny_scone", [*OVERRIDES, "data.seq_len=16", f"model.init_from={tmp_path / 'hf'}"]
    )
    state = initial_state(setup, config, VOCAB, "t" * 64)
    backbone = state["params"]["backbone"]
    jax.tree.map(np.testing.assert_array_equal, checkpoint, jax.device_get(backbone))
    assert backbone["embed_table"].sharding == sharded
    np.testing.assert_array_equal(state["params"]["fgram"]["output_gate"], 7.0)
    np.testing.assert_array_equal(state["opt_state"], 5.0)
    assert initial_state(setup, cfg, VOCAB, "t")["params"]["backbone"]["embed_table"].sum() == 0
    missing = load_config("tiny_scone", [*OVERRIDES, "data.seq_len=16", "model.init_from=nope"])
    with pytest.raises(UserError, match=r"model.init_from nope is not a directory"):
        initial_state(setup, missing, VOCAB, "t")
