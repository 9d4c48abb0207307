"""The optimizer against closed forms: the learning rate at every step (linear warmup, then
cosine decay to min_lr_ratio * lr) and AdamW's first update, with weight decay on matrices only."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scone_jax.config import OptimConfig
from scone_jax.errors import UserError
from scone_jax.model.stack import stack_layers
from scone_jax.train.optimizer import decay_mask, fgram_mask, lr_schedule, make_optimizer


def closed_form_lr(cfg: OptimConfig, total: int, step: int) -> float:
    warmup = min(cfg.warmup_steps, max(total - 1, 0))
    if step < warmup:
        return cfg.lr * step / warmup
    end = cfg.lr * cfg.min_lr_ratio
    decay = max(total, warmup + 1) - warmup
    progress = min(step - warmup, decay) / decay
    return end + (cfg.lr - end) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("warmup, total", [(0, 30), (5, 40), (20, 20), (50, 10), (3, 1)])
def test_lr_schedule_is_linear_warmup_then_cosine_to_the_floor(warmup, total, rng):
    cfg = OptimConfig(
        lr=float(rng.uniform(1e-4, 1e-2)),
        warmup_steps=warmup,
        min_lr_ratio=float(rng.uniform(0, 0.5)),
    )
    schedule = lr_schedule(cfg, total)
    for step in range(total + 3):
        np.testing.assert_allclose(
            float(schedule(step)), closed_form_lr(cfg, total, step), rtol=1e-5, atol=1e-12
        )
    assert math.isclose(
        float(schedule(total)), cfg.lr * cfg.min_lr_ratio, rel_tol=1e-5, abs_tol=1e-12
    )
    if 0 < warmup < total:
        assert float(schedule(0)) == 0 and math.isclose(
            float(schedule(warmup)), cfg.lr, rel_tol=1e-6
        )


def test_first_adamw_update_decays_matrices_but_not_biases_or_norm_scales(rng):
    cfg = OptimConfig(
        lr=float(rng.uniform(1e-3, 1e-2)),
        warmup_steps=0,
        weight_decay=float(rng.uniform(0.05, 0.5)),
        grad_clip=0.0,
    )
    params = {
        "embed": rng.normal(size=(5, 3)),
        "mlp": {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4)},
        "norm": {"scale": rng.normal(size=3)},
    }
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    tx, schedule = make_optimizer(cfg, total_steps=100)
    updates, _ = tx.update(grads, tx.init(params), params)
    lr = float(schedule(0))
    assert math.isclose(lr, cfg.lr, rel_tol=1e-6)

    def expected(p, g):  # step 1: bias-corrected moments are g and g^2
        g, p = np.asarray(g, np.float64), np.asarray(p, np.float64)
        decay = cfg.weight_decay * p if p.ndim >= 2 else 0.0
        return -lr * (g / (np.abs(g) + cfg.eps) + decay)

    for got, want in zip(
        jax.tree.leaves(updates),
        jax.tree.leaves(jax.tree.map(expected, params, grads)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-7)


def test_the_decay_mask_is_the_same_for_scanned_and_unrolled_layers(rng):
    layer = {"attn": {"wq": np.zeros((4, 2, 2)), "bo": np.zeros(4)}, "norm": np.zeros(4)}
    unrolled = {"blocks": {i: layer for i in range(3)}, "embed_table": np.zeros((5, 4))}
    mask = decay_mask(unrolled)
    assert mask["blocks"][1] == {"attn": {"wq": True, "bo": False}, "norm": False}
    stacked = decay_mask(stack_layers(unrolled))
    assert stacked == {"blocks": mask["blocks"][0], "embed_table": True}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_the_real_models_decay_their_random_matrices_and_nothing_else(family, scan_layers):
    """Every parameter initialized at random (a weight) decays; every constant one (a bias, a
    norm scale or gain, the f-gram output gate) does not, whatever its rank."""
    from flax import nnx

    from scone_jax.config import load_config
    from scone_jax.model.build import build_model_fn

    cfg = load_config(
        "tiny_scone",
        [
            f"model.family={family}",
            "model.d_model=16",
            "model.n_heads=2",
            f"model.scan_layers={str(scan_layers).lower()}",
            "fgrams.combine=gated",
        ],
    )
    model = build_model_fn(cfg, vocab=64)(nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    mask = decay_mask(params)
    flat_params = dict(jax.tree_util.tree_leaves_with_path(params))
    flat_mask = dict(jax.tree_util.tree_leaves_with_path(mask))
    assert flat_params.keys() == flat_mask.keys()
    wrong = {
        jax.tree_util.keystr(path): flat_mask[path]
        for path, p in flat_params.items()
        if flat_mask[path] == bool(jnp.all(p == p.ravel()[0]))
    }
    assert not wrong, f"decay mask wrong for {wrong}"
    # the f-gram learning-rate scale finds the real model's f-gram parameters, and only them
    assert set(params) == {"backbone", "fgram"}
    in_fgram = dict(jax.tree_util.tree_leaves_with_path(fgram_mask(params)))
    assert in_fgram.keys() == flat_params.keys()
    assert all(on == (path[0].key == "fgram") for path, on in in_fgram.items())


def backbone_and_fgram_params(rng):
    """A matrix and a vector on each side of the f-gram mask, and gradients for them."""
    params = {
        "backbone": {"embed": rng.normal(size=(5, 3)), "norm": rng.normal(size=3)},
        "fgram": {"w": rng.normal(size=(3, 4)), "output_gate": rng.normal(size=3)},
    }
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    return params, grads


def update_at_step(cfg: OptimConfig, params, grads, steps: int):
    """The optimizer's update at step `steps`, applying each earlier one to the params."""
    tx, _ = make_optimizer(cfg, total_steps=50)
    state = tx.init(params)
    for _ in range(steps):
        update, state = tx.update(grads, state, params)
        params = jax.tree.map(jnp.add, params, update)
    return update


