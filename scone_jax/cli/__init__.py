"""The `scone-jax` command line: argument parsing and error reporting only; logic lives in the
stages."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter without what misleads: no "(default: None)",
    "(default: False)" or "(default: )", and no second default after a help that names its own."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == ""
            or default is argparse.SUPPRESS
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, "*"))
        ):
            return text
        return text + " (default: %(default)s)"
