"""Corruption: one flipped byte in a checkpoint, an f-gram set, a tokenized dataset or a table
is found on open, with a one-line error naming the damaged file; training resumes from the
newest intact checkpoint instead."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import DAMAGED_DIR
from scone_jax.artifacts.restore import load_run_params
from scone_jax.checksums import MANIFEST
from scone_jax.cli.main import main
from scone_jax.config import load_config
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.errors import UserError
from scone_jax.fgrams.store import FILES as FGRAM_SET_FILES
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tags_for_dataset
from scone_jax.serve.tables import open_table
from scone_jax.train.loop import train
from tests.reliability.faults import (
    TALLY,
    copy_run,
    files_below,
    flip_byte,
    last_line,
    pick,
    snapshot,
)
from tests.train.helpers import losses, read_metrics

pytestmark = pytest.mark.slow
TRIALS = 4  # random files flipped per artifact kind


def one_line_error(capsys, code: int, command: str) -> str:
    """The CLI's error line, after checking it is the only thing that went wrong."""
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    line = last_line(err)
    assert line.startswith(f"scone-jax {command}: error: "), line
    return line


def params_of(run_dir, step):
    return jax.tree.leaves(jax.device_get(load_run_params(run_dir, step).params))


def test_a_damaged_checkpoint_is_refused_by_eval_and_skipped_by_training(
    scone_artifacts, tmp_path, rng, capsys
):
    source = scone_artifacts["run"]
    for trial in range(TRIALS):
        run = tmp_path / f"eval_{trial}"
        shutil.copytree(source, run)
        victim = pick(rng, files_below(run / "checkpoints" / "8"))
        offset = flip_byte(victim, rng)
        line = one_line_error(capsys, main(["eval", str(run)]), "eval")
        assert str(victim) in line, f"flipped byte {offset} of {victim}: {line}"
        TALLY["damaged artifacts detected"] += 1

    run = copy_run(source, tmp_path / "resume")
    victim = pick(rng, files_below(run / "checkpoints" / "8"))
    flip_byte(victim, rng)
    summary = train(load_config(run / "config.yaml"))
    err = capsys.readouterr().err
    assert f"warning: checkpoint 8 is damaged ({victim}" in err, err[-2000:]
    assert summary["start_step"] == 5 and summary["end_step"] == 8
    TALLY["damaged artifacts detected"] += 1
    TALLY["restarts survived"] += 1
    assert [p.name.split(".")[0] for p in (run / DAMAGED_DIR).iterdir()] == ["8"]
    assert sorted(r["step"] for r in read_metrics(run)) == list(
        range(1, 9)
    )  # no gaps, no duplicates
    assert losses(run) == losses(source)
    for a, b in zip(params_of(run, 8), params_of(source, 8), strict=True):
        np.testing.assert_array_equal(a, b)  # retrained from step 5: bitwise the same


def test_when_every_checkpoint_is_damaged_training_stops_and_moves_nothing(
    scone_artifacts, tmp_path, rng
):
    run = copy_run(scone_artifacts["run"], tmp_path / "run")
    for step in (5, 8):
        flip_byte(pick(rng, files_below(run / "checkpoints" / str(step))), rng)
    before = snapshot(run / "checkpoints")
    with pytest.raises(UserError, match="every checkpoint in .* is damaged"):
        train(load_config(run / "config.yaml"))
    TALLY["damaged artifacts detected"] += 2
    assert snapshot(run / "checkpoints") == before and not (run / DAMAGED_DIR).exists()


def test_a_damaged_fgram_set_is_refused(scone_artifacts, tmp_path, rng, capsys):
    for trial in range(TRIALS):
        fgrams = tmp_path / f"set_{trial}"
        shutil.copytree(scone_artifacts["fgrams"], fgrams)
        victim = fgrams / pick(rng, FGRAM_SET_FILES)
        flip_byte(victim, rng)
        with pytest.raises(UserError, match=str(victim)):
            FgramSet.load(fgrams)
        line = one_line_error(capsys, main(["fgrams", "stats", str(fgrams)]), "fgrams")
        assert str(victim) in line, line
        TALLY["damaged artifacts detected"] += 1


def test_a_damaged_dataset_is_refused(scone_artifacts, tmp_path, rng, capsys):
    run = scone_artifacts["run"]
    for trial in range(TRIALS):
        dataset = tmp_path / f"data_{trial}"
        shutil.copytree(scone_artifacts["dataset"], dataset, ignore=shutil.ignore_patterns("tags"))
        victim = pick(rng, files_below(dataset))
        flip_byte(victim, rng)
        with pytest.raises(UserError, match=str(victim)):
            TokenizedDataset.open(dataset)
        code = main(
            [
                "train",
                str(run / "config.yaml"),
                f"data.dataset={dataset}",
                f"run_dir={tmp_path / 'never'}",
            ]
        )
        assert str(victim) in one_line_error(capsys, code, "train")
        assert not (tmp_path / "never").exists()
        TALLY["damaged artifacts detected"] += 1


def test_damaged_tags_beside_a_dataset_are_recomputed(scone_artifacts, tmp_path, rng, capsys):
    dataset = tmp_path / "data"
    shutil.copytree(scone_artifacts["dataset"], dataset)
    fgrams = FgramSet.load(scone_artifacts["fgrams"])
    ids, lengths = (np.array(a) for a in tags_for_dataset(dataset, fgrams, progress=False))
    victim = pick(rng, [p for p in files_below(dataset / "tags") if p.name != MANIFEST])
    flip_byte(victim, rng)
    again = tags_for_dataset(dataset, fgrams, progress=False)
    assert f"warning: {victim}" in capsys.readouterr().err
    np.testing.assert_array_equal(again[0], ids)
    np.testing.assert_array_equal(again[1], lengths)
    TALLY["damaged artifacts detected"] += 1


def test_a_damaged_table_is_refused(scone_artifacts, tmp_path, rng):
    for trial in range(TRIALS):
        table = tmp_path / f"table_{trial}"
        shutil.copytree(scone_artifacts["table"], table)
        victim = pick(rng, files_below(table))
        flip_byte(victim, rng)
        for tier in ("host", "disk"):
            with pytest.raises(UserError) as caught:
                opened = open_table(str(table), tier)
                opened.gather(
                    np.arange(opened.num_rows)
                )  # the disk tier checks each chunk as it reads it
            message = str(caught.value)
            assert "\n" not in message and str(victim) in message, message
        TALLY["damaged artifacts detected"] += 1
