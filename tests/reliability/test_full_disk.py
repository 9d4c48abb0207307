"""Full disk and write errors: a write the storage refuses stops the command with one line naming
what could not be written, and every artifact written before stays byte-identical.

Two ways to refuse: `disk_full` fails Python-level writes with ENOSPC in this process;
`faulty_cli(file_size_limit=...)` lowers RLIMIT_FSIZE in another, so the kernel refuses (EFBIG)
native writes too: orbax's array data and the table's rows, written by tensorstore."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import DAMAGED_DIR
from scone_jax.artifacts.run_dir import checkpoints_dir, committed_steps
from scone_jax.cli.main import main
from scone_jax.config import load_config
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.errors import UserError
from scone_jax.fgrams.store import FgramSet
from scone_jax.serve.tables import open_table
from scone_jax.train.loop import train
from tests.reliability.faults import (
    TALLY,
    assert_intact,
    disk_full,
    error_line,
    faulty_cli,
    finish,
    last_line,
    snapshot,
)
from tests.train.helpers import losses, read_metrics, tiny_overrides

pytestmark = pytest.mark.slow
FILE_SIZE_LIMIT = (
    40_000  # above every small file a command writes, below a checkpoint's or table's data
)
ENOSPC = r"\[Errno 28\] No space left on device"
EFBIG = "File too large"


def refused_cleanly(code: int, capsys, command: str, pattern: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    line = last_line(err)
    assert re.match(f"scone-jax {command}: error: cannot write {pattern}", line), line
    return line


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_full_disk_during_a_checkpoint_save(markov_dataset, tmp_path, async_save):
    run = tmp_path / "run"
    cfg = load_config(
        "tiny",
        tiny_overrides(markov_dataset.path, run, 10, **{"checkpoint.async_save": async_save}),
    )

    with (
        disk_full(run / "checkpoints" / "10"),
        pytest.raises(UserError) as refused,
    ):  # orbax's metadata files
        train(cfg)
    assert re.fullmatch(
        f"cannot write a checkpoint in {run}/checkpoints: {ENOSPC}: '{run}/checkpoints/10.*'",
        str(refused.value),
    ), str(refused.value)
    assert committed_steps(checkpoints_dir(run)) == [5]
    before = snapshot(run / "checkpoints" / "5", markov_dataset.path)

    result = finish(
        faulty_cli(["train", str(run / "config.yaml")], file_size_limit=FILE_SIZE_LIMIT)
    )
    line = error_line(result, "train")  # the array data: tensorstore's writes refused by the kernel
    assert (
        line.startswith(f"scone-jax train: error: cannot write a checkpoint in {run}/checkpoints:")
        and EFBIG in line
    )
    TALLY["faults injected"] += 1
    assert_intact(before)

    summary = train(cfg)  # space again: resumes from the last checkpoint that was saved
    assert summary["start_step"] == 5 and summary["end_step"] == 10
    TALLY["restarts survived"] += 2
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 11)) and not (
        run / DAMAGED_DIR
    ).exists()


def test_a_full_disk_while_appending_metrics(markov_dataset, tmp_path):
    run = tmp_path / "run"
    cfg = load_config("tiny", tiny_overrides(markov_dataset.path, run, 12))
    with disk_full(run / "metrics.jsonl", free=2000), pytest.raises(UserError) as refused:
        train(cfg)
    assert re.fullmatch(
        f"cannot write {run}/metrics.jsonl: {ENOSPC}: '{run}/metrics.jsonl'", str(refused.value)
    )
    written = losses(run)  # the lines written before the disk filled (a torn last one is dropped)
    assert 0 < len(written) < 12 and sorted(written) == list(range(1, len(written) + 1))
    before = snapshot(run / "checkpoints")

    summary = train(cfg)
    TALLY["restarts survived"] += 1
    assert summary["end_step"] == 12 and [r["step"] for r in read_metrics(run)] == list(
        range(1, 13)
    )
    assert all(
        losses(run)[step] == loss for step, loss in written.items()
    )  # kept, or redone identically
    assert_intact(before)


def test_a_full_disk_while_writing_a_dataset_or_an_fgram_set(
    scone_artifacts, tmp_path, capsys, rng
):
    words = "the cat sat on a mat and then ran far away from the dog which barked at night".split()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(rng.choice(words, 200)) for _ in range(40)))
    datasets = tmp_path / "datasets"
    tokenize = [
        "tokenize",
        "--corpus",
        str(corpus),
        "--doc-split",
        "blank_line",
        "--vocab-size",
        "300",
        "--no-progress",
        "--out",
    ]
    assert main([*tokenize, str(datasets / "first")]) == 0
    before = snapshot(datasets)
    with disk_full(datasets, free=2000):
        code = main([*tokenize, str(datasets / "second")])
    refused_cleanly(code, capsys, "tokenize", f"{datasets}/second: {ENOSPC}")
    assert_intact(before)
    assert sorted(p.name for p in datasets.iterdir()) == [
        "first"
    ]  # no partial dataset, no temporary sibling
    TokenizedDataset.open(datasets / "first")

    sets = tmp_path / "sets"
    shutil.copytree(scone_artifacts["fgrams"], sets / "fgrams")
    before = snapshot(sets)
    with disk_full(sets, free=5000):
        code = main(
            [
                "fgrams",
                "build",
                str(scone_artifacts["dataset"]),
                "--out",
                str(sets / "fgrams"),
                "--overwrite",
                "--max-n",
                "3",
                "--num-fgrams",
                "500",
                "--min-count",
                "2",
                "--no-progress",
            ]
        )
    refused_cleanly(code, capsys, "fgrams", f"{sets}/fgrams: {ENOSPC}")
    assert_intact(before)
    assert sorted(p.name for p in sets.iterdir()) == ["fgrams"]
    FgramSet.load(sets / "fgrams")


def test_a_write_error_during_a_table_export_keeps_the_previous_table(scone_artifacts, tmp_path):
    table = tmp_path / "table"
    shutil.copytree(scone_artifacts["table"], table)
    before = snapshot(table)
    args = [
        "export",
        str(scone_artifacts["run"]),
        "--out",
        str(table),
        "--overwrite",
        "--dtype",
        "bfloat16",
        "--range-rows",
        "100",
        "--no-progress",
    ]
    line = error_line(finish(faulty_cli(args, file_size_limit=FILE_SIZE_LIMIT)), "export")
    assert (
        line.startswith(f"scone-jax export: error: cannot write table {table}.partial:")
        and EFBIG in line
    ), line
    TALLY["faults injected"] += 1
    assert_intact(before)
    assert open_table(str(table), "host").meta["dtype"] == "float32"

    result = finish(
        faulty_cli(args)
    )  # space again: the finished ranges are kept, the rest exported
    assert result.returncode == 0, result.stderr[-2000:]
    TALLY["restarts survived"] += 1
    new = open_table(str(table), "host")
    assert (
        new.meta["dtype"] == "bfloat16" and np.isfinite(new.gather(np.arange(new.num_rows))).all()
    )
