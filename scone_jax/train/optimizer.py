"""AdamW with linear warmup + cosine decay, global-norm clipping and a weight-decay mask."""

from __future__ import annotations

import jax
import optax

from scone_jax.config.schema import OptimConfig


def lr_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else cfg.lr,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=cfg.lr * cfg.min_lr_ratio,
    )


def decay_mask(params):
    """Decay matrices (embeddings, projections); never biases, norm scales or gates. Biases are
    told by name (every bias is `b*`: bq, bo, b_in, bias; no weight is), since a per-head bias is
    2-D. The leading axis of scanned blocks (model.scan_layers: `blocks` without per-layer keys)
    stacks layers: it is not a matrix dimension, so a stacked norm scale is still a vector."""

    def decays(path, p) -> bool:
        keys = _key_names(path)
        stacked = "blocks" in keys and not keys[keys.index("blocks") + 1].isdigit()
        return p.ndim - stacked >= 2 and not keys[-1].startswith("b")

    return jax.tree_util.tree_map_with_path(decays, params)


def fgram_mask(params):
    """True for the f-gram model's parameters (the top-level `fgram` subtree), gate included."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _key_names(path)[0] == "fgram", params)


def _decay_mask_where(in_fgram: bool):
    """`decay_mask` restricted to the f-gram model's parameters (True) or to the others."""

    def mask(params):
        return jax.tree.map(
            lambda decays, fgram: decays and fgram == in_fgram,
            decay_mask(params),
            fgram_mask(params),
        )

    return mask


def _key_names(path) -> list[str]:
    """A parameter's path in the params dict as plain names."""
    return [str(getattr(k, "key", k)) for k in path]


def make_optimizer(
    cfg: OptimConfig, total_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    schedule = lr_schedule(cfg, total_steps)
    chain = []
    if cfg.grad_clip > 0:
        chain.append(optax.clip_by_global_norm(cfg.grad_clip))
    # optax.adamw unless the f-gram model has its own decay: the default state keeps the layout
    # that older checkpoints restore into (as for fgram_lr_scale below)
    if cfg.fgram_weight_decay is None:
        chain.append(
            optax.adamw(
                schedule,
                b1=cfg.beta1,
                b2=cfg.beta2,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
                mask=decay_mask,
            )
        )
    else:  # AdamW's three steps, with one decay for the backbone and one for the f-gram model
        chain += [
            optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps),
            optax.add_decayed_weights(cfg.weight_decay, mask=_decay_mask_where(False)),
            optax.add_decayed_weights(cfg.fgram_weight_decay, mask=_decay_mask_where(True)),
            optax.scale_by_learning_rate(schedule),
        ]
    if cfg.fgram_lr_scale != 1.0:  # only then: the default state restores older checkpoints
        chain.append(optax.masked(optax.scale(cfg.fgram_lr_scale), fgram_mask))
    return optax.chain(*chain), schedule
