"""The `--step` argument of the commands that read a checkpoint: a step number or "best"."""

from __future__ import annotations

import argparse

from scone_jax.artifacts.run_dir import BEST


def checkpoint_step(text: str) -> int | str:
    if text == BEST:
        return BEST
    if text.isascii() and text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(
        f"{text!r} (expected a step number, or {BEST} for the checkpoint that "
        "checkpoint.keep_best kept)"
    )


def add_step_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--step",
        type=checkpoint_step,
        default=None,
        help=f"checkpoint step {what} (default: latest; best: the one checkpoint.keep_best kept)",
    )
