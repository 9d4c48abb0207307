"""The liveness port tells a dead process from a silent one: a live process's port answers even
while the process is stopped, a killed one's refuses; a port is trusted only once it answered
while its peer was beating."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from scone_jax.runtime import liveness
from scone_jax.runtime.liveness import ALIVE, GONE, UNKNOWN, LivenessPort, PortProbe, probe

HOLD_A_PORT = (
    "import sys, time\n"
    "from scone_jax.runtime.liveness import LivenessPort\n"
    "port = LivenessPort('localhost:1')\n"
    "print(port.address, flush=True)\n"
    "time.sleep(600)\n"
)


def closed_port_address() -> str:
    """The address of a port nothing listens on (one just released)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    return f"{port} 127.0.0.1"


@pytest.fixture
def port_process():
    """A separate process holding a liveness port; (its Popen, its address)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_A_PORT], stdout=subprocess.PIPE, text=True)
    address = proc.stdout.readline().strip()
    yield proc, address
    proc.kill()
    proc.wait()


def test_the_port_is_on_the_route_to_the_coordinator():
    assert liveness.local_address("localhost:1234")[1] in ("127.0.0.1", "::1")
    assert liveness.local_address("127.0.0.1:5") == (socket.AF_INET, "127.0.0.1")
    assert liveness.local_address("127.0.1.1:5") == (socket.AF_INET, "127.0.0.1")


def test_a_coordinator_hostname_that_is_loopback_here_takes_the_default_routes_address(
    monkeypatch,
):
    """Debian maps a host's own name to 127.0.1.1: the peers on other hosts cannot reach that."""
    routes = {"127.0.1.1": "127.0.0.1", liveness.DEFAULT_ROUTE[socket.AF_INET][0]: "10.1.2.3"}
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda *a, **k: [(socket.AF_INET, 0, 0, "", ("127.0.1.1", 9))]
    )
    monkeypatch.setattr(liveness, "_route_source", lambda family, target: routes[target[0]])
    assert liveness.local_address("node0:1234") == (socket.AF_INET, "10.1.2.3")
    routes[liveness.DEFAULT_ROUTE[socket.AF_INET][0]] = "127.0.0.1"  # no route out of this host
    with pytest.raises(OSError, match="no address but loopback for the coordinator host 'node0'"):
        liveness.local_address("node0:1234")


def test_a_live_port_answers_and_a_closed_one_refuses():
    port = LivenessPort("127.0.0.1:1")
    try:
        found = probe({1: port.address, 2: closed_port_address()})
    finally:
        port.close()
    assert found == {1: ALIVE, 2: GONE}


def test_a_malformed_or_unusable_address_is_no_answer():
    assert liveness.parse_address("12 10.0.0.1") == ("10.0.0.1", 12)
    for bad in ("not a port", "70000 10.0.0.1", "12 node0", "12", "12 fe80::1%eth0"):
        assert liveness.parse_address(bad) is None, bad
    assert probe({1: "12 fe80::1%eth0", 2: "x"}) == {1: UNKNOWN, 2: UNKNOWN}


def test_one_round_answers_for_every_port(rng):
    ports = [LivenessPort("127.0.0.1:1") for _ in range(40)]
    dead = set(rng.choice(40, 15, replace=False).tolist())
    try:
        for i in dead:
            ports[i].close()
        found = probe({i: port.address for i, port in enumerate(ports)})
    finally:
        for port in ports:
            port.close()
    assert found == {i: GONE if i in dead else ALIVE for i in range(40)}


def test_a_stopped_process_is_alive_and_a_killed_one_gone(port_process):
    proc, address = port_process
    os.kill(proc.pid, signal.SIGSTOP)  # silent, like a starved or paused peer
    try:
        assert probe({1: address}) == {1: ALIVE}
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait()
    assert probe({1: address}) == {1: GONE}


def test_draining_keeps_a_port_answering_past_its_backlog():
    port = LivenessPort("127.0.0.1:1")
    try:
        for round_ in range(3 * liveness.BACKLOG // 100):
            for _ in range(100):
                assert probe({1: port.address}) == {1: ALIVE}, f"round {round_}"
            port.drain()
    finally:
        port.close()


def test_no_answer_proves_nothing():
    # a listener whose accept queue is full: the kernel drops new connections unanswered, as a
    # lost host or a firewall that drops packets would
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    address = f"{full.getsockname()[1]} 127.0.0.1"
    try:
        found = [probe({1: address}, wait_s=0.2)[1] for _ in range(6)]  # each fills the queue
    finally:
        full.close()
    assert found[0] == ALIVE and found[-1] == UNKNOWN and GONE not in found, found


def test_only_a_trusted_port_can_declare_its_peer_gone():
    live = LivenessPort("127.0.0.1:1")
    refusing = closed_port_address()  # like a firewall that rejects connections
    ports = PortProbe(0, 3)
    ports.learn(1, live.address)
    ports.learn(2, refusing)
    assert ports.gone(beating=[1, 2], silent=[]) == set()
    assert ports.trusted == {1}
    live.close()  # peer 1 dies; peer 2 falls silent, its port refusing as it always did
    assert ports.gone(beating=[], silent=[1, 2]) == {1}


def test_a_round_asks_few_ports_for_trust_nearest_after_this_process_first(monkeypatch):
    asked = []

    def record(addresses, wait_s=0.0):
        asked.append(sorted(addresses))
        return {p: ALIVE for p in addresses}

    monkeypatch.setattr(liveness, "probe", record)
    ports = PortProbe(process_id=150, num_processes=200)
    for p in range(200):
        if p != 150:
            ports.learn(p, f"{1000 + p} 127.0.0.1")
    peers = [p for p in range(200) if p != 150]
    assert ports.gone(beating=peers, silent=[]) == set()
    assert asked[0] == list(range(0, 15)) + list(range(151, 200))  # 64: from 151 on, wrapping
    ports.gone(beating=peers, silent=[])
    assert asked[1] == list(range(15, 79))
