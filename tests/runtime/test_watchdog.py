"""The watchdog's decision after a runtime error, against an in-memory key-value store: a peer
gone silent is lost after the short limit (not the whole peer timeout), with the error's
traceback in a file; with every peer alive, the error is published as this process's own. A
process that stops publishes why, and its peers stop naming that cause."""

from __future__ import annotations

import threading

import pytest

import scone_jax.runtime.watchdog as watchdog_module
from scone_jax.errors import Terminated, UserError
from scone_jax.runtime.liveness import ALIVE, LivenessPort, probe
from scone_jax.runtime.watchdog import KV_PREFIX, PROBE_AFTER_S, PeerMonitor, Watchdog


class JaxRuntimeError(RuntimeError):
    """Named like jax's runtime error (what a collective broken by a dead peer raises)."""


class FakeClient:
    """The two key-value calls the watchdog makes, on a dict."""

    def __init__(self):
        self.kv: dict[str, str] = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        self.kv[key] = value

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in list(self.kv.items()) if k.startswith(prefix)]


@pytest.fixture
def watchdog(monkeypatch, tmp_path):
    """A running watchdog of process 0 of 2 (peer timeout 60 s, short limit 1 s), whose verdicts
    are recorded instead of ending the test's process."""
    monkeypatch.setattr(watchdog_module, "AFTER_ERROR_S", 1.0)
    monkeypatch.setattr(watchdog_module.atexit, "register", lambda f: None)
    client = FakeClient()
    dog = Watchdog(client, 0, 2, 60.0, "localhost:1")
    dog.log_dir = tmp_path / "logs"
    dog.verdicts, dog.published, dog.ended = [], [], threading.Event()

    def record(verdict, detail="", publish=True):
        dog.verdicts.append((verdict + detail, dog._log_pending_traceback()))
        dog.published.append(publish)
        dog._stop.set()
        dog.ended.set()

    monkeypatch.setattr(dog, "_die", record)
    dog.start()
    yield dog
    dog._stop.set()
    dog._thread.join()
    dog._port.close()  # a process's exit closes it


def failing_collective() -> JaxRuntimeError:
    try:
        raise JaxRuntimeError("INTERNAL: gloo: Connection reset by peer")
    except JaxRuntimeError as e:
        return e


def test_the_short_limit_applies_when_asked():
    m = PeerMonitor(process_id=0, num_processes=2, timeout_s=60, now=0.0)
    beat = {f"{KV_PREFIX}/beat/1": "1"}
    assert m.observe(beat, now=1.0) is None
    assert m.observe(beat, now=5.0) is None  # silent 4 s: fine under the 60 s timeout
    assert m.observe(beat, now=5.0, limit_s=3.0) == (
        "process 1 of 2 is lost (no heartbeat for 4s, limit 3s)"
    )


def test_a_silent_peer_is_gone_as_soon_as_the_probe_says_so():
    m = PeerMonitor(process_id=0, num_processes=3, timeout_s=60, now=0.0)
    asked = []

    def find_gone(beating, silent):
        asked.append((beating, silent))
        return set(silent) & {2}

    beats = {f"{KV_PREFIX}/beat/1": "1", f"{KV_PREFIX}/beat/2": "1"}
    assert m.observe(beats, now=1.0, find_gone=find_gone) is None
    beats[f"{KV_PREFIX}/beat/1"] = "2"  # peer 1 beats on, peer 2 falls silent
    assert m.observe(beats, now=1.0 + PROBE_AFTER_S, find_gone=find_gone) == (
        "process 2 of 3 is gone (no heartbeat for 2s and its liveness port refuses connections)"
    )
    assert asked == [([1, 2], []), ([1], [2])]


def test_a_silent_peer_the_probe_finds_alive_is_lost_after_the_timeout():
    m = PeerMonitor(process_id=0, num_processes=2, timeout_s=10, now=0.0)
    beat = {f"{KV_PREFIX}/beat/1": "1"}
    assert m.observe(beat, now=1.0, find_gone=lambda b, s: set()) is None
    assert m.observe(beat, now=9.0, find_gone=lambda b, s: set()) is None
    assert m.observe(beat, now=12.0, find_gone=lambda b, s: set()) == (
        "process 1 of 2 is lost (no heartbeat for 11s, limit 10s)"
    )


