"""The artifact lock: a second writer is refused with one line naming the holder and changes
nothing; a released or dead holder never blocks the next; every spelling of a path shares one
lock; and a release racing a newcomer never leaves two holders."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

import scone_jax.artifacts.lock as lock_module
from scone_jax.artifacts.lock import ArtifactInUse, ArtifactLock, lock_file, writing
from scone_jax.errors import UserError
from tests.reliability.faults import snapshot

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def random_name(rng) -> str:
    return "artifact-" + "".join(rng.choice(list("abcdefghij0123456789"), 8))


def test_a_second_writer_is_refused_naming_the_holder_and_changes_nothing(tmp_path, rng):
    target = tmp_path / random_name(rng)
    command = f"scone-jax train tiny run_dir={target} seed={int(rng.integers(1 << 30))}"
    first = ArtifactLock(target, "run_dir", command)
    first.acquire()
    before = snapshot(tmp_path)
    with pytest.raises(ArtifactInUse) as refused:
        ArtifactLock(target, "run_dir", "scone-jax train again").acquire()
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"run_dir {target} is being written by another job")
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in line
    assert f"`{command}`" in line and " UTC" in line and str(lock_file(target)) in line
    assert snapshot(tmp_path) == before  # the holder's details are the first's, untouched
    first.release()
    assert not lock_file(target).exists()
    again = ArtifactLock(target, "run_dir", "scone-jax train again")
    again.acquire()  # released: free at once
    again.release()


def test_a_holder_killed_with_sigkill_leaves_a_lock_that_blocks_nothing(tmp_path, rng):
    target = tmp_path / random_name(rng)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from scone_jax.artifacts.lock import ArtifactLock; "
            "ArtifactLock(sys.argv[1], '--out', 'holder').acquire(); print('held', flush=True); "
            "time.sleep(600)",
            str(target),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ArtifactInUse, match=f"pid {holder.pid} on host .*`holder`"):
            ArtifactLock(target, "--out", "second").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_file(target).exists()  # the dead holder's file stays ...
    rerun = ArtifactLock(target, "--out", "rerun")
    rerun.acquire()  # ... and blocks nothing: the kernel dropped its lock with the process
    assert json.loads(lock_file(target).read_text())["command"] == "rerun"
    rerun.release()


def test_every_spelling_of_one_path_shares_one_lock(tmp_path, rng, monkeypatch):
    name = random_name(rng)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    first = ArtifactLock(tmp_path / "real" / name, "--out", "first")
    first.acquire()
    for spelling in (f"real/{name}", f"link/{name}", f"real/../real/{name}", f"./link/{name}"):
        with pytest.raises(ArtifactInUse):
            ArtifactLock(spelling, "--out", "second").acquire()
    first.release()


def test_a_release_racing_a_newcomer_never_leaves_two_holders(tmp_path, rng, monkeypatch):
    # the newcomer opens the lock file just before the holder removes it and lets go: its flock
    # then succeeds on a file no longer at the path, which must not count as holding the lock
    target = tmp_path / random_name(rng)
    holder = ArtifactLock(target, "--out", "holder")
    holder.acquire()
    real_open, opened = os.open, []

    def open_then_release(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if not opened:
            opened.append(fd)
            holder.release()
        return fd

    monkeypatch.setattr(lock_module.os, "open", open_then_release)
    newcomer = ArtifactLock(target, "--out", "newcomer")
    newcomer.acquire()
    monkeypatch.setattr(lock_module.os, "open", real_open)
    assert opened and lock_file(target).exists()
    with pytest.raises(ArtifactInUse, match="`newcomer`"):
        ArtifactLock(target, "--out", "third").acquire()
    newcomer.release()


def test_a_holder_that_has_not_written_its_details_yet_is_still_refused(tmp_path, monkeypatch):
    import fcntl

    target = tmp_path / "out"
    fd = os.open(lock_file(target), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    monkeypatch.setattr(lock_module, "HOLDER_READ_TRIES", 1)
    with pytest.raises(ArtifactInUse, match="its holder has not said who it is"):
        ArtifactLock(target, "--out", "second").acquire()
    os.close(fd)


def test_parents_made_for_the_lock_go_again_unless_the_artifact_was_written(tmp_path, rng):
    target = tmp_path / "a" / "b" / random_name(rng)
    lock = ArtifactLock(target, "--out", "x")
    lock.acquire()
    assert lock_file(target).parent == tmp_path / "a" / "b"
    lock.release()
    assert list(tmp_path.iterdir()) == []  # a refused or failed job leaves nothing behind
    lock.acquire()
    target.mkdir()
    lock.release()
    assert target.is_dir() and not lock_file(target).exists()


def test_a_path_that_can_never_be_written_is_refused_before_anything_is_made(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        ArtifactLock(tmp_path / "file" / "out", "--out", "x").acquire()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_writing_holds_each_path_once_skips_none_and_only_on_process_zero(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    with writing([("--out", a), ("--backbone-out", b), ("--hf-out", a), ("--out", None)], "cmd"):
        assert lock_file(a).exists() and lock_file(b).exists()
        with pytest.raises(ArtifactInUse):
            ArtifactLock(b, "--out", "other").acquire()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(lock_module, "process_index", lambda: 1)
    with writing([("--out", a)], "cmd"):
        assert not lock_file(a).exists()  # process 0 holds it for the whole job


def test_the_block_failing_releases_the_lock(tmp_path):
    with pytest.raises(RuntimeError), writing([("--out", tmp_path / "a")], "cmd"):
        raise RuntimeError("boom")
    with writing([("--out", tmp_path / "a")], "cmd"):
        pass


def test_the_holder_removes_what_a_killed_writer_left_and_nothing_else(tmp_path, rng, capsys):
    """A writer killed outright leaves its atomic temporary beside the artifact; the next holder
    of the lock removes it (no writer of the artifact can be alive then), and nothing that only
    looks similar: another artifact's temporary, or the artifact itself."""
    import tempfile

    from scone_jax.atomic import atomic_dir, temporary_prefix

    target = tmp_path / random_name(rng)
    left_dir = tempfile.mkdtemp(prefix=temporary_prefix(target), dir=tmp_path)
    (tmp_path / left_dir / "part.bin").write_bytes(rng.bytes(64))
    _, left_file = tempfile.mkstemp(prefix=temporary_prefix(target), dir=tmp_path)
    other = tmp_path / f"{target.name}.tmp-x"  # an artifact named like a temporary
    other_tmp = tempfile.mkdtemp(prefix=temporary_prefix(other), dir=tmp_path)
    with atomic_dir(target) as out:
        (out / "a").write_text("done")
    with writing([("--out", target)], "scone-jax tokenize again"):
        pass
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([target.name, os.path.basename(other_tmp)]), left
    said = capsys.readouterr().err
    assert f"removed {left_dir}, which an interrupted write of {target} left" in said
    assert f"removed {left_file}," in said


def test_a_live_writers_temporary_is_never_removed(tmp_path, rng):
    """A writer holding another lock (train's set-up writes RUN/fgrams under the run dir's lock)
    keeps its temporary: the cleanup takes only temporaries whose writer's own lock is free."""
    from scone_jax.atomic import atomic_dir

    target = tmp_path / "run" / "fgrams"
    payload = rng.bytes(int(rng.integers(1, 1024)))
    with atomic_dir(target) as live:
        (live / "keys.npy").write_bytes(payload)
        with writing([("--out", target)], "scone-jax fgrams build --out run/fgrams"):
            pass
        assert live.is_dir()
    assert (target / "keys.npy").read_bytes() == payload
