"""CONFIG and its key=value overrides, the positional arguments of every command that builds a
run from a config (`train`, `plan`)."""

from __future__ import annotations

import argparse


def config_name(text: str) -> str:
    """An empty CONFIG (an unset "$CONFIG" in a script) is refused, not read as no preset."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} (expected a YAML config path or a preset name, e.g. tiny)"
        )
    return text


def add_config_arguments(parser) -> None:
    parser.add_argument(
        "config",
        type=config_name,
        help="YAML config path or preset name (experiments/<name>.yaml)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, values parsed as YAML"
    )
