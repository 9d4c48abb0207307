"""Torn writes: a process killed in the middle of writing a checkpoint, a table or an f-gram set
leaves the last complete one in use; a partial one is never opened, and the next start
finishes the job with the same result as a run that was never killed."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import DAMAGED_DIR
from scone_jax.artifacts.restore import load_run_params
from scone_jax.artifacts.run_dir import checkpoints_dir, committed_steps
from scone_jax.artifacts.table_store import PROGRESS
from scone_jax.errors import UserError
from scone_jax.export.table import export_table
from scone_jax.fgrams.store import FgramSet
from scone_jax.serve.tables import open_table
from tests.reliability.faults import (
    TALLY,
    assert_intact,
    faulty_cli,
    finish,
    last_line,
    snapshot,
    wait_for_hang,
    writes_seen,
)
from tests.train.helpers import losses, read_metrics, tiny_overrides

pytestmark = pytest.mark.slow
KILLED = -9  # a Popen returncode: ended by SIGKILL


def killed(result) -> None:
    assert result.returncode == KILLED, (
        f"expected a SIGKILL, got {result.returncode}: {result.stderr[-2000:]}"
    )
    TALLY["faults injected"] += 1


def start_message(step: int) -> str:
    return f"resuming at step {step}" if step else "starting from scratch"


def save_writes(writes: list[str], checkpoints, step: int) -> tuple[int, int]:
    """(writes of the save of `step`, 1-based index of its commit: the rename to
    checkpoints/STEP)."""
    mine = [w for w in writes if w.split(" ", 1)[1].startswith(f"{checkpoints}/{step}")]
    return len(mine), mine.index(f"rename {checkpoints}/{step}") + 1


def test_a_kill_inside_a_checkpoint_save_resumes_from_the_last_complete_one(
    markov_dataset, tmp_path, rng
):
    steps, every = 12, 4
    args = lambda run: [  # noqa: E731
        "train",
        "tiny",
        *tiny_overrides(
            markov_dataset.path,
            run,
            steps,
            **{"checkpoint.every": every},
        ),
    ]
    straight = finish(
        faulty_cli(
            args(tmp_path / "straight"),
            devices=1,
            compile_cache=True,
            count_writes=tmp_path / "straight" / "checkpoints",
        )
    )
    assert straight.returncode == 0, straight.stderr[-2000:]
    writes = [w.replace(str(tmp_path / "straight"), "RUN") for w in writes_seen(straight.stderr)]

    run, resumes_at = tmp_path / "run", 0
    for step in (4, 8):
        count, commit = save_writes(writes, "RUN/checkpoints", step)
        kill_at = int(rng.integers(1, count + 1))
        result = finish(
            faulty_cli(
                args(run),
                devices=1,
                compile_cache=True,
                kill_at_write=(run / "checkpoints" / str(step), kill_at),
            )
        )
        killed(result)
        assert start_message(resumes_at) in result.stdout
        # orbax commits a save by renaming its directory to the step; anything else is never opened
        resumes_at = max(committed_steps(checkpoints_dir(run)), default=0)
        assert resumes_at in (step, step - every)
        print(
            f"killed at write {kill_at}/{count} of the save of step {step} (the commit is write "
            f"{commit}): next start at {resumes_at}"
        )
    final = finish(faulty_cli(args(run), devices=1, compile_cache=True))
    assert final.returncode == 0, final.stderr[-2000:]
    assert start_message(resumes_at) in final.stdout
    TALLY["restarts survived"] += 2
    assert [r["step"] for r in read_metrics(run)] == list(range(1, steps + 1))
    assert losses(run) == losses(tmp_path / "straight")
    assert not (run / DAMAGED_DIR).exists(), "a kill made a committed checkpoint fail its checksums"
    final_params = [
        jax.tree.leaves(jax.device_get(load_run_params(r).params))
        for r in (run, tmp_path / "straight")
    ]
    for a, b in zip(*final_params, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_kill_during_a_table_export_never_exposes_a_partial_table(scone_artifacts, tmp_path, rng):
    run, original, table = scone_artifacts["run"], scone_artifacts["table"], tmp_path / "table"
    shutil.copytree(original, table)  # a float32 table, to be replaced by a bfloat16 one
    old = snapshot(table)
    num_ranges = -(-open_table(str(original), "host").num_rows // 100)

    def export(dtype: str, out=table, **fault):
        return faulty_cli(
            [
                "export",
                str(run),
                "--out",
                str(out),
                "--overwrite",
                "--dtype",
                dtype,
                "--range-rows",
                "100",
                "--batch-rows",
                "16",
                "--no-progress",
            ],
            **fault,
        )

    def after_ranges(
        done: int,
    ) -> dict:  # stop once `done` ranges are recorded, before the next is computed
        return {"hang_after_call": ("scone_jax.export.table.write_json", done)}

    # killed while computing rows: the old table is untouched and still opens
    done = int(rng.integers(1, num_ranges))
    proc = export("bfloat16", **after_ranges(done))
    wait_for_hang(proc)
    assert len(json.loads((tmp_path / "table.partial" / PROGRESS).read_text())["done"]) == done
    proc.kill()
    killed(finish(proc))
    assert_intact(old)
    assert open_table(str(table), "host").meta["dtype"] == "float32"

    # the next start resumes, then swaps the finished table in, in one step
    resumed = finish(export("bfloat16", count_writes=tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    TALLY["restarts survived"] += 1
    reference = export_table(
        run,
        str(tmp_path / "reference"),
        dtype="bfloat16",
        progress=False,
        range_rows=100,
        batch_rows=16,
    )
    assert open_table(str(table), "host").meta["checksum"] == reference["checksum"]
    assert not (tmp_path / "table.partial").exists()

    # killed at any Python-level write of an export (all of them follow the swap): the new table is
    # complete
    kill_at = int(rng.integers(1, len(writes_seen(resumed.stderr)) + 1))
    killed(finish(export("float32", kill_at_write=(tmp_path, kill_at))))
    assert (
        open_table(str(table), "host").meta["dtype"] == "float32"
    )  # the host tier verifies every row

    # a first export killed midway leaves nothing a reader would open
    proc = export(
        "float32", out=tmp_path / "fresh", **after_ranges(int(rng.integers(1, num_ranges)))
    )
    wait_for_hang(proc)
    proc.kill()
    killed(finish(proc))
    with pytest.raises(UserError, match="not a complete f-gram table"):
        open_table(str(tmp_path / "fresh"), "host")


def test_a_kill_while_replacing_an_fgram_set_leaves_the_old_or_the_new_one(
    scone_artifacts, tmp_path, rng
):
    sets = tmp_path / "sets"
    out = sets / "fgrams"
    shutil.copytree(scone_artifacts["fgrams"], out)
    old = snapshot(out)
    args = [
        "fgrams",
        "build",
        str(scone_artifacts["dataset"]),
        "--out",
        str(out),
        "--overwrite",
        "--max-n",
        "3",
        "--num-fgrams",
        "500",
        "--min-count",
        "2",
        "--no-progress",
    ]
    straight = finish(faulty_cli(args, count_writes=sets))
    assert straight.returncode == 0, straight.stderr[-2000:]
    new = FgramSet.load(out).fingerprint
    for _ in range(2):
        shutil.rmtree(out)
        shutil.copytree(scone_artifacts["fgrams"], out)
        kill_at = int(rng.integers(1, len(writes_seen(straight.stderr)) + 1))
        killed(finish(faulty_cli(args, kill_at_write=(sets, kill_at))))
        found = FgramSet.load(out)  # complete, whichever it is
        print(
            f"killed at write {kill_at}: {'new' if found.fingerprint == new else 'old'} set in "
            "place"
        )
        if found.fingerprint != new:
            assert_intact(old)
    result = finish(faulty_cli(args))
    assert result.returncode == 0, last_line(result.stderr)
    TALLY["restarts survived"] += 1
    assert FgramSet.load(out).fingerprint == new
