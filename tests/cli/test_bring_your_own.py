"""README's "Bring your own tokenizer, data and checkpoint": every command as written, on a
tokenizer.json trained here and parquet shards written here, then its transformers snippet,
whose logits must be scone-jax's own."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import scone_jax.cli.main as cli_main
from scone_jax.artifacts.restore import host_params, load_run_params
from scone_jax.config import load_config
from scone_jax.data.tokenizer import load_tokenizer
from scone_jax.errors import UserError
from scone_jax.export.table import export_table
from scone_jax.fgrams.store import FgramSet
from scone_jax.fgrams.tag import tag_tokens
from scone_jax.model.build import build_model_fn
from scone_jax.serve.engine import engine_from_run
from scone_jax.train.init_from import initial_state
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import setup_train_state
from tests.data.hf_helpers import random_texts, train_byte_level_bpe
from tests.hf_env import transformers_and_torch

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Bring your own tokenizer, data and checkpoint"


def readme_blocks() -> tuple[list[str], str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    commands = re.search(r"```\n(.*?)```", section, re.S).group(1).splitlines()
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return [c for c in commands if c.startswith("scone-jax ")], python


def users_files(root: Path) -> None:
    """What the user brings: a byte-level BPE tokenizer.json and parquet shards of text."""
    rng = random.Random()
    texts = random_texts(rng, 600, 400)
    train_byte_level_bpe(root / "tokenizer.json", texts, vocab_size=500)
    (root / "shards").mkdir()
    for i in range(2):
        part = texts[i::2]
        pq.write_table(
            pa.table({"text": part, "id": list(range(len(part)))}), root / f"shards/{i}.parquet"
        )


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """The README's commands, run as written in a fresh directory holding the user's files."""
    root = tmp_path_factory.mktemp("byo")
    commands, _ = readme_blocks()
    assert len(commands) == 6
    users_files(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for line in commands:
            assert cli_main.main(shlex.split(line)[1:]) == 0, line
    return root


def test_the_baseline_checkpoint_is_a_gpt2_with_our_logits(flow):
    transformers, torch = transformers_and_torch()
    base = transformers.AutoModelForCausalLM.from_pretrained(flow / "hf/base").eval()
    assert type(base).__name__ == "GPT2LMHeadModel"
    tokens = np.random.default_rng().integers(0, base.config.vocab_size, (2, 24))
    with torch.no_grad():
        expected = base(torch.as_tensor(tokens)).logits.numpy()
    ours = np.asarray(engine_from_run(flow / "runs/base", None).logits(tokens))
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(flow / "hf/base")
    text = "the lazy dog 中文"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == load_tokenizer(flow / "tokenizer.json").encode(text)


def test_the_snippet_adds_the_rows_and_gets_scone_jax_logits(flow, monkeypatch):
    _, torch = transformers_and_torch()
    trace = list((flow / "runs/scone/profile").rglob("*.xplane.pb"))
    assert len(trace) == 1 and trace[0].stat().st_size > 0  # train.profile_steps
    scone = json.loads((flow / "hf/scone/scone.json").read_text())
    assert (
        scone["combine"] == "gated"
        and scone["max_n"] == 5
        and "inputs_embeds" in scone["input_layer"]
    )
    assert not (flow / "hf/scone.table").exists()  # the table computed for the export is gone
    monkeypatch.chdir(flow)
    namespace: dict = {}
    exec(compile(readme_blocks()[1], "README.md", "exec"), namespace)
    ids, match = namespace["ids"], namespace["match"].numpy()
    run = load_run_params("runs/scone")
    fgram_ids, _ = tag_tokens(FgramSet.load(run.info["fgram_set"]), np.asarray(ids))
    np.testing.assert_array_equal(match, fgram_ids)  # the snippet's matches are our tagger's
    assert (match >= 0).sum() >= 2
    export_table("runs/scone", "tables/scone", progress=False)
    engine = engine_from_run("runs/scone", "tables/scone")
    ours = np.asarray(engine.logits(np.asarray([ids]), fgram_ids[None]))
    np.testing.assert_allclose(ours, namespace["logits"].detach().numpy(), rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and the rows matter: without them the logits differ
        plain = namespace["model"](torch.tensor([ids])).logits.numpy()
    assert np.abs(plain - ours).max() > 1e-3


@pytest.mark.parametrize("preset", ["tiny", "tiny_scone"])
def test_init_from_the_export_gives_the_exported_parameters(flow, preset):
    """Export then init: a new run's backbone (baseline or SCONE) is runs/base's, exactly."""
    base = load_run_params(flow / "runs/base")
    vocab, tokenizer = base.info["vocab_size"], base.info["tokenizer_sha256"]
    overrides = [f"data.dataset={flow / 'data/web'}", f"model.init_from={flow / 'hf/base'}"]
    cfg = load_config(preset, overrides)
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(build_model_fn(cfg, vocab), tx, 0, base.mesh, base.rules)
    state = initial_state(setup, cfg, vocab, tokenizer)
    params = state["params"]["backbone"] if cfg.fgrams.enabled else state["params"]
    jax.tree.map(np.testing.assert_array_equal, host_params(base), jax.device_get(params))
    other = load_config(preset, [*overrides, "model.n_layers=1"])
    with pytest.raises(UserError, match=r"init_from .*: n_layers=2 in its config.json, but this"):
        initial_state(setup, other, vocab, tokenizer)
    with pytest.raises(UserError, match=r"its tokenizer tokenizer.json is not the one the dataset"):
        initial_state(setup, cfg, vocab, "0" * 64)
