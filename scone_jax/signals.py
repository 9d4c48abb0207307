"""SIGTERM and SIGINT as exceptions, each remembered until a handler has seen it.

Python raises a signal handler's exception wherever the main thread is. Where that is code
Python calls on its own (jax's garbage-collection hook, a `__del__`), it prints "Exception
ignored" and goes on, and the signal is lost: a preempted job would train to its end. So each
signal is also recorded here; the CLI forgets it once its exception reached the command's
handler, and a long command asks at its safe points whether one was lost (`raise_lost`, or
`take_lost` where it stops by a flag).
"""

from __future__ import annotations

import signal

from scone_jax.errors import Terminated

_pending: list[int] = []


def raise_for(signum, frame) -> None:
    """The handler: record the signal, then raise it (SIGTERM as Terminated, SIGINT as
    KeyboardInterrupt)."""
    _pending.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def handled() -> None:
    """The signal's exception reached a handler: nothing is lost."""
    _pending.clear()


def take_lost() -> int | None:
    """A signal whose exception was swallowed, forgotten now (None: none was)."""
    signum = _pending[-1] if _pending else None
    _pending.clear()
    return signum


def raise_lost() -> None:
    """Raise again a signal whose exception was swallowed on its way."""
    signum = take_lost()
    if signum is not None:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
