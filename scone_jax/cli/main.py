"""`scone-jax <command>`: dispatch to one module per command.

Each command module defines `register(subparsers)`, which adds its parser and sets
`func(args) -> int | None`. Expected user errors (`UserError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from scone_jax.errors import UserError

COMMANDS = (
    "tokenize",
    "fgrams",
    "train",
    "plan",
    "eval",
    "export",
    "generate",
    "sweep",
    "report",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scone-jax",
        description="Train language models with SCONE f-gram embeddings in JAX: "
        "tokenize -> count f-grams -> tag -> train -> export -> serve.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"scone_jax.cli.{name}_cmd").register(sub)
    return parser


def _is_override(arg: str) -> bool:
    return "=" in arg and not arg.startswith("-")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unparsed = parser.parse_known_args(argv)
    if unparsed and hasattr(args, "overrides") and all(_is_override(a) for a in unparsed):
        args.overrides += unparsed  # `key=value` after an option, as in `--out DIR steps=3`
    elif unparsed:
        parser.error(f"unrecognized arguments: {' '.join(unparsed)}")
    # how the artifacts' locks name their holder (artifacts/lock.py)
    args.command_line = shlex.join(["scone-jax", *(sys.argv[1:] if argv is None else argv)])
    try:
        code = args.func(args)
    except UserError as e:
        print(f"scone-jax {args.command}: error: {e}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print(f"scone-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