def assert_trees_close(got, want, factor: float = 1.0) -> None:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), factor * np.asarray(w), rtol=1e-5, atol=1e-8)


def test_fgram_lr_scale_multiplies_the_fgram_models_updates_and_no_others(rng):
    """AdamW's update is elementwise, so scaling the f-gram model's learning rate must scale its
    updates by exactly that factor, weight decay included, and leave the backbone's unchanged."""
    scale = float(rng.uniform(0.1, 4.0))
    base = OptimConfig(lr=float(rng.uniform(1e-4, 1e-2)), warmup_steps=0, grad_clip=0.0)
    params, grads = backbone_and_fgram_params(rng)
    plain = update_at_step(base, params, grads, steps=1)
    scaled = update_at_step(
        OptimConfig(**{**vars(base), "fgram_lr_scale": scale}), params, grads, steps=1
    )
    assert_trees_close(scaled["backbone"], plain["backbone"])
    assert_trees_close(scaled["fgram"], plain["fgram"], factor=scale)


def test_fgram_lr_scale_must_be_positive():
    with pytest.raises(UserError, match=r"optim.fgram_lr_scale=0"):
        OptimConfig(fgram_lr_scale=0.0).validate()


def test_fgram_weight_decay_decays_the_fgram_models_matrices_alone_at_its_own_rate(rng):
    """With its own decay the f-gram model's update is AdamW's at that decay, the backbone's is
    AdamW's at optim.weight_decay, and setting it to optim.weight_decay changes nothing."""
    base = OptimConfig(
        lr=float(rng.uniform(1e-4, 1e-2)),
        warmup_steps=0,
        grad_clip=0.0,
        weight_decay=float(rng.uniform(0.05, 0.5)),
    )
    fgram_decay = float(rng.uniform(0.6, 2.0))
    params, grads = backbone_and_fgram_params(rng)

    def second_update(**overrides):  # the second step's moments are no longer g and g^2
        return update_at_step(OptimConfig(**{**vars(base), **overrides}), params, grads, steps=2)

    own = second_update(fgram_weight_decay=fgram_decay)
    plain = second_update()
    assert_trees_close(own["backbone"], plain["backbone"])
    assert_trees_close(own["fgram"], second_update(weight_decay=fgram_decay)["fgram"])
    assert_trees_close(second_update(fgram_weight_decay=base.weight_decay), plain)
    # and the decay did something: the f-gram matrix's update differs from the plain one's
    assert not np.allclose(own["fgram"]["w"], plain["fgram"]["w"], rtol=1e-3)
    np.testing.assert_array_equal(own["fgram"]["output_gate"], plain["fgram"]["output_gate"])


def test_fgram_weight_decay_must_not_be_negative():
    with pytest.raises(UserError, match=r"optim.fgram_weight_decay=-0.1"):
        OptimConfig(fgram_weight_decay=-0.1).validate()
