"""The one exception type for expected user errors.

The CLI prints a `UserError` as a single line (no traceback) and exits non-zero; anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user: a path, a value, a config key. The message is one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