def test_a_peer_that_dies_while_this_process_waits_is_found_by_its_port(watchdog):
    """No collective fails (this process waits at a barrier, say): the port, not the 60 s
    timeout, finds the dead peer."""
    port = LivenessPort("localhost:1")
    try:
        watchdog.client.kv[f"{KV_PREFIX}/port/1"] = port.address
        for beat in range(1, 4):  # beats long enough for the watchdog to trust its port
            watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = str(beat)
            threading.Event().wait(1.0)
        assert watchdog._probe.trusted == {1}
    finally:
        port.close()  # the process is gone, and its heartbeat with it
    assert watchdog.ended.wait(20), "no verdict 20 s after the peer died (the peer timeout: 60 s)"
    [(verdict, logged)] = watchdog.verdicts
    assert verdict.startswith("process 1 of 2 is gone (no heartbeat for ")
    assert logged is None  # no error of this process's own to log


def wait_for_beat(watchdog, beat: int) -> None:
    for _ in range(100):
        if int(watchdog.client.kv[f"{KV_PREFIX}/beat/0"]) >= beat:
            return
        threading.Event().wait(0.1)
    raise AssertionError(f"the watchdog stopped beating at {watchdog.client.kv}")


def test_a_failing_probe_keeps_the_watchdog_beating_and_its_port_open(
    watchdog, monkeypatch, capsys
):
    """A dead watchdog thread would fall silent with its port refusing: its peers would call this
    live process gone."""

    def broken(beating, silent):
        raise RuntimeError("a bug in the probe")

    monkeypatch.setattr(watchdog._probe, "gone", broken)
    watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = "1"
    wait_for_beat(watchdog, 3)
    assert probe({0: watchdog._port.address}) == {0: ALIVE}
    assert watchdog.verdicts == []
    assert capsys.readouterr().err.count("probe failed (RuntimeError('a bug in the probe'))") == 1


def test_a_malformed_port_is_ignored(watchdog):
    watchdog.client.kv[f"{KV_PREFIX}/port/1"] = "not a port"
    watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = "1"
    wait_for_beat(watchdog, 3)
    assert watchdog._probe.addresses == {}
    assert probe({0: watchdog._port.address}) == {0: ALIVE}


def test_a_stopped_watchdog_leaves_its_port_to_the_process_exit(watchdog):
    """Jax's shutdown barrier can hold a finished process a while after its watchdog stopped;
    its port must answer until the process is gone."""
    watchdog._stop.set()
    watchdog._thread.join()
    assert probe({0: watchdog._port.address}) == {0: ALIVE}


def test_a_runtime_error_with_a_silent_peer_names_it_after_the_short_limit(watchdog):
    watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = "7"  # beat once, then died
    watchdog.report_failure(failing_collective())
    # the peer timeout is 60 s: a verdict well before it comes from the short limit
    assert watchdog.ended.wait(20), "no verdict 20 s after the error (the short limit is 1 s)"
    [(verdict, logged)] = watchdog.verdicts
    assert verdict.startswith("process 1 of 2 is lost (no heartbeat for ")
    assert verdict.endswith("limit 1s), after a collective failed")
    assert logged == watchdog.log_dir / "traceback.process_0.txt"
    text = logged.read_text()
    assert text.startswith("Traceback (most recent call last)") and "Connection reset" in text
    assert f"{KV_PREFIX}/failed/0" not in watchdog.client.kv  # the peer's loss, not this error


