"""Who writes an artifact, and the refusal a second writer gets: shared by the OS lock of local
and network paths (lock.py) and the lease of object stores (lease.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from scone_jax.errors import UserError


class ArtifactInUse(UserError):
    """The artifact is being written by another job."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    command: str
    since: float  # seconds since the epoch

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on host {self.host}, `{self.command}`, since {since}"
