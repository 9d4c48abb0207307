"""One writer per artifact on an object store (gs://, s3://, memory://), where no OS lock exists:
a lease, a small record beside the artifact that names its holder and an expiry the holder
renews while it runs.

A second job that finds an unexpired lease ends with one line naming the holder; a holder that
died stops renewing, so its lease expires (`LEASE_SECONDS`) and the next job takes it over.
Taking a lease is a conditional write (the store's generation of the record, as read), so of two
jobs that start at once exactly one gets it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import tensorstore as ts

from scone_jax.artifacts.holder import ArtifactInUse, Holder
from scone_jax.artifacts.table_store import SHARED_CONTEXT, Location

LEASE_SECONDS = 60.0  # how long a lease outlives its holder's last renewal


@dataclass
class LeaseRecord:
    host: str
    pid: int
    command: str
    since: float
    expires: float  # seconds since the epoch, moved on at every renewal

    @property
    def holder(self) -> Holder:
        return Holder(self.host, self.pid, self.command, self.since)


def lease_place(loc: Location) -> tuple[dict, str]:
    """The kvstore spec of the artifact's parent and the lease's key there (`.NAME.lease`)."""
    path = loc.kvstore.get("path", "").rstrip("/")
    parent, _, name = path.rpartition("/")
    return {**loc.kvstore, "path": parent + "/" if parent else ""}, f".{name}.lease"


class ObjectStoreLease:
    """The lease of the artifact at `loc`; `what` names it in the refusal."""

    def __init__(self, loc: Location, what: str, command: str, seconds: float = LEASE_SECONDS):
        self.loc, self.what, self.command, self.seconds = loc, what, command, seconds
        spec, self.key = lease_place(loc)
        self.store = ts.KvStore.open(spec, context=SHARED_CONTEXT).result()
        self._generation: bytes | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._record: LeaseRecord | None = None

    def acquire(self) -> None:
        """Take the lease, or raise ArtifactInUse naming its holder; changes nothing then."""
        now = time.time()
        found = self.store.read(self.key).result()
        if found.state == "value":
            held = LeaseRecord(**json.loads(found.value))
            if held.expires > now:
                raise ArtifactInUse(self._refusal(held.holder, held.expires - now))
        record = LeaseRecord(
            socket.gethostname(), os.getpid(), self.command[:500], now, now + self.seconds
        )
        written = self._write(record, found.stamp.generation)
        if not written:  # another job took it between our read and our write
            now_held = self.store.read(self.key).result()
            if now_held.state != "value":  # and has released it already
                raise ArtifactInUse(self._refusal(None, 0.0))
            winner = LeaseRecord(**json.loads(now_held.value))
            raise ArtifactInUse(self._refusal(winner.holder, winner.expires - time.time()))
        self._record = record
        self._renewer = threading.Thread(target=self._renew, daemon=True, name="lease-renewer")
        self._renewer.start()

    def release(self) -> None:
        if self._renewer is None:
            return
        self._stop.set()
        self._renewer.join()
        self._renewer = None
        if self._generation is not None:  # still ours: take it away
            self.store.write(self.key, None, if_equal=self._generation).result()

    def _write(self, record: LeaseRecord, generation: bytes) -> bool:
        stamp = self.store.write(
            self.key, json.dumps(record.__dict__).encode(), if_equal=generation
        ).result()
        self._generation = stamp.generation or None
        return self._generation is not None

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            self._record.expires = time.time() + self.seconds
            if not self._write(self._record, self._generation):
                print(
                    f"warning: the lease of {self.what} {self.loc.url} was taken over while this "
                    "job held it (it did not renew it for over "
                    f"{self.seconds:g} s); another job may now write it too",
                    file=sys.stderr,
                    flush=True,
                )
                return

    def _refusal(self, holder: Holder | None, left: float) -> str:
        who = holder.describe() if holder else "it has just finished"
        return (
            f"{self.what} {self.loc.url} is being written by another job ({who}; "
            f"lease {self.key} beside it, expires in {max(left, 0):.0f} s unless renewed); wait "
            "for it to end, or stop it and rerun"
        )
