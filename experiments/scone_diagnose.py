"""Where SCONE's held-out loss goes: per-position losses and scales over training (docs/fidelity.md).

Given a baseline run and SCONE runs trained on the same dataset (same split, windows and
batch), each with checkpoints at several steps, prints and writes, per checkpoint step:
- held-out loss at positions with and without an f-gram match (the SCONE run's tags), and by
  match length, for the baseline and each SCONE run, on the same held-out windows;
- the RMS of T's rows at the held-out tokens, of the f-gram embedding F(w) a matched position
  gets (after the gate, where there is one), and of the combined input the backbone sees;
- the RMS of the backbone's residual stream before its final norm, at matched and unmatched
  positions.

    python experiments/scone_diagnose.py BASELINE_RUN SCONE_RUN [SCONE_RUN ...] --out FILE.json
"""  # noqa: E501 (the --help text, printed as is: RawDescriptionHelpFormatter)

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.run_dir import load_run_config
from scone_jax.train.session import open_session


def rms(x, mask=None) -> float:
    x = np.asarray(x, np.float64)
    sq = np.mean(x * x, axis=-1)
    return float(np.sqrt(sq[mask].mean() if mask is not None else sq.mean()))


def restore(session, run_dir: Path, step: int):
    cfg = session.cfg
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep, False)
    state = ckpt.restore(session.setup.abstract_state, session.setup.shardings, step)
    ckpt.close()
    return session.setup.handle.merge(state["params"])


def backbone_residual(backbone, x):
    """The residual stream after the last block (before the final norm)."""
    length = x.shape[1]
    if backbone.cfg.family == "gpt2":
        x = x + backbone.pos_embed[...][None, :length].astype(x.dtype)
    positions = jnp.broadcast_to(jnp.arange(length), x.shape[:2])
    mask = jnp.tril(jnp.ones((length, length), dtype=bool))[None]
    for block in backbone.blocks:
        x = block(x, positions, mask)
    return x


def losses(model, batch, scone: bool):
    tokens = batch["inputs"]
    if scone:
        x = model.input_embeddings(
            tokens,
            batch["fgram_index"],
            batch["fgram_nodes"],
            batch["fgram_paths"],
            batch["fgram_outputs"],
        )
        backbone = model.backbone
    else:
        backbone = model
        x = backbone.embed(tokens)
    resid = backbone_residual(backbone, x)
    logits = backbone.logits(backbone.final_norm(resid))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    return loss, x, backbone.embed(tokens), resid


def diagnose(baseline: Path, scone_runs: list[Path]) -> list[dict]:
    ref_cfg = load_run_config(scone_runs[0])
    ref = open_session(ref_cfg, scone_runs[0])
    batches = [ref.to_global(b) for b in ref.eval_sets["heldout"]]
    lengths = np.asarray(ref.fgrams.fgram_set.lengths)
    ids = np.concatenate([np.asarray(b["fgram_ids"]) for b in ref.eval_sets["heldout"]]).reshape(-1)
    match_len = np.where(ids >= 0, lengths[np.maximum(ids, 0)], 0)
    matched = match_len > 0
    steps = sorted(int(p.name) for p in (baseline / "checkpoints").iterdir() if p.name.isdigit())
    sessions = {baseline: open_session(load_run_config(baseline), baseline)}
    for run in scone_runs:
        sessions[run] = ref if run == scone_runs[0] else open_session(load_run_config(run), run)
    rows = []
    for step in steps:
        for run, session in sessions.items():
            if not (run / "checkpoints" / str(step)).is_dir():
                continue
            scone = session.cfg.fgrams.enabled
            model = restore(session, run, step)
            own = [session.to_global(b) for b in session.eval_sets["heldout"]] if scone else batches
            parts = [jax.device_get(losses(model, b, scone)) for b in own]
            loss = np.concatenate([p[0].reshape(-1) for p in parts])
            x = np.concatenate([p[1].reshape(-1, p[1].shape[-1]) for p in parts])
            t = np.concatenate([p[2].reshape(-1, p[2].shape[-1]) for p in parts])
            resid = np.concatenate([p[3].reshape(-1, p[3].shape[-1]) for p in parts])
            row = {
                "run": run.name,
                "step": step,
                "combine": session.cfg.fgrams.combine if scone else "baseline",
                "loss": float(loss.mean()),
                "loss_matched": float(loss[matched].mean()),
                "loss_unmatched": float(loss[~matched].mean()),
                "loss_by_match_length": {
                    int(n): float(loss[match_len == n].mean()) for n in np.unique(match_len)
                },
                "rms_T": rms(t),
                "rms_input_matched": rms(x, matched),
                "rms_input_unmatched": rms(x, ~matched),
                "rms_resid_matched": rms(resid, matched),
                "rms_resid_unmatched": rms(resid, ~matched),
            }
            if scone:
                delta = x - t  # what the f-gram path changes at the input
                row["rms_fgram_delta_matched"] = rms(delta, matched)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path)
    parser.add_argument("scone", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = diagnose(args.baseline, args.scone)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
