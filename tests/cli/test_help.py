"""`--help` says each default once, and only where there is one to say."""

import pytest

from scone_jax.cli.main import build_parser


def subcommand_help(name: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return " ".join(action.choices[name].format_help().split())


@pytest.mark.parametrize("name", ["train", "plan", "sweep"])
def test_help_shows_no_empty_or_repeated_defaults(name):
    text = subcommand_help(name)
    for empty in ("(default: None)", "(default: False)", "(default: )"):
        assert empty not in text
    assert ") (default:" not in text  # a help that names its default gets no second one


def test_help_keeps_the_defaults_worth_showing():
    assert "memory per device (default: 80.0)" in subcommand_help("plan")
    assert "(default: local)" in subcommand_help("sweep")
