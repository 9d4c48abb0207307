"""Progress on stderr: a tqdm bar on a terminal, plain lines everywhere else.

A bar redraws itself with carriage returns; in a file (`make demo > log 2>&1`, a SLURM log)
every frame stays, and the log becomes frames. Off a terminal a bar is one plain line every
`PLAIN_INTERVAL_S` seconds and one when it closes, or nothing at all for loops that print
their own line per interval (`plain_lines=False`: the train loop).
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

PLAIN_INTERVAL_S = 30.0


def progress_bar(
    desc: str,
    *,
    total: int | None = None,
    unit: str = "it",
    initial: int = 0,
    disable: bool = False,
    plain_lines: bool = True,
    **bar_options,
):
    """A tqdm bar when stderr is a terminal; else `PlainProgress` (or a silent bar)."""
    if not disable and sys.stderr.isatty():
        return tqdm(
            desc=desc,
            total=total,
            unit=unit,
            initial=initial,
            file=sys.stderr,
            dynamic_ncols=True,
            **bar_options,
        )
    if disable or not plain_lines:
        return tqdm(disable=True)
    return PlainProgress(desc, total=total, unit=unit.strip(), initial=initial)


class PlainProgress:
    """The part of tqdm's interface the stages use, printing whole lines at most every
    `PLAIN_INTERVAL_S` seconds, and a last line on `close()`."""

    def __init__(self, desc: str, *, total: int | None, unit: str, initial: int = 0):
        self.desc, self.total, self.unit = desc, total, unit
        self.n = initial
        self._initial = initial
        self._postfix = ""
        self._start = self._last = time.monotonic()
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= PLAIN_INTERVAL_S:
            self._last = now
            self._print("")

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self._postfix = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self._postfix = text

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._print("done: ")

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # the stage failed: its error is the line to read, not "done"
            self._closed = True
        self.close()

    def _print(self, prefix: str) -> None:
        elapsed = time.monotonic() - self._start
        count = f"{self.n:,}" + (f"/{self.total:,}" if self.total else "")
        rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
        extra = f", {self._postfix}" if self._postfix else ""
        print(
            f"[{self.desc}] {prefix}{count} {self.unit} in {elapsed:.1f} s "
            f"({rate:,.0f} {self.unit}/s){extra}",
            file=sys.stderr,
            flush=True,
        )


def _fmt(value) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
