"""Gradient accumulation: a step run as M microbatches gives the whole batch's losses and
parameters (baseline and SCONE, on a data x fsdp x tensor mesh), and a microbatched run resumes
exactly (with its training noise); scanned, rematerialized layers train like unrolled ones on
that mesh."""

import shutil

import jax
import numpy as np
import pytest

from scone_jax.artifacts.restore import load_run_params
from scone_jax.artifacts.run_dir import FINAL_EVAL_FILE, checkpoints_dir
from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.model.stack import stack_layers
from scone_jax.train.loop import train
from tests.train.helpers import SCONE_OVERRIDES, losses, tiny_overrides

MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "train.batch_size": 16}
STEPS = 6


def run(dataset, run_dir, steps=STEPS, **extra):
    overrides = tiny_overrides(dataset, run_dir, steps, **{**MESH, "checkpoint.every": 3, **extra})
    train(load_config("tiny", overrides))
    return losses(run_dir), jax.device_get(load_run_params(run_dir).params)


def assert_params_close(a, b, rtol, atol, stray=0.0, stray_atol=0.0):
    """Every element within rtol/atol, except at most a fraction `stray` of each leaf, which
    must still be within `stray_atol`."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        far = ~np.isclose(x, y, rtol=rtol, atol=atol)
        assert far.mean() <= stray, f"{far.sum()} of {far.size} elements differ"
        np.testing.assert_allclose(x, y, rtol=0, atol=max(atol, stray_atol) + rtol * abs(y).max())


@pytest.mark.parametrize(
    "scone, microbatches, suffix_rows", [(False, 4, False), (True, 2, False), (True, 2, True)]
)
def test_microbatches_give_the_whole_batchs_losses_and_parameters(
    scone, microbatches, suffix_rows, markov_dataset, tmp_path
):
    extra = SCONE_OVERRIDES if scone else {}
    if suffix_rows:  # a [B, T, K - 1] index, split by rows like the rest
        extra = {**extra, "fgrams.suffix_rows": "true"}
    whole_losses, whole = run(markov_dataset.path, tmp_path / "whole", **extra)
    micro_losses, micro = run(
        markov_dataset.path, tmp_path / "micro", **extra, **{"train.microbatches": microbatches}
    )
    assert sorted(micro_losses) == list(range(1, STEPS + 1))
    np.testing.assert_allclose(
        [micro_losses[s] for s in sorted(whole_losses)],
        [whole_losses[s] for s in sorted(whole_losses)],
        rtol=1e-5,
    )  # the same rows, in the same order, at every step
    # atol: parameters whose gradient is zero up to rounding (the attention key bias) take Adam
    # steps of that rounding, a few 1e-6; every other parameter agrees to 1e-4 of itself, but for
    # rare elements whose gradient is a sum that nearly cancels (a position embedding's, seen
    # 2.8e-5 off at seed 949164869): Adam divides it by its own small scale, so summing it in
    # another order moves them by up to a few % of one step (lr 5.5e-3)
    assert_params_close(micro, whole, rtol=1e-4, atol=2e-5, stray=1e-3, stray_atol=3e-4)
    if scone:  # the f-gram model trained through the microbatches' forests, with embedding
        # dropout: each microbatch draws its own mask, and a resume draws the same ones
        noisy = {**extra, "train.microbatches": microbatches, "fgrams.embed_drop_rate": 0.3}
        noisy_losses, noisy_params = run(markov_dataset.path, tmp_path / "noisy", **noisy)
        assert noisy_losses[STEPS] != micro_losses[STEPS]  # step 1 has a zero gate: no noise
        resumed = tmp_path / "resumed"
        shutil.copytree(tmp_path / "noisy", resumed)
        for step_dir in checkpoints_dir(resumed).iterdir():
            if step_dir.name.isdigit() and int(step_dir.name) > 3:
                shutil.rmtree(step_dir)
        (resumed / FINAL_EVAL_FILE).unlink()
        resumed_losses, resumed_params = run(markov_dataset.path, resumed, **noisy)
        assert resumed_losses == noisy_losses  # exactly: steps 4..6 recomputed from step 3
        assert_params_close(resumed_params, noisy_params, rtol=0, atol=0)


def test_scanned_rematerialized_layers_train_like_unrolled_ones_on_the_mesh(
    markov_dataset, tmp_path
):
    """Backbone and f-gram model scanned (stacked parameters sharded by the rules table) and
    rematerialized, against the unrolled model: the same losses and parameters."""
    plain_losses, plain = run(markov_dataset.path, tmp_path / "plain", 3, **SCONE_OVERRIDES)
    scanned_losses, scanned = run(
        markov_dataset.path,
        tmp_path / "scanned",
        3,
        **SCONE_OVERRIDES,
        **{"model.scan_layers": "true", "model.remat": "block"},
    )
    np.testing.assert_allclose(
        [scanned_losses[s] for s in (1, 2, 3)], [plain_losses[s] for s in (1, 2, 3)], rtol=1e-5
    )
    stacked = {part: stack_layers(plain[part]) for part in ("backbone", "fgram")}
    # a scan sums in another order than the unrolled layers: Adam's normalized steps make that
    # rounding up to ~3e-5 on a parameter after 3 steps of lr 0.01 (one step moves it ~1e-2)
    assert_params_close(scanned, stacked, rtol=1e-4, atol=1e-4)


def test_microbatches_that_do_not_divide_a_data_shard_are_one_line(markov_dataset, tmp_path):
    with pytest.raises(
        UserError, match=r"train.microbatches=4 does not divide the 2 rows of each data shard"
    ):
        train(
            load_config(
                "tiny",
                tiny_overrides(
                    markov_dataset.path,
                    tmp_path / "run",
                    2,
                    **{"mesh.data": 4, "mesh.fsdp": 1, "mesh.tensor": 2, "train.microbatches": 4},
                ),
            )
        )
    with pytest.raises(UserError, match=r"train.microbatches=3 \(expected a divisor of"):
        load_config(
            "tiny",
            tiny_overrides(markov_dataset.path, tmp_path / "r", 2, **{"train.microbatches": 3}),
        )
