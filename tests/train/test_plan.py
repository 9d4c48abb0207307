"""`scone-jax plan`: the real train step compiled for N devices without allocating the model;
the temporaries fall as microbatches grow, and a plan that cannot compile is one line naming the
setting. Rematerialization and the paper presets: test_plan_presets.py (make test-plans)."""

import json
import os
import subprocess
import sys

import jax
import pytest

from scone_jax.config import load_config
from scone_jax.errors import UserError
from scone_jax.train.plan import plan_train_step
from tests.train.helpers import REPO

SMALL = [  # big enough that activations outweigh the weights, small enough to compile fast
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.vocab_size=512",
    "model.max_seq_len=256",
    "data.seq_len=256",
    "train.batch_size=32",
    "mesh.data=2",
    "mesh.tensor=4",
]


def plan(*overrides, preset="tiny"):
    return plan_train_step(load_config(preset, [*SMALL, *overrides]), jax.devices()[:8], 80.0)


def test_temporaries_fall_as_microbatches_grow():
    temp = {m: plan(f"train.microbatches={m}")["per_device_bytes"]["temp"] for m in (1, 4, 16)}
    assert temp[16] < temp[4] < temp[1], temp


def test_a_scone_plan_sizes_the_forest_per_microbatch_and_counts_both_models():
    whole, micro = plan(preset="tiny_scone"), plan("train.microbatches=4", preset="tiny_scone")
    nodes = whole["forest_shapes"]["fgram_nodes"]
    assert nodes[0] == 2 and micro["forest_shapes"]["fgram_nodes"][0] == 4  # groups; microbatches
    baseline = plan()
    assert whole["flops_per_step_counted"] > 1.2 * baseline["flops_per_step_counted"]
    assert micro["per_device_bytes"]["temp"] < whole["per_device_bytes"]["temp"]
    # on a step without loops XLA counts at least our matmuls; it adds the elementwise work,
    # softmax and the forest's masks (2.5x ours at this width), which our count leaves out
    for p in (baseline, whole):
        assert 0.9 < p["flops_per_step"] / p["flops_per_step_counted"] < 4
    peak = whole["per_device_bytes"]
    assert peak["peak"] >= peak["temp"] and whole["fits"]
    # suffix rows: a [B, T, K - 1] index, and forests that also hold the matches' suffixes
    suffix = plan("fgrams.suffix_rows=true", preset="tiny_scone")
    for key in ("fgram_nodes", "fgram_outputs"):
        assert suffix["forest_shapes"][key] > whole["forest_shapes"][key], key
    assert suffix["flops_per_step_counted"] > whole["flops_per_step_counted"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["mesh.data=3"], r"mesh data=3 fsdp=1 tensor=4 needs 12 devices, but 8 are available"),
        (["train.microbatches=32"], r"train.microbatches=32 does not divide the 16 rows"),
    ],
)
def test_a_plan_that_cannot_compile_is_one_line_naming_the_setting(overrides, message):
    with pytest.raises(UserError, match=message):
        plan(*overrides)


def test_the_command_plans_on_fake_devices_in_a_subprocess_and_prints_json():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    out = subprocess.run(
        [sys.executable, "-m", "scone_jax.cli.main", "plan", "tiny", *SMALL, "--devices", "8"]
        + ["--device-memory", "0.001", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["devices"] == 8 and result["mesh"] == {"data": 2, "fsdp": 1, "tensor": 4}
    assert set(result["per_device_bytes"]) == {"arguments", "outputs", "temp", "peak"}
    assert result["fits"] is False  # 1 MiB per device holds nothing of it
    assert result["compile_s"] > 0 and result["flops_per_step"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "scone_jax.cli.main", "plan", "tiny", "model.remat=most"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "scone-jax plan: error: model.remat='most' (expected one of ('none', 'dots', 'block'))"
    ]
