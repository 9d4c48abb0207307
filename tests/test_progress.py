"""Progress output: a redrawn bar on a terminal, whole lines in a log file (no carriage-return
frames), nothing extra for loops that print their own lines."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import scone_jax.progress as progress
from scone_jax.progress import PlainProgress, progress_bar

REPO = Path(__file__).resolve().parents[1]
# 50 updates of a bar; PLAIN_INTERVAL_S=0 makes the plain form print on every update
SCRIPT = (
    "import scone_jax.progress as p; p.PLAIN_INTERVAL_S = 0\n"
    "with p.progress_bar('work', total=50, unit='row', mininterval=0) as bar:\n"
    "    for _ in range(50):\n"
    "        bar.update(1); bar.set_postfix(loss=0.5)\n"
)


def run_with_stderr(stderr) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", SCRIPT], stderr=stderr, env=env, check=True, timeout=60)


def read_until_closed(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the pty's other end is closed: all read
            return
        if not chunk:
            return
        into.append(chunk)


def test_a_terminal_gets_a_redrawn_bar():
    """The pty is drained while the child writes: a pty buffers only a few KB, and a child
    whose 50 redraws fill it would block forever on an unread terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100
    chunks: list[bytes] = []
    reader = threading.Thread(target=read_until_closed, args=(master, chunks), daemon=True)
    reader.start()
    try:
        run_with_stderr(slave)
    finally:
        os.close(slave)  # the reader then sees the pty closed and ends
        reader.join(timeout=30)
        os.close(master)
    out = b"".join(chunks)
    assert b"\r" in out and b"50/50" in out


def test_a_log_file_gets_whole_lines_only(tmp_path):
    log = tmp_path / "log"
    with open(log, "wb") as f:
        run_with_stderr(f)
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 51  # one per update (interval 0) and the last one
    assert lines[-1].startswith("[work] done: 50/50 row in ")
    assert lines[-1].endswith("loss=0.5")


def test_plain_lines_keep_to_the_interval(capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 3600.0)
    bar = progress_bar("tokenize ds", unit=" docs")  # pytest's stderr is no terminal
    assert isinstance(bar, PlainProgress)
    with bar:
        for _ in range(1000):
            bar.update(3)
        bar.set_postfix(tokens=12345, tok_s="1,000", refresh=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("[tokenize ds] done: 3,000 docs in ")
    assert err.rstrip().endswith("tokens=12,345, tok_s=1,000")


def test_silent_when_disabled_or_when_the_caller_prints_its_own_lines(capsys):
    for bar in (progress_bar("a", disable=True), progress_bar("b", plain_lines=False)):
        with bar:
            bar.update(5)
    assert capsys.readouterr().err == ""


def test_a_stage_that_fails_prints_no_done_line(capsys):
    """Off a terminal a failed stage leaves only its error (a bad input is one line), never a
    `done:` line claiming it finished."""
    bar = progress_bar("tokenize ds", unit=" docs")
    try:
        with bar:
            bar.update(2)
            raise ValueError("bad input")
    except ValueError:
        pass
    assert capsys.readouterr().err == ""
