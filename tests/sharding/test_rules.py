import json
import os
from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from scone_jax.config import ModelConfig, OptimConfig, load_config
from scone_jax.errors import UserError
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel
from scone_jax.sharding.mesh import make_mesh, resolve_mesh_shape
from scone_jax.sharding.rules import DEFAULT_RULES, fit_spec, logical_to_spec, make_rules
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import setup_train_state

GOLDEN = Path(__file__).with_name("golden_param_specs.json")
GOLDEN_MODELS = {
    "gpt2": ModelConfig(family="gpt2", d_model=64, n_layers=2, n_heads=4, max_seq_len=32),
    "llama": ModelConfig(
        family="llama", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32
    ),
    "gpt2_untied": ModelConfig(
        family="gpt2", d_model=64, n_layers=1, n_heads=4, max_seq_len=32, tie_embeddings=False
    ),
}


def flat_specs(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat_specs(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = str(v.spec)
    return out


def param_specs(cfg, mesh, rules):
    tx, _ = make_optimizer(OptimConfig(), 10)
    setup = setup_train_state(lambda r: Transformer(cfg, 128, rngs=r), tx, 0, mesh, rules)
    return setup, flat_specs(setup.shardings["params"])


def test_golden_param_shardings():
    """Every parameter gets a sharding from the rules; accidental changes fail here.

    After an intended change: SCONE_UPDATE_GOLDEN=1 pytest tests/sharding/test_rules.py
    """
    mesh = make_mesh(2, 2, 2)
    actual = {name: param_specs(cfg, mesh, make_rules())[1] for name, cfg in GOLDEN_MODELS.items()}
    if os.environ.get("SCONE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
    assert actual == json.loads(GOLDEN.read_text())


def test_every_param_has_logical_axes_and_optimizer_follows():
    mesh = make_mesh(2, 2, 2)
    setup, specs = param_specs(GOLDEN_MODELS["llama"], mesh, make_rules())
    leaves = jax.tree.leaves(setup.handle.logical_axes)
    assert len(leaves) == len(specs) and all(isinstance(x, P) for x in leaves)
    mu = setup.shardings["opt_state"][1][0].mu  # clip, then adamw's ScaleByAdamState
    assert flat_specs(mu) == specs


def test_rules_override_reshards_without_touching_the_model():
    mesh = make_mesh(2, 2, 2)
    _, specs = param_specs(
        GOLDEN_MODELS["gpt2"], mesh, make_rules({"mlp": None, "embed": ["fsdp", "data"]})
    )
    assert specs["blocks/0/mlp/w_in"] == str(P(("fsdp", "data"), None))


def test_logical_to_spec_uses_each_mesh_axis_once():
    assert logical_to_spec(("batch", "seq", "embed"), DEFAULT_RULES) == P(
        ("data", "fsdp"), None, None
    )
    assert logical_to_spec(("embed", "mlp"), DEFAULT_RULES) == P("fsdp", "tensor")


def test_fit_spec_drops_axes_that_do_not_divide():
    mesh = make_mesh(2, 2, 2)
    assert fit_spec(P("tensor"), (3,), mesh) == P(None)
    assert fit_spec(P(("data", "fsdp")), (6,), mesh) == P("data")


@pytest.mark.parametrize(
    "rules, needle",
    [({"nope": None}, "unknown logical axis"), ({"mlp": "model"}, "unknown mesh axis")],
)
def test_bad_rules(rules, needle):
    with pytest.raises(UserError, match=needle):
        make_rules(rules)


def test_mesh_shapes():
    assert resolve_mesh_shape(-1, 2, 2, 8) == (2, 2, 2)
    assert resolve_mesh_shape(1, -1, 1, 8) == (1, 8, 1)
    for args in [(3, 1, 1, 8), (-1, 3, 1, 8), (2, 2, 4, 8)]:
        with pytest.raises(UserError, match="devices"):
            resolve_mesh_shape(*args)
    mesh = make_mesh(2, -1, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_one_rules_table_shards_both_models_and_the_fgram_layout_is_a_config_change():
    """The f-gram model's parameters follow the backbone's rows unless a "fgram/<name>" row (a
    `mesh.rules` entry in the config) overrides them, which leaves the backbone untouched."""
    mesh = make_mesh(2, 2, 2)
    tx, _ = make_optimizer(OptimConfig(), 10)

    def specs(*overrides):
        cfg = load_config(
            "tiny_scone", ["fgrams.d_model=64", *overrides]
        )  # narrower: projections too
        build = lambda r: SconeModel(cfg.model, cfg.fgrams, 128, rngs=r)  # noqa: E731
        return flat_specs(
            setup_train_state(build, tx, 0, mesh, make_rules(cfg.mesh.rules)).shardings["params"]
        )

    default, changed = specs(), specs("mesh.rules={fgram/mlp: null, fgram/embed: [data, fsdp]}")
    assert {
        "fgram/proj_in",
        "fgram/proj_out",
        "fgram/pos_embed",
        "fgram/blocks/1/mlp/w_out",
    } <= set(default)
    assert (
        default["fgram/blocks/0/mlp/w_in"]
        == default["backbone/blocks/0/mlp/w_in"]
        == str(P("fsdp", "tensor"))
    )
    assert changed["fgram/blocks/0/mlp/w_in"] == str(P(("data", "fsdp"), None))
    assert changed["fgram/blocks/1/attn/wq"] == str(
        P(("data", "fsdp"), None, None)
    )  # 1 head: not split
    assert {n: s for n, s in changed.items() if n.startswith("backbone/")} == {
        n: s for n, s in default.items() if n.startswith("backbone/")
    }
