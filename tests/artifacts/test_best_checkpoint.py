"""checkpoint.keep_best: the parameters of the lowest eval loss are kept, survive a resume (also
one whose last best never committed), and are what `--step best` evaluates and exports."""

import json
import math
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scone_jax.artifacts.best import BestCheckpoint
from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.restore import load_run_params
from scone_jax.artifacts.run_dir import (
    BEST_RECORD_FILE,
    CHECKPOINTS_DIR,
    best_checkpoint_dir,
    checkpoints_dir,
    committed_steps,
)
from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.evaluation.run import evaluate_run
from scone_jax.export.backbone import export_backbone
from scone_jax.train.loop import train
from tests.train.helpers import cli, cli_run, read_metrics, tiny_overrides, wait_for_step

EVAL_SETS = {"heldout": [], "other": []}
EVAL_BATCHES = 4


def kept_steps(run_dir) -> list[int]:
    return committed_steps(best_checkpoint_dir(run_dir))


def offer_all(best: BestCheckpoint, losses: dict[int, float], rng) -> dict[int, np.ndarray]:
    states = {}
    for step, loss in losses.items():
        states[step] = rng.normal(size=(3, 2)).astype(np.float32)
        state = {"params": {"w": jnp.asarray(states[step])}, "step": jnp.int32(step)}
        best.offer(step, {"heldout": {"loss": loss}, "other": {"loss": -loss}}, state)
    best.ckpt.wait()
    return states


def saved_tree(directory, step):
    ckpt = Checkpointer(directory, every=1, keep=1, async_save=False)
    tree = ckpt.saved_tree(step)
    ckpt.close()
    return tree


def restored_w(run_dir, step):
    ckpt = Checkpointer(best_checkpoint_dir(run_dir), every=1, keep=1, async_save=False)
    shapes = {
        "params": {"w": jax.ShapeDtypeStruct((3, 2), jnp.float32)},
        "step": jax.ShapeDtypeStruct((), jnp.int32),
    }
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = ckpt.restore(shapes, jax.tree.map(lambda _: one, shapes), step)
    ckpt.close()
    return np.asarray(state["params"]["w"])


def test_the_lowest_loss_is_kept_and_nan_never_is(tmp_path, rng):
    best = BestCheckpoint(tmp_path, "heldout", EVAL_SETS, EVAL_BATCHES, async_save=True)
    losses = {2: 3.0, 4: 2.0, 6: 2.5, 8: 1.5, 10: 1.7, 12: math.nan, 14: 1.5}
    states = offer_all(best, losses, rng)
    assert best.best_step() == 8 and best.best_loss == 1.5  # a tie keeps the earlier step
    best.close()
    assert kept_steps(tmp_path) == [8]
    np.testing.assert_array_equal(restored_w(tmp_path, 8), states[8])
    record = json.loads((tmp_path / BEST_RECORD_FILE).read_text())
    assert record == {
        "eval_set": "heldout",
        "eval_batches": EVAL_BATCHES,
        "loss_at_step": {"2": 3.0, "4": 2.0, "8": 1.5},
    }


def test_a_resume_takes_the_committed_best_and_ignores_a_save_that_never_committed(tmp_path, rng):
    best = BestCheckpoint(tmp_path, "heldout", EVAL_SETS, EVAL_BATCHES, async_save=False)
    offer_all(best, {2: 3.0, 4: 2.0}, rng)
    best.close()
    # killed after the record of step 6 was written, before its save committed
    record = json.loads((tmp_path / BEST_RECORD_FILE).read_text())
    record["loss_at_step"]["6"] = 1.0
    (tmp_path / BEST_RECORD_FILE).write_text(json.dumps(record))
    resumed = BestCheckpoint(tmp_path, "heldout", EVAL_SETS, EVAL_BATCHES, async_save=False)
    assert resumed.best_loss == 2.0 and resumed.best_step() == 4
    # a replayed eval of the committed best that comes out lower is not saved over it
    offer_all(resumed, {4: 1.9}, rng)
    assert kept_steps(tmp_path) == [4] and resumed.best_loss == 2.0
    states = offer_all(resumed, {5: 2.2, 6: 1.0}, rng)  # the replay saves step 6 after all
    resumed.close()
    assert kept_steps(tmp_path) == [6]
    np.testing.assert_array_equal(restored_w(tmp_path, 6), states[6])
    # losses of another eval set, or over more batches, are not comparable: the first eval of
    # such a resume is a new best
    for eval_set, batches in (("other", EVAL_BATCHES), ("heldout", 2 * EVAL_BATCHES)):
        other = BestCheckpoint(tmp_path, eval_set, EVAL_SETS, batches, async_save=False)
        assert other.best_loss == math.inf and other.best_step() is None
        other.close()


def test_an_unknown_eval_set_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"keep_best=hedlout is not an eval set.*heldout, other"):
        BestCheckpoint(tmp_path, "hedlout", EVAL_SETS, EVAL_BATCHES)


def best_run_overrides(dataset, run_dir, steps=24, **extra):
    return tiny_overrides(
        dataset,
        run_dir,
        steps,
        **{
            "train.eval_every": 2,
            "checkpoint.keep_best": "heldout",
            "checkpoint.every": 2,
            "checkpoint.keep": 100,
            "optim.lr": 0.05,
            **extra,
        },
    )


