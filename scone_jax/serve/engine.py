"""A backbone plus an f-gram table, ready for scoring and decoding: everything the
accelerator holds is the backbone; the table stays in its tier (device, host or disk)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from scone_jax.artifacts.backbone import load_backbone
from scone_jax.artifacts.restore import load_run_params
from scone_jax.artifacts.run_dir import CheckpointChoice
from scone_jax.config.schema import ModelConfig
from scone_jax.errors import UserError
from scone_jax.model import Transformer
from scone_jax.serve.input_layer import TableLookup
from scone_jax.serve.sampling import Sampling, sample
from scone_jax.serve.tables import Table, open_table


@dataclass
class Engine:
    model: Transformer
    lookup: TableLookup | None  # None: a baseline (no f-grams)
    tokenizer_sha256: str | None = None
    step: int | None = None  # the checkpoint step the weights come from

    def __post_init__(self):
        # parameters flattened once: a jitted call then takes a plain list of arrays, which costs
        # far less per call than flattening the model's nested state each time
        self.graphdef, state = nnx.split(self.model)
        self._param_leaves, treedef = jax.tree.flatten(state)
        lookup = self.lookup

        def embed_inputs(leaves, tokens, prepared):
            model = nnx.merge(self.graphdef, jax.tree.unflatten(treedef, leaves))
            x = model.embed(tokens)
            return model, (x if lookup is None else lookup.add_rows(x, prepared))

        def logits_fn(leaves, tokens, prepared):
            model, x = embed_inputs(leaves, tokens, prepared)
            return model.logits(model.hidden(x))

        def step_fn(leaves, tokens, prepared, cache, start, first_valid, key, sampling):
            model, x = embed_inputs(leaves, tokens, prepared)
            h, cache = model.hidden_cached(x, cache, start, first_valid)
            key, sub = jax.random.split(key)
            return sample(model.logits(h[:, -1:])[:, 0], sub, sampling), key, cache

        self._logits = jax.jit(logits_fn)
        self._step = jax.jit(step_fn, static_argnums=(7,), donate_argnums=(3,))

    def prepare(self, fgram_ids: np.ndarray) -> dict:
        return self.lookup.prepare(fgram_ids) if self.lookup else {}

    def logits(
        self, tokens: np.ndarray, fgram_ids: np.ndarray | None = None, prepared: dict | None = None
    ):
        """Full-sequence logits [B, T, V]; `fgram_ids` are each position's longest match."""
        if prepared is None:
            prepared = self.prepare(fgram_ids) if self.lookup else {}
        return self._logits(self._param_leaves, tokens, prepared)

    def decode_step(
        self, tokens, prepared, cache, start: int, first_valid, key, sampling: Sampling
    ):
        """One jitted call: the step over `tokens` [B, T] at positions start.., then the next
        token of each row from the last position's logits. Returns (next tokens [B], the next
        key, the cache); the cache passed in is donated."""
        return self._step(
            self._param_leaves, tokens, prepared, cache, np.int32(start), first_valid, key, sampling
        )

    def init_cache(self, batch: int, max_len: int):
        return self.model.init_cache(batch, max_len)


def _check_table(
    table: Table, width: int, tokenizer: str | None, checkpoint: str | None, combine: str | None
):
    table.check_compatible(width, tokenizer, checkpoint)
    if combine and table.meta.get("combine") != combine:
        raise UserError(
            f"table {table.url} was exported in {table.meta.get('combine')} mode, the model "
            f"trained with combine={combine}"
        )


def engine_from_run(
    run_dir: str | Path,
    table_url: str | None,
    tier: str = "host",
    step: CheckpointChoice = None,
    cache_bytes: int = 256 << 20,
) -> Engine:
    """The backbone of a run's checkpoint, with an exported table (required for SCONE runs)."""
    run = load_run_params(run_dir, step)
    model = run.model()
    table = None
    if run.cfg.fgrams.enabled:
        if not table_url:
            raise UserError(
                f"run {run_dir} is a SCONE run: pass --table (export it with `scone-jax export`)"
            )
        model = model.backbone
        table = open_table(table_url, tier, cache_bytes)
        _check_table(
            table,
            run.cfg.model.d_model,
            run.info["tokenizer_sha256"],
            run.fingerprint,
            run.cfg.fgrams.combine,
        )
    elif table_url:
        raise UserError(f"run {run_dir} is a baseline (fgrams.enabled=false); it takes no table")
    return Engine(
        model, TableLookup(table) if table else None, run.info["tokenizer_sha256"], run.step
    )


def engine_from_export(
    backbone_dir: str | Path,
    table_url: str | None,
    tier: str = "host",
    cache_bytes: int = 256 << 20,
) -> Engine:
    """An exported backbone (params.npz, no orbax) with its table."""
    params, model_cfg, meta = load_backbone(backbone_dir)
    cfg = ModelConfig(**model_cfg)
    model = Transformer(cfg, meta["vocab_size"], rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    nnx.replace_by_pure_dict(state, params)
    model = nnx.merge(graphdef, state)
    table = None
    if meta["scone"]:
        if not table_url:
            raise UserError(f"backbone {backbone_dir} was trained with SCONE: pass --table")
        table = open_table(table_url, tier, cache_bytes)
        _check_table(
            table,
            cfg.d_model,
            meta["tokenizer_sha256"],
            meta["checkpoint_fingerprint"],
            meta["combine"],
        )
    return Engine(
        model,
        TableLookup(table) if table else None,
        meta["tokenizer_sha256"],
        meta["checkpoint_step"],
    )
