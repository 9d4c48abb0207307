"""Compile time against depth: the train step of a 36-layer model against a 2-layer one of the
same width, with the layers unrolled and scanned (`model.scan_layers`), lowered and compiled side
by side in one run (`scone-jax plan`'s machinery, one device)."""

from __future__ import annotations

import jax

from scone_jax.config import load_config
from scone_jax.train.plan import plan_train_step

WIDTH = [
    "model.d_model=256",
    "model.n_heads=4",
    "model.vocab_size=2048",
    "train.batch_size=8",
    "mesh.data=1",
]


def compile_seconds(layers: int, scan: bool, preset: str) -> float:
    cfg = load_config(preset, [*WIDTH, f"model.n_layers={layers}", f"model.scan_layers={scan}"])
    plan = plan_train_step(cfg, jax.devices()[:1], 80.0)
    return plan["lower_s"] + plan["compile_s"]


def run(quick: bool = False) -> str:
    deep = 12 if quick else 36
    rows = []
    for preset in ("tiny", "tiny_scone"):
        for scan in (False, True):
            shallow, tall = compile_seconds(2, scan, preset), compile_seconds(deep, scan, preset)
            rows.append(
                f"| {preset} | {'scanned' if scan else 'unrolled'} | {shallow:.1f} | {tall:.1f} "
                f"| {tall / shallow:.2f}x |"
            )
    return "\n".join(
        [
            "## Compile time against depth (`model.scan_layers`)",
            "",
            f"The train step (lowering + XLA compile) of a {deep}-layer model against a 2-layer "
            "one, width 256, batch 8 x 128, one device; for `tiny_scone` the f-gram model has "
            "the backbone's depth too. Goal: scanned, the deep model compiles in at most 1.5x "
            "the shallow one's time.",
            "",
            f"| preset | layers | 2 layers (s) | {deep} layers (s) | ratio |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