def test_a_runtime_error_of_its_own_is_published_while_the_peer_beats(watchdog):
    beating = threading.Event()

    def peer():
        beat = 0
        while not beating.wait(0.1):
            beat += 1
            watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = str(beat)

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    try:
        watchdog.report_failure(failing_collective())
        watchdog.await_verdict()
    finally:
        beating.set()
        thread.join()
    assert watchdog.verdicts == []
    assert watchdog.client.kv[f"{KV_PREFIX}/failed/0"] == (
        "JaxRuntimeError: INTERNAL: gloo: Connection reset by peer"
    )


def test_a_peer_that_stopped_is_not_blamed_for_the_cause_it_published(watchdog):
    """In a job of three, process 1 found process 2 dead and stopped: this process names process
    2, as process 1 found it, and does not publish that again."""
    watchdog.client.kv[f"{KV_PREFIX}/beat/1"] = "1"
    wait_for_beat(watchdog, 2)
    cause = "process 2 of 3 is gone (no heartbeat for 3s and its liveness port refuses connections)"
    watchdog.client.kv[f"{KV_PREFIX}/stopping/1"] = cause
    assert watchdog.ended.wait(10), "no verdict 10 s after a peer published why it stopped"
    assert watchdog.verdicts == [(f"{cause} (found by process 1)", None)]
    assert watchdog.published == [False]


def test_a_published_failure_is_named_before_a_peer_s_report_of_it():
    m = PeerMonitor(process_id=0, num_processes=3, timeout_s=60, now=0.0)
    entries = {
        f"{KV_PREFIX}/failed/2": "RuntimeError: bug",
        f"{KV_PREFIX}/stopping/1": "process 2 of 3 failed (RuntimeError: bug)",
    }
    assert m.reported(entries) is None
    assert m.observe(entries, now=1.0) == "process 2 of 3 failed (RuntimeError: bug)"
    del entries[f"{KV_PREFIX}/failed/2"]
    assert m.reported(entries) == "process 2 of 3 failed (RuntimeError: bug) (found by process 1)"


class Exited(Exception):
    """What the patched os._exit raises, with the key-value store as it was at the exit."""


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_stopping_process_publishes_its_cause_and_the_coordinator_waits_for_it_to_be_read(
    monkeypatch, capsys, process_id
):
    """Process 0 hosts the store: if it left at once, a peer that had not yet read the cause
    would see only the coordination service vanish."""
    client = FakeClient()
    dog = Watchdog(client, process_id, 3, 60.0, "localhost:1")
    beating_peer = 2 if process_id == 0 else 0
    beats = {f"{KV_PREFIX}/beat/{beating_peer}": "1"}  # the other peer is silent: not waited for
    dog.monitor.observe(beats, now=dog.monitor._looked_at + 0.1)

    def exit_(code):
        raise Exited(code, dict(client.kv))

    def reader():  # the beating peer reads the cause a little later and acknowledges it
        threading.Event().wait(0.5)
        client.kv[f"{KV_PREFIX}/acked/{beating_peer}"] = "1"

    monkeypatch.setattr(watchdog_module.os, "_exit", exit_)
    threading.Thread(target=reader, daemon=True).start()
    cause = "process 1 of 3 is gone" if process_id == 0 else "process 2 of 3 is gone"
    with pytest.raises(Exited) as exited:
        dog._die(cause)
    code, kv = exited.value.args
    assert code == watchdog_module.PEER_LOST_EXIT_CODE
    assert kv[f"{KV_PREFIX}/stopping/{process_id}"] == cause
    # only the coordinator waits for its news to be read
    assert (f"{KV_PREFIX}/acked/{beating_peer}" in kv) == (process_id == 0)
    assert f"scone-jax: {cause}; stopping process {process_id}. Rerun" in capsys.readouterr().err


@pytest.mark.parametrize(
    "exc, code",
    [
        (Terminated(), 143),  # SIGTERM: the exit status a shell expects, also under the watchdog
        (KeyboardInterrupt(), 130),
        (UserError("bad"), 2),
        (SystemExit(7), 7),
        (RuntimeError("bug"), 1),
    ],
)
def test_a_failure_ends_the_process_with_its_own_exit_status(exc, code):
    assert watchdog_module._exit_code(exc) == code