def test_training_keeps_the_step_of_lowest_heldout_loss_and_step_best_reads_it(
    markov_dataset, tmp_path
):
    run = tmp_path / "run"
    summary = train(load_config("tiny", best_run_overrides(markov_dataset.path, run)))
    evals = {r["step"]: r["loss"] for r in read_metrics(run, "eval") if r["set"] == "heldout"}
    lowest = min(evals, key=lambda s: (evals[s], s))  # brute force: the first lowest
    print("held-out loss by step:", evals)
    assert summary["best"]["step"] == lowest and kept_steps(run) == [lowest]
    # the parameters only: the optimizer state, twice their size, is never read from a best
    kept, regular = (
        saved_tree(directory, lowest)
        for directory in (best_checkpoint_dir(run), checkpoints_dir(run))
    )
    assert set(kept) == {"params", "step"} and "opt_state" in regular
    assert jax.tree.structure(kept["params"]) == jax.tree.structure(regular["params"])
    same_step = load_run_params(run, lowest)
    # the held-out loss here often falls to the last step, so "best" must not be able to read
    # the regular checkpoints: every read below comes from best_checkpoint/
    shutil.rmtree(checkpoints_dir(run))
    best = load_run_params(run, "best")
    assert best.step == lowest
    assert jax.tree.all(
        jax.tree.map(lambda a, b: bool((a == b).all()), best.params, same_step.params)
    )
    out = evaluate_run(run, step="best")
    assert out["step"] == lowest
    np.testing.assert_allclose(out["results"]["heldout"]["loss"], evals[lowest], rtol=1e-6)
    assert export_backbone(run, tmp_path / "backbone", "best")["checkpoint_step"] == lowest
    res = cli_run(["eval", str(run), "--step", "best", "--json"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["step"] == lowest


def test_a_killed_and_resumed_run_keeps_the_same_best(markov_dataset, tmp_path):
    straight = tmp_path / "straight"
    train(load_config("tiny", best_run_overrides(markov_dataset.path, straight)))
    args = ["train", "tiny", *best_run_overrides(markov_dataset.path, tmp_path / "killed")]
    args += ["checkpoint.every=5"]  # resumes behind the last evals: they are replayed
    proc = cli(args)
    wait_for_step(tmp_path / "killed", 13, proc)
    assert proc.poll() is None, "the run ended before the kill"
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    resumed = cli_run(args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "lowest heldout loss" in resumed.stdout and "--step best" in resumed.stdout
    assert kept_steps(tmp_path / "killed") == kept_steps(straight)
    for name in (straight, tmp_path / "killed"):
        assert (name / BEST_RECORD_FILE).is_file()
    assert json.loads((tmp_path / "killed" / BEST_RECORD_FILE).read_text()) == json.loads(
        (straight / BEST_RECORD_FILE).read_text()
    )
    a, b = load_run_params(straight, "best"), load_run_params(tmp_path / "killed", "best")
    assert jax.tree.all(jax.tree.map(lambda x, y: bool((x == y).all()), a.params, b.params))


def test_keep_best_needs_evals_and_step_best_needs_a_kept_best(markov_dataset, tmp_path):
    with pytest.raises(UserError, match=r"keep_best=heldout needs train.eval_every > 0"):
        load_config(
            "tiny",
            tiny_overrides(
                markov_dataset.path, tmp_path / "a", **{"checkpoint.keep_best": "heldout"}
            ),
        )
    res = cli_run(
        [
            "train",
            "tiny",
            *best_run_overrides(
                markov_dataset.path, tmp_path / "b", **{"checkpoint.keep_best": "x"}
            ),
        ]
    )
    assert res.returncode == 2 and "checkpoint.keep_best=x is not an eval set" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "b").exists()
    train(load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "c", steps=5)))
    res = cli_run(["eval", str(tmp_path / "c"), "--step", "best"])
    assert res.returncode == 2 and "has no best checkpoint" in res.stderr
    assert "checkpoint.keep_best=heldout" in res.stderr.strip().splitlines()[-1]
    res = cli_run(["eval", str(tmp_path / "c"), "--step", "latest"])
    assert res.returncode == 2 and "'latest' (expected a step number, or best" in res.stderr


def test_each_regular_checkpoint_waits_for_the_best_save_in_flight(
    markov_dataset, tmp_path, monkeypatch
):
    """A run resumed from a regular checkpoint at R must find every best up to R committed: when
    each regular save starts, the newest best offered at or before it is on disk under its step
    (orbax writes an async save under a temporary name and renames it when it commits). A tiny
    save often commits that fast anyway, so the loop must also be seen waiting before each."""
    run = tmp_path / "run"
    offered, committed_at_save, events = [], {}, []
    real_offer, real_save, real_wait = (
        BestCheckpoint.offer,
        Checkpointer.maybe_save,
        BestCheckpoint.wait,
    )

    def wait(self):
        events.append("wait")
        real_wait(self)

    def offer(self, step, results, state):
        saved = real_offer(self, step, results, state)
        if saved:
            offered.append(step)
        return saved

    def maybe_save(self, step, state, force=False):
        if self.directory.name == CHECKPOINTS_DIR and (force or self.due(step)):
            committed_at_save[step] = committed_steps(best_checkpoint_dir(run))
            events.append("save")
        return real_save(self, step, state, force)

    monkeypatch.setattr(BestCheckpoint, "offer", offer)
    monkeypatch.setattr(Checkpointer, "maybe_save", maybe_save)
    monkeypatch.setattr(BestCheckpoint, "wait", wait)
    train(load_config("tiny", best_run_overrides(markov_dataset.path, run, steps=9)))
    assert events == ["wait", "save"] * 5
    print("bests saved:", offered, "best on disk at each regular save:", committed_at_save)
    assert sorted(committed_at_save) == [2, 4, 6, 8, 9] and offered
    for step, on_disk in committed_at_save.items():
        newest = max((s for s in offered if s <= step), default=None)
        assert on_disk[-1:] == ([newest] if newest is not None else [])
