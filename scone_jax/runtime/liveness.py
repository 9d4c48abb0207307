"""Tell a dead peer process from a silent one: a listening TCP port each process keeps open.

A heartbeat that stops says only that a peer is silent: it may be dead, or alive and starved
(paused, swapping). The kernel answers for a process whatever it is doing: it completes a
connection to a listening socket while the process is alive, even stopped, and refuses one
(RST) once the process is gone, since the socket closes with it. So a silent peer whose port
refuses connections is dead, and its peers need not wait out the whole peer timeout. No answer
(a lost host, a firewall that drops packets) proves nothing, and a port that never answered
while its peer was beating is not trusted at all (`PortProbe`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import time
from collections.abc import Iterable

BACKLOG = 1024  # connections the kernel completes while the owner's thread is starved
PROBE_WAIT_S = 0.3  # how long one round of probes waits for answers
TRUST_TRIES = 3  # rounds without an answer before a beating peer's port is given up on
PER_ROUND = 64  # ports asked per round, for trust and of silent peers: bounds the sockets

ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"


def local_address(coordinator: str) -> tuple[socket.AddressFamily, str]:
    """The family and address of this host's interface on the route to the coordinator, which
    is the one the peers, reaching the same coordinator, can reach this host by. A coordinator
    named by a hostname that resolves to loopback here (Debian maps a host's own name to
    127.0.1.1) is this host, not its address for the others: the default route's is used."""
    host = coordinator.rsplit(":", 1)[0].strip("[]") or "localhost"
    error: OSError = OSError(f"{host!r} resolves to no address")
    for family, _, _, _, target in socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM):
        try:
            address = _route_source(family, target)
            if _is_loopback(address) and not _names_loopback(host):
                address = _route_source(family, DEFAULT_ROUTE[family])
        except OSError as e:
            error = e
            continue
        if _is_loopback(address) and not _names_loopback(host):
            error = OSError(f"no address but loopback for the coordinator host {host!r}")
            continue
        return family, address
    raise error


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def _names_loopback(host: str) -> bool:
    """Whether the coordinator was named as this host's loopback (a one-host job)."""
    try:
        return host == "localhost" or _is_loopback(host)
    except ValueError:  # a hostname
        return False


# where a UDP socket is pointed to find the default route's source address (nothing is sent)
DEFAULT_ROUTE = {socket.AF_INET: ("198.51.100.1", 9), socket.AF_INET6: ("2001:db8::1", 9)}


def _route_source(family: socket.AddressFamily, target) -> str:
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)  # UDP: picks the route, sends nothing
        return s.getsockname()[0]


class LivenessPort:
    """This process's listening socket; `drain()` accepts and closes the probes' connections.
    It is closed by the process's exit alone (the watchdog never closes it), so that it refuses
    exactly when the process is gone; a forked child closes its copy."""

    def __init__(self, coordinator: str):
        family, address = local_address(coordinator)
        self._socket = socket.create_server((address, 0), family=family, backlog=BACKLOG)
        self._socket.setblocking(False)
        os.register_at_fork(after_in_child=self._socket.close)
        self.address = f"{self._socket.getsockname()[1]} {address}"  # "PORT HOST"
        if parse_address(self.address) is None:
            self._socket.close()
            raise OSError(f"{address} is not an address the peers can reach")

    def drain(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # none waiting (or the socket is closed)
                return
            connection.close()

    def close(self) -> None:
        self._socket.close()


def parse_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a published "PORT HOST", or None when it is not one (a scoped, link-local
    address names an interface of its own host only)."""
    port, _, host = address.partition(" ")
    if "%" in host:
        return None
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        return None
    return (host, number) if 0 < number < 65536 else None


def probe(addresses: dict[int, str], wait_s: float = PROBE_WAIT_S) -> dict[int, str]:
    """ALIVE, GONE or UNKNOWN for each {peer: "PORT HOST"}, all probed at once (non-blocking
    connects), waiting at most `wait_s` for answers."""
    pending: dict[socket.socket, int] = {}
    found = {peer: UNKNOWN for peer in addresses}
    try:
        for peer, address in addresses.items():
            parsed = parse_address(address)
            if parsed is None:
                continue
            host, port = parsed
            try:
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            except OSError:  # out of descriptors, no such family here: no answer
                continue
            pending[s] = peer
            s.setblocking(False)
            code = s.connect_ex((host, port))
            if code not in (0, errno.EINPROGRESS):
                found[peer] = GONE if code == errno.ECONNREFUSED else UNKNOWN
                del pending[s]
                s.close()
        # poll, not select: a training process may hold more than select's 1024 descriptors
        poller = select.poll()
        waiting = {s.fileno(): s for s in pending}
        for fd in waiting:
            poller.register(fd, select.POLLOUT)
        deadline = time.monotonic() + wait_s
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                s = waiting.pop(fd)
                poller.unregister(fd)
                code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                found[pending[s]] = (
                    ALIVE if code == 0 else GONE if code == errno.ECONNREFUSED else UNKNOWN
                )
    finally:
        for s in pending:
            s.close()
    return found


class PortProbe:
    """Which silent peers are certainly dead. A peer's port is trusted once it answered while the
    peer was beating; a port that refused then (a firewall that rejects) or stayed silent for
    `TRUST_TRIES` rounds is never asked again, and its peer is left to the heartbeat timeout.
    Each round asks at most `PER_ROUND` ports for trust and as many of silent peers, those of
    the peers next after this process first, so that in a large job each port gets few
    connections at a time."""

    def __init__(self, process_id: int, num_processes: int):
        self.process_id, self.num_processes = process_id, num_processes
        self.addresses: dict[int, str] = {}
        self.trusted: set[int] = set()
        self._tries: dict[int, int] = {}

    def learn(self, peer: int, address: str | None) -> None:
        if address is not None and peer not in self.addresses and parse_address(address):
            self.addresses[peer] = address
            self._tries[peer] = 0

    def gone(self, beating: Iterable[int], silent: Iterable[int]) -> set[int]:
        """Probe the untrusted ports of peers still `beating` (to trust them) and the trusted
        ports of `silent` ones; the silent peers whose trusted port refused."""
        untrusted = [
            p for p in beating if p in self.addresses and p not in self.trusted and self._usable(p)
        ]
        to_trust = self._first_of_round(untrusted)
        to_check = self._first_of_round(p for p in silent if p in self.trusted)
        if not to_trust and not to_check:
            return set()
        found = probe({p: self.addresses[p] for p in to_trust | to_check})
        for p in to_trust:
            if found[p] == ALIVE:
                self.trusted.add(p)
            else:
                self._tries[p] = TRUST_TRIES if found[p] == GONE else self._tries[p] + 1
        return {p for p in to_check if found[p] == GONE}

    def _first_of_round(self, peers: Iterable[int]) -> set[int]:
        """At most `PER_ROUND` of `peers`, those next after this process first."""
        nearest = sorted(peers, key=lambda p: (p - self.process_id) % self.num_processes)
        return set(nearest[:PER_ROUND])

    def _usable(self, peer: int) -> bool:
        return self._tries[peer] < TRUST_TRIES
