"""SIGTERM (a scheduler's preemption, `kill`) outside the training loop: every command stops
with status 143 and removes what it had half written; a run stopped in set-up, by SIGTERM or
by SIGKILL, keeps what set-up finished and is started again by the same command."""

from __future__ import annotations

import signal

import pytest

from scone_jax.artifacts.run_dir import FINAL_EVAL_FILE
from tests.reliability.faults import faulty_cli, finish, wait_for_hang
from tests.train.helpers import SCONE_OVERRIDES, tiny_overrides

pytestmark = pytest.mark.slow

# inside the f-gram set's atomic_dir: its temporary directory exists when the signal comes
IN_FGRAM_SET = ("scone_jax.fgrams.stats.compute_stats", 1)


def scone_train(dataset, run_dir):
    return ["train", "tiny", *tiny_overrides(dataset, run_dir, 4, **SCONE_OVERRIDES)]


def tokenize_args(tmp_path) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i} says words and more words" for i in range(300)))
    args = ["tokenize", "--corpus", str(corpus), "--doc-split", "blank_line"]
    return args + ["--vocab-size", "300", "--out", str(tmp_path / "ds")]


def test_sigterm_while_tokenizing_removes_the_partial_dataset(tmp_path):
    args = tokenize_args(tmp_path)
    proc = faulty_cli(args, devices=1, hang_after_call=("scone_jax.data.tokenize.progress_bar", 1))
    wait_for_hang(proc)
    assert any(p.name.startswith(".ds.tmp-") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    result = finish(proc)
    assert result.returncode == 143, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "scone-jax tokenize: terminated (SIGTERM)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_tokenize_killed_outright_leaves_a_temporary_that_the_rerun_removes(tmp_path):
    args = tokenize_args(tmp_path)
    proc = faulty_cli(args, devices=1, hang_after_call=("scone_jax.data.tokenize.progress_bar", 1))
    wait_for_hang(proc)
    proc.send_signal(signal.SIGKILL)
    assert finish(proc).returncode == -signal.SIGKILL
    [left] = [p for p in tmp_path.iterdir() if p.name.startswith(".ds.tmp-")]
    again = finish(faulty_cli(args, devices=1))
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"removed {left}, which an interrupted write of" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "ds"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_run_stopped_in_set_up_is_started_again_by_the_same_command(
    markov_dataset, tmp_path, sig
):
    run_dir = tmp_path / "run"
    proc = faulty_cli(
        scone_train(markov_dataset.path, run_dir), devices=1, hang_after_call=IN_FGRAM_SET
    )
    wait_for_hang(proc)
    proc.send_signal(sig)
    stopped = finish(proc)
    assert (run_dir / "config.yaml").is_file()  # the same command goes on from what is done
    temporaries = [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]
    if sig == signal.SIGTERM:  # a preemption: the half-written set is removed at once
        assert stopped.returncode == 143, stopped.stderr[-2000:]
        assert "terminated (SIGTERM)" in stopped.stderr.strip().splitlines()[-1]
        assert not temporaries
    else:  # killed outright: the rerun removes what the kill left
        assert stopped.returncode == -signal.SIGKILL
        assert [t.startswith(".fgrams.tmp-") for t in temporaries] == [True]
    again = finish(faulty_cli(scone_train(markov_dataset.path, run_dir), devices=1))
    assert again.returncode == 0, again.stderr[-2000:]
    assert (run_dir / FINAL_EVAL_FILE).is_file()
    assert not [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]
