"""CONFIG and its key=value overrides, the positional arguments of every command that builds a
run from a config (`train`, `plan`)."""

from __future__ import annotations


def add_config_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config path or preset name (experiments/<name>.yaml)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, values parsed as YAML"
    )
