"""One writer per artifact: a second train, export or sweep on the location a first one is
writing is refused with one line naming the holder and changes nothing; the first ends complete;
a holder killed with SIGKILL never blocks the rerun.

The first job stops itself at a known point (`faulty_cli --stop-after-call`: SIGSTOP, holding
its locks) while the second runs, then goes on (SIGCONT): no test depends on how fast a job is.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from scone_jax.serve.tables import open_table
from tests.reliability.faults import (
    TALLY,
    assert_intact,
    error_line,
    faulty_cli,
    finish,
    snapshot,
    wait_for_stop,
)
from tests.train.helpers import read_metrics, tiny_overrides, wait_for_step

pytestmark = pytest.mark.slow
STEPS = 30


def refused_by(first, second_args: list[str], command: str, what: str, where: Path) -> str:
    """Run the second job while `first` is stopped holding `where`; it must end with the one line
    naming `first`, having changed nothing below `where`'s parent."""
    before = snapshot(where.parent)
    TALLY["concurrent writers tried"] += 1
    line = error_line(finish(faulty_cli(second_args)), command)
    assert f"error: {what} {where} is being written by another job (pid {first.pid} on host " in (
        line
    ), line
    assert f"`scone-jax {command} " in line and " UTC; lock " in line, line
    assert_intact(before)
    assert snapshot(where.parent).keys() == before.keys()  # nothing added either
    TALLY["concurrent writers refused"] += 1
    return line


def go_on(proc) -> None:
    os.kill(proc.pid, signal.SIGCONT)


def assert_complete_run(run: Path, steps: int) -> None:
    assert [r["step"] for r in read_metrics(run)] == list(range(1, steps + 1)), (
        "steps missing or written twice in metrics.jsonl"
    )
    assert (run / "final_eval.json").is_file() and (run / "checkpoints" / str(steps)).is_dir()


def test_a_second_train_on_a_run_dir_in_use_is_refused(markov_dataset, tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "tiny",
        *tiny_overrides(markov_dataset.path, run, STEPS, **{"train.eval_every": 10}),
    ]
    first = faulty_cli(args, stop_after_call=("scone_jax.train.loop.evaluate", 1))  # at step 10
    wait_for_stop(first)
    refused_by(first, args, "train", "run_dir", run)
    go_on(first)
    done = finish(first)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "could not find" not in done.stderr  # no second checkpoint manager raced this one
    assert_complete_run(run, STEPS)
    assert [r["step"] for r in read_metrics(run, "eval")] == [10, 20, 30]


def test_a_holder_killed_with_sigkill_blocks_no_rerun(markov_dataset, tmp_path, rng):
    run = tmp_path / "run"
    args = ["train", "tiny", *tiny_overrides(markov_dataset.path, run, STEPS)]
    first = faulty_cli(args)
    wait_for_step(run, int(rng.integers(6, STEPS - 5)), first)  # past its checkpoint at step 5
    first.kill()
    finish(first)
    TALLY["faults injected"] += 1
    assert (run.parent / ".run.lock").exists()  # what the dead holder left ...
    rerun = finish(faulty_cli(args))  # ... blocks nothing, at once
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming at step" in rerun.stdout
    TALLY["restarts survived"] += 1
    assert_complete_run(run, STEPS)
    assert not (run.parent / ".run.lock").exists()  # released cleanly this time


def test_a_second_export_to_a_table_in_use_is_refused(scone_artifacts, tmp_path):
    table = tmp_path / "table"
    args = ["export", str(scone_artifacts["run"]), "--out", str(table), "--range-rows", "500"]
    args += ["--no-progress"]
    assert open_table(str(scone_artifacts["table"]), "host").num_rows > 500  # several ranges
    first = faulty_cli(args, stop_after_call=("scone_jax.export.table.write_json", 1))
    wait_for_stop(first)  # one range written into table.partial
    refused_by(first, args, "export", "--out", table)
    go_on(first)
    done = finish(first)
    assert done.returncode == 0, done.stderr[-3000:]
    # complete, and the very table of the same export never interrupted (same checkpoint, ranges)
    reference = open_table(str(scone_artifacts["table"]), "host").meta["checksum"]
    assert open_table(str(table), "host").meta["checksum"] == reference
    assert not (tmp_path / "table.partial").exists()


def test_a_second_sweep_on_a_sweep_dir_in_use_is_refused(markov_dataset, tmp_path):
    overrides = {
        key: yaml.safe_load(value)
        for key, value in (
            a.split("=", 1) for a in tiny_overrides(markov_dataset.path, tmp_path, 10)
        )
        if key != "run_dir"
    }
    spec = {
        "name": "twice",
        "config": "tiny",
        "overrides": overrides,
        "points": {"a": {"train.seed": 1}, "b": {"train.seed": 2}},
    }
    (tmp_path / "twice.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "sweep"
    args = ["sweep", str(tmp_path / "twice.yaml"), "--out", str(out)]
    first = faulty_cli(args, stop_after_call=("scone_jax.sweep.runner._run_logged", 1))
    wait_for_stop(first)  # point a trained, point b not started
    refused_by(first, args, "sweep", "sweep directory --out", out)
    go_on(first)
    done = finish(first)
    assert done.returncode == 0, done.stderr[-3000:]
    points = sorted(p for p in (out / "points").iterdir() if p.is_dir())
    assert [p.name for p in points] == ["a", "b"]
    for point in points:
        assert_complete_run(point, 10)
