"""The lease that claims an artifact on an object store: a second writer is refused in one line
naming the holder, a dead holder's lease expires and is taken over, a live one is renewed, and of
writers that start at once exactly one gets it."""

import json
import threading
import time

import pytest

from scone_jax.artifacts.holder import ArtifactInUse
from scone_jax.artifacts.lease import ObjectStoreLease, lease_place
from scone_jax.artifacts.lock import writing
from scone_jax.artifacts.table_store import parse_location


def fresh_location(rng):
    return parse_location(f"memory://bucket{rng.integers(1 << 30)}/tables/t")


def test_a_second_writer_is_refused_in_one_line_until_the_first_releases(rng):
    loc = fresh_location(rng)
    with writing([("--out", loc)], "scone-jax export run --out t"):
        with pytest.raises(ArtifactInUse) as refused:
            with writing([("--out", loc)], "scone-jax export other"):
                pass
        message = str(refused.value)
        assert "\n" not in message and f"--out {loc.url} is being written by another job" in message
        assert "`scone-jax export run --out t`" in message and "expires in" in message
    with writing([("--out", loc)], "scone-jax export other"):  # released: free again
        pass


def test_a_dead_holders_lease_expires_and_is_taken_over(rng):
    loc = fresh_location(rng)
    dead = ObjectStoreLease(loc, "--out", "the dead job")
    spec, key = lease_place(loc)
    record = {"host": "gone", "pid": 1, "command": "x", "since": 0.0, "expires": time.time() - 1}
    dead.store.write(key, json.dumps(record).encode()).result()  # never renewed again
    lease = ObjectStoreLease(loc, "--out", "the rerun")
    lease.acquire()
    lease.release()
    assert dead.store.read(key).result().state == "missing"  # released: nothing left behind


def test_a_live_lease_is_renewed_past_its_length(rng):
    loc = fresh_location(rng)
    holder = ObjectStoreLease(loc, "--out", "long job", seconds=0.6)
    holder.acquire()
    try:
        time.sleep(1.5)  # well past one lease length: only renewals keep it
        with pytest.raises(ArtifactInUse, match="long job"):
            ObjectStoreLease(loc, "--out", "second", seconds=0.6).acquire()
    finally:
        holder.release()


def race(leases) -> tuple[list, list]:
    """Every lease tries at the same moment: (the ones that got it, the ones refused)."""
    start, won, refused = threading.Barrier(len(leases)), [], []

    def attempt(lease):
        start.wait()
        try:
            lease.acquire()
            won.append(lease)
        except ArtifactInUse:
            refused.append(lease)

    threads = [threading.Thread(target=attempt, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_of_writers_starting_at_once_exactly_one_gets_the_lease(rng):
    for _ in range(10):
        loc = fresh_location(rng)
        won, refused = race([ObjectStoreLease(loc, "--out", f"job {i}") for i in range(4)])
        assert len(won) == 1 and len(refused) == 3
        won[0].release()
