"""A run's checkpoint on its held-out split and extra datasets, through the live f-gram model (the
training session's eval step) or through an exported table (the serving path): one entry point
for `scone-jax eval` and the demo."""

from __future__ import annotations

from pathlib import Path

from scone_jax.artifacts.restore import agreed_checkpoint, load_run_params
from scone_jax.artifacts.run_dir import load_run_config
from scone_jax.errors import UserError
from scone_jax.serve.engine import engine_from_run
from scone_jax.serve.evaluate import evaluate_engine
from scone_jax.train.session import evaluate, open_session


def evaluate_run(
    run_dir: str | Path,
    extra_eval: list[str] | None = None,
    step: int | str | None = None,
    table: str | None = None,
    tier: str = "host",
) -> dict:
    """Perplexity and bits per byte of a run's checkpoint on its held-out split and `extra_eval`
    datasets: with the live f-gram model, or with an exported table (`table`, in `tier`)."""
    cfg = load_run_config(run_dir)
    checkpoint = agreed_checkpoint(run_dir, step)  # checked before any setup, read once
    session = open_session(cfg, Path(run_dir), extra_eval, build=False)
    if not session.eval_sets:
        raise UserError(
            f"run {run_dir} has no held-out split (data.eval_fraction=0); pass --dataset DIR"
        )
    if table is not None:
        engine = engine_from_run(run_dir, table, tier, checkpoint)
        results = evaluate_engine(engine, session.eval_sets, session.dataset.token_bytes)
        return {"step": engine.step, "table": table, "tier": tier, "results": results}
    results = evaluate(session, session.eval_step(), load_run_params(run_dir, checkpoint).params)
    return {"step": checkpoint.step, "results": results}
