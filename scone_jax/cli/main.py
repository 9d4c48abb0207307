"""`scone-jax <command>`: dispatch to one module per command.

Each command module defines `register(subparsers)`, which adds its parser and sets
`func(args) -> int | None`. Expected user errors (`UserError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import shlex
import signal
import sys
import threading

from scone_jax import signals
from scone_jax.errors import Terminated, UserError
from scone_jax.runtime import distributed

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
    on_main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM (a scheduler's preemption, `kill`) and SIGINT as exceptions, so cleanups run;
    # training installs its own handlers around the loop, which save a checkpoint first
    previous = (
        {s: signal.signal(s, signals.raise_for) for s in (signal.SIGTERM, signal.SIGINT)}
        if on_main_thread
        else {}
    )
    try:
        code = args.func(args)
    except UserError as e:
        print(f"scone-jax {args.command}: error: {e}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        signals.handled()
        print(f"scone-jax {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Terminated:
        signals.handled()
        print(f"scone-jax {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED
    finally:  # unless the command set its own (train ignores a late SIGTERM once it has saved)
        for s, handler in previous.items():
            if signal.getsignal(s) is signals.raise_for:
                signal.signal(s, handler)
    return int(code or 0)


INTERRUPTED, TERMINATED = 130, Terminated.exit_code  # what a shell reports for SIGINT, SIGTERM


def whole_lines(*streams) -> None:
    """Write each line to its stream in one write, once it ends. Under PYTHONUNBUFFERED (which
    launchers set so that lines reach a log at once) print() writes a line's text and its
    newline separately, and the C++ runtime's own output to the same file (gloo's "Rank 1 is
    connected" on stdout) can land between the two, running two lines into one."""
    for stream in streams:
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)


def entry() -> None:
    """The `scone-jax` program, its output written whole lines at a time (`whole_lines`). A
    command a signal stopped has run its clean-ups by now; a single process then ends without
    the interpreter's teardown, which can crash (SIGSEGV) when the signal came while XLA was
    compiling. A process of a multi-process job exits normally: its watchdog's exit handler
    tells the peers."""
    whole_lines(sys.stdout, sys.stderr)
    code = main()
    if code in (INTERRUPTED, TERMINATED) and not distributed.joined():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
