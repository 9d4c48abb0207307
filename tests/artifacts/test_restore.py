"""What an export records of its checkpoint: kept by what cannot change the parameters, changed
by what can."""

import dataclasses
import json
import shutil

import numpy as np

from scone_jax.artifacts.restore import checkpoint_fingerprint, load_run_params
from scone_jax.artifacts.run_dir import CONFIG_FILE, RUN_INFO_FILE, load_run_config
from scone_jax.config import load_config
from scone_jax.export.table import export_table
from scone_jax.serve.engine import engine_from_run
from scone_jax.train.loop import train
from tests.scone_run import train_scone_run


def test_the_fingerprint_follows_the_parameters_not_the_files():
    cfg = load_config("tiny_scone")
    info = {"dataset": "/a/ds", "fgram_set": "/a/fg", "tokenizer_sha256": "t", "run_id": "r1"}
    base = checkpoint_fingerprint(cfg, info, 10)
    kept = [
        (dataclasses.replace(cfg, run_dir="elsewhere"), info, 10),
        (
            dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, log_every=3)),
            info,
            10,
        ),
        (cfg, {**info, "dataset": "/b/ds", "fgram_set": "/b/fg"}, 10),
    ]
    changed = [
        (dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=1)), info, 10),
        (cfg, {**info, "tokenizer_sha256": "u"}, 10),
        (cfg, {**info, "run_id": "r2"}, 10),  # the same config trained again
        (cfg, info, 11),
    ]
    assert all(checkpoint_fingerprint(*args) == base for args in kept)
    assert len({base, *(checkpoint_fingerprint(*args) for args in changed)}) == 5


def test_a_table_stays_usable_after_a_rerun_with_another_cadence_and_in_a_copied_run(tmp_path):
    """A finished run started again (a no-op that saves its config again, here with another
    log interval) and a copy of the run resumed in its new place still serve the table exported
    before."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed {seed}")
    run_dir = train_scone_run(tmp_path, seed, steps=4)
    export_table(run_dir, str(tmp_path / "table"), progress=False)
    before = load_run_params(run_dir).fingerprint
    saved = (run_dir / CONFIG_FILE).read_bytes()
    drawn = json.loads((run_dir / RUN_INFO_FILE).read_text())["run_id"]
    train(load_config(run_dir / CONFIG_FILE, ["train.log_every=3"]))
    assert (run_dir / CONFIG_FILE).read_bytes() != saved  # the rerun did save its config
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    train(load_config(copy / CONFIG_FILE, [f"run_dir={copy}"]))
    for directory in (run_dir, copy):
        assert json.loads((directory / RUN_INFO_FILE).read_text())["run_id"] == drawn
        assert load_run_params(directory).fingerprint == before
        engine_from_run(directory, str(tmp_path / "table"), "host")  # refuses another checkpoint
    assert load_run_config(copy).run_dir == str(copy)
