"""The one exception type for expected user errors, and the one a SIGTERM raises.

The CLI prints a `UserError` as a single line (no traceback) and exits non-zero; anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user: a path, a value, a config key. The message is one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class Terminated(BaseException):
    """SIGTERM, raised where the process was (cli/main.py), so that every `finally` runs: half
    written outputs are removed as on Ctrl-C. A BaseException, as KeyboardInterrupt is, so no
    `except Exception` swallows it."""

    exit_code = 143  # 128 + SIGTERM, as a shell reports a process the signal ended
