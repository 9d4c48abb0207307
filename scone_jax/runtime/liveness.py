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
import select
import socket
import time
from collections.abc import Iterable

BACKLOG = 1024  # connections the kernel completes while the owner's thread is starved
PROBE_WAIT_S = 0.3  # how long one round of probes waits for answers
TRUST_TRIES = 3  # rounds without an answer before a beating peer's port is given up on
TRUST_PER_ROUND = 64  # ports asked for trust per round: bounds sockets and each port's queue

ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"


def local_address(coordinator: str) -> tuple[socket.AddressFamily, str]:
    """The family and address of this host's interface on the route to the coordinator, which
    is the one the peers, reaching the same coordinator, can reach this host by."""
    host = coordinator.rsplit(":", 1)[0].strip("[]") or "localhost"
    family, _, _, _, target = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)  # UDP: picks the route, sends nothing
        return family, s.getsockname()[0]


class LivenessPort:
    """This process's listening socket; `drain()` accepts and closes the probes' connections."""

    def __init__(self, coordinator: str):
        family, address = local_address(coordinator)
        self._socket = socket.create_server((address, 0), family=family, backlog=BACKLOG)
        self._socket.setblocking(False)
        self.address = f"{self._socket.getsockname()[1]} {address}"  # "PORT HOST"

    def drain(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # none waiting (or the socket is closed)
                return
            connection.close()

    def close(self) -> None:
        self._socket.close()


def probe(addresses: dict[int, str], wait_s: float = PROBE_WAIT_S) -> dict[int, str]:
    """ALIVE, GONE or UNKNOWN for each {peer: "PORT HOST"}, all probed at once (non-blocking
    connects), waiting at most `wait_s` for answers."""
    pending: dict[socket.socket, int] = {}
    found = {peer: UNKNOWN for peer in addresses}
    for peer, address in addresses.items():
        port, host = address.split(" ", 1)
        try:
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError:  # out of descriptors, no such family here: no answer
            continue
        s.setblocking(False)
        code = s.connect_ex((host, int(port)))
        if code in (0, errno.EINPROGRESS):
            pending[s] = peer
            continue
        found[peer] = GONE if code == errno.ECONNREFUSED else UNKNOWN
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
    for s in pending:
        s.close()
    return found


class PortProbe:
    """Which silent peers are certainly dead. A peer's port is trusted once it answered while the
    peer was beating; a port that refused then (a firewall that rejects) or stayed silent for
    `TRUST_TRIES` rounds is never asked again, and its peer is left to the heartbeat timeout.
    Each round asks at most `TRUST_PER_ROUND` ports for trust, those of the peers next after
    this process first, so that in a large job each port gets few connections at a time."""

    def __init__(self, process_id: int, num_processes: int):
        self.process_id, self.num_processes = process_id, num_processes
        self.addresses: dict[int, str] = {}
        self.trusted: set[int] = set()
        self._tries: dict[int, int] = {}

    def learn(self, peer: int, address: str | None) -> None:
        if address is not None and peer not in self.addresses:
            self.addresses[peer] = address
            self._tries[peer] = 0

    def gone(self, beating: Iterable[int], silent: Iterable[int]) -> set[int]:
        """Probe the untrusted ports of peers still `beating` (to trust them) and the trusted
        ports of `silent` ones; the silent peers whose trusted port refused."""
        untrusted = [
            p for p in beating if p in self.addresses and p not in self.trusted and self._usable(p)
        ]
        untrusted.sort(key=lambda p: (p - self.process_id) % self.num_processes)
        to_trust = set(untrusted[:TRUST_PER_ROUND])
        to_check = {p for p in silent if p in self.trusted}
        if not to_trust and not to_check:
            return set()
        found = probe({p: self.addresses[p] for p in to_trust | to_check})
        for p in to_trust:
            if found[p] == ALIVE:
                self.trusted.add(p)
            else:
                self._tries[p] = TRUST_TRIES if found[p] == GONE else self._tries[p] + 1
        return {p for p in to_check if found[p] == GONE}

    def _usable(self, peer: int) -> bool:
        return self._tries[peer] < TRUST_TRIES
