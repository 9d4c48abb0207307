"""Stop every process of a job promptly, with one line naming the peer, when one is lost.

Why a watchdog on top of jax's runtime: the runtime aborts every process when one stops sending
heartbeats, but only after `heartbeat_timeout` and with a C++ stack trace; and a process that
fails with a Python exception keeps heartbeating while it waits in jax's shutdown barrier, so
its peers sit in their next collective until `shutdown_timeout`. The watchdog (a daemon thread)
publishes this process's heartbeat and failure in the coordination service's key-value store
and ends the process with one line naming the peer when a peer fails or falls silent.

A collective that fails because a peer died (gloo: "Connection reset by peer") raises a runtime
error at once; from then on a peer silent for `AFTER_ERROR_S` (not the whole peer timeout) is
lost, since a live peer beats every second. The process then ends within seconds of the death,
with the one line on the terminal and the error's traceback in a file (`log_dir`).

A peer killed while this process waits outside a collective (a coordination barrier, such as
orbax's around a checkpoint save) raises nothing here; a peer silent for `PROBE_AFTER_S` whose
liveness port refuses connections is dead (runtime/liveness.py), so that case too ends within
seconds. A peer that is silent but alive (paused, starved) is lost after the peer timeout.

The process that finds the cause publishes it before it stops, and its peers stop naming that
cause: otherwise, in a job of three or more, a peer slower to notice would name the stopping
process (or, when process 0 stops, the coordination service) instead of the one that failed.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from scone_jax.errors import Terminated, UserError
from scone_jax.runtime.liveness import LivenessPort, PortProbe

PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL: rerun the job to resume from the last checkpoint
KV_PREFIX = "scone_jax/watchdog"
# the silence that loses a peer once a collective has failed (capped at the peer timeout)
AFTER_ERROR_S = 5.0
# the silence after which a peer's liveness port is asked whether the peer is dead
PROBE_AFTER_S = 2.0


class PeerMonitor:
    """Decides, from snapshots of the watchdog's key-value directory, whether a peer is lost.

    A peer is lost when it reported a failure, when its heartbeat counter has not changed for
    `timeout_s` of this process's own clock (no clock is compared across hosts), or when it is
    silent and a probe finds its process dead. A peer that announced a normal exit is no longer
    watched.
    """

    def __init__(self, process_id: int, num_processes: int, timeout_s: float, now: float):
        self.process_id, self.num_processes, self.timeout_s = process_id, num_processes, timeout_s
        self.peers = [p for p in range(num_processes) if p != process_id]
        # per peer: its last beat, when it was first seen, and the look before (the beat came after)
        self._last: dict[int, tuple[str | None, float]] = {p: (None, now) for p in self.peers}
        self._beat_after = {p: -float("inf") for p in self.peers}
        self._looked_at = now

    def all_alive_since(self, moment: float, entries: Mapping[str, str]) -> bool:
        """Whether every peer has certainly beaten (or announced its exit) after `moment`: none
        is lost then. A new beat was made after the look before the one that saw it."""
        return all(
            self._beat_after[p] > moment or f"{KV_PREFIX}/exiting/{p}" in entries
            for p in self.peers
        )

    def beating(self, now: float) -> list[int]:
        """The peers whose heartbeat changed within `PROBE_AFTER_S` of `now`."""
        return [p for p in self.peers if now - self._last[p][1] < PROBE_AFTER_S]

    def reported(self, entries: Mapping[str, str]) -> str | None:
        """The cause a peer published when it stopped, naming that peer, or None (also while a
        peer's own failure is published: `observe` names that)."""
        if any(f"{KV_PREFIX}/failed/{p}" in entries for p in self.peers):
            return None
        for p in self.peers:
            cause = entries.get(f"{KV_PREFIX}/stopping/{p}")
            if cause is not None:
                return f"{cause} (found by process {p})"
        return None

    def observe(
        self,
        entries: Mapping[str, str],
        now: float,
        limit_s: float | None = None,
        find_gone: Callable[[list[int], list[int]], set[int]] | None = None,
    ) -> str | None:
        """One line naming the lost peer, or None while every peer is fine; a peer is lost after
        `limit_s` of silence (default: the timeout), or as soon as `find_gone(beating, silent)`
        (given the peers beating and those silent for `PROBE_AFTER_S`) says it is dead."""
        limit_s = self.timeout_s if limit_s is None else limit_s
        looked_before, self._looked_at = self._looked_at, now
        for p in self.peers:
            failed = entries.get(f"{KV_PREFIX}/failed/{p}")
            if failed is not None:
                return f"process {p} of {self.num_processes} failed ({failed})"
        watched = [p for p in self.peers if f"{KV_PREFIX}/exiting/{p}" not in entries]
        for p in watched:
            beat = entries.get(f"{KV_PREFIX}/beat/{p}")
            if beat != self._last[p][0]:
                self._last[p], self._beat_after[p] = (beat, now), looked_before
        silent = [p for p in watched if now - self._last[p][1] >= PROBE_AFTER_S]
        beating = [p for p in watched if p not in silent]
        gone = find_gone(beating, silent) if find_gone is not None and watched else set()
        for p in watched:
            silence = now - self._last[p][1]
            if p in gone:
                return (
                    f"process {p} of {self.num_processes} is gone (no heartbeat for "
                    f"{silence:.0f}s and its liveness port refuses connections)"
                )
            if silence > limit_s:
                return (
                    f"process {p} of {self.num_processes} is lost (no heartbeat for "
                    f"{silence:.0f}s, limit {limit_s:g}s)"
                )
        return None


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return getattr(exc, "exit_code", 1) if isinstance(exc, UserError | Terminated) else 1


class Watchdog:
    """A daemon thread: heartbeat into the key-value store, watch the peers, end this process if one
    is lost."""

    def __init__(
        self, client, process_id: int, num_processes: int, timeout_s: float, coordinator: str
    ):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout_s, self.coordinator = timeout_s, coordinator
        self.interval_s = min(1.0, timeout_s / 10)
        self.monitor = PeerMonitor(process_id, num_processes, timeout_s, time.monotonic())
        self._stop = threading.Event()
        self.log_dir: Path | None = None  # where a lost peer's traceback goes (else nowhere)
        self._failed_code: int | None = None  # set once this process's failure is published
        # a runtime error, not yet published: (exit code, line, when, the exception)
        self._pending: tuple[int, str, float, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="scone-jax-watchdog", daemon=True)
        self._port: LivenessPort | None = None
        self._probe = PortProbe(process_id, num_processes)
        self._probe_failed = False

    def start(self) -> None:
        self._set("beat", "0")
        try:
            self._port = LivenessPort(self.coordinator)
        except (OSError, UnicodeError) as e:
            print(
                f"scone-jax: no liveness port on process {self.process_id} ({e}); its peers find "
                f"it dead by the peer timeout ({self.timeout_s:g}s) alone",
                file=sys.stderr,
                flush=True,
            )
        else:
            self._set("port", self._port.address)
        self._thread.start()
        atexit.register(
            self._at_exit
        )  # runs before jax's own atexit shutdown (registered at import)

    def _set(self, kind: str, value: str) -> None:
        self.client.key_value_set(
            f"{KV_PREFIX}/{kind}/{self.process_id}", value, allow_overwrite=True
        )

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(self.interval_s):
            beat += 1
            if self._port is not None:
                self._port.drain()
            try:
                self._set("beat", str(beat))
                entries = dict(self.client.key_value_dir_get(f"{KV_PREFIX}/"))
            except Exception as e:  # noqa: BLE001 - any failure here means the coordinator is gone
                if self._stop.is_set():
                    return
                self._die(
                    f"lost the coordinator (process 0 at {self.coordinator}): "
                    f"{str(e).splitlines()[0]}"
                )
                return
            if self._failed_code is not None:
                continue  # this process is already on its way out; it only keeps the heartbeat
            for p in self.monitor.peers:
                self._probe.learn(p, entries.get(f"{KV_PREFIX}/port/{p}"))
            reported = self.monitor.reported(entries)
            if reported:
                self._die(reported, publish=False)
            pending = self._pending
            limit = min(self.timeout_s, AFTER_ERROR_S) if pending else None
            verdict = self.monitor.observe(entries, time.monotonic(), limit, self._find_gone)
            if verdict:
                self._die(verdict, ", after a collective failed" if pending else "")
            if pending is not None and self.monitor.all_alive_since(pending[2], entries):
                self._publish(
                    pending[0], pending[1]
                )  # every peer is alive: the error was this process's own

    def _find_gone(self, beating: list[int], silent: list[int]) -> set[int]:
        """The probe's dead peers; a probe that fails (a bug, the host out of descriptors) finds
        none rather than stopping the heartbeat, which would make this process look dead."""
        try:
            return self._probe.gone(beating, silent)
        except Exception as e:  # noqa: BLE001
            if not self._probe_failed:
                self._probe_failed = True
                print(
                    f"scone-jax: process {self.process_id}'s liveness probe failed ({e!r}); "
                    "a dead peer is found by the peer timeout",
                    file=sys.stderr,
                    flush=True,
                )
            return set()

    def _die(self, verdict: str, detail: str = "", publish: bool = True) -> None:
        """End this process with one line, printed first: once this process acknowledges, a
        coordinator waiting for that may leave and take the runtime, and this process, down.
        `publish` the cause for the peers (not when it is a peer's published cause); process 0
        hosts the key-value store, so it then waits, briefly, until the peers beating have read it.
        """
        logged = self._log_pending_traceback()
        print(
            f"scone-jax: {verdict}{detail}; stopping process {self.process_id}. Rerun the job to "
            "resume (training from its last checkpoint, an export from its finished rows)."
            + (f" This process's traceback: {logged}" if logged else ""),
            file=sys.stderr,
            flush=True,
        )
        try:
            if publish:
                self._set("stopping", verdict)
            self._set("acked", "1")  # lets a stopping coordinator know its news was read
        except Exception:  # noqa: BLE001
            pass
        if self.process_id == 0:
            self._await_peers(self.monitor.beating(time.monotonic()))
        os._exit(PEER_LOST_EXIT_CODE)

    def _log_pending_traceback(self) -> Path | None:
        """Write the held-back runtime error's traceback to `log_dir`; its path, or None."""
        pending = self._pending
        if pending is None or self.log_dir is None:
            return None
        path = self.log_dir / f"traceback.process_{self.process_id}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(traceback.format_exception(pending[3])), encoding="utf-8")
        except OSError:
            return None
        return path

    def report_failure(self, exc: BaseException) -> None:
        """Tell the peers this process failed, so they stop now instead of in a collective's
        timeout.

        A runtime (XLA) error is usually a collective broken by a peer that died: it is published
        only once every peer has shown a heartbeat since, so that when a peer is lost, the line
        that ends the job names that peer (the watchdog finds it within the peer timeout).
        """
        if self._failed_code is not None or self._pending is not None:
            return
        code = _exit_code(exc)
        line = (
            f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__
        )[:300]
        if type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
            self._pending = (code, line, time.monotonic(), exc)
        else:
            self._publish(code, line)

    def await_verdict(self) -> None:
        """Block while a held-back runtime error waits for the watchdog: it ends this process
        naming a lost peer, or publishes the error as this process's own; past the longest that
        can take, publish it here."""
        if self._pending is None:
            return
        deadline = time.monotonic() + self.timeout_s + 3 * self.interval_s
        while self._failed_code is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._failed_code is None:
            self._publish(*self._pending[:2])

    def _publish(self, code: int, line: str) -> None:
        self._failed_code = code
        try:
            self._set("failed", line)
        except Exception:  # noqa: BLE001 - the coordinator is gone: the runtime stops the peers
            pass

    def _at_exit(self) -> None:
        self.await_verdict()
        if self._failed_code is None:
            try:
                self._set("exiting", "1")
            except Exception:  # noqa: BLE001
                pass
            self._stop.set()
            return
        # Failed: skip jax's shutdown barrier (the peers are stopping, not coming to it). The
        # coordinator hosts the key-value store, so it waits until the peers have read the failure.
        if self.process_id == 0:
            self._await_peers(self.monitor.peers, extra_s=5)
        self._stop.set()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self._failed_code)

    def _await_peers(self, peers: list[int], extra_s: float = 0.0) -> None:
        """Wait until each of `peers` has read this process's news (it acknowledged, failed or
        exited), for at most a few heartbeat intervals."""
        deadline = time.monotonic() + min(self.timeout_s, 3 * self.interval_s + extra_s)
        while time.monotonic() < deadline and not self._have_read(peers):
            time.sleep(0.1)

    def _have_read(self, peers: list[int]) -> bool:
        try:
            entries = dict(self.client.key_value_dir_get(f"{KV_PREFIX}/"))
        except Exception:  # noqa: BLE001
            return True
        return all(
            any(f"{KV_PREFIX}/{k}/{p}" in entries for k in ("acked", "failed", "exiting"))
            for p in peers
        )
