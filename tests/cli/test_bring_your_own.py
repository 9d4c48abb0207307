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
from scone_jax.artifacts.hf_checkpoint import from_hf_tensors, read_checkpoint
from scone_jax.artifacts.restore import host_params, load_run_params
from scone_jax.config import load_config
from scone_jax.data.tokenizer import load_tokenizer
from scone_jax.errors import UserError
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


def users_files(root: Path, transformers) -> None:
    """What the user brings: parquet shards of text and a GPT-2 checkpoint that transformers
    saved, with its byte-level BPE tokenizer.json (the `tiny` preset's width, one layer, random
    weights)."""
    rng = random.Random()
    texts = random_texts(rng, 600, 400)
    (root / "gpt2").mkdir()
    tokenizer = train_byte_level_bpe(root / "gpt2" / "tokenizer.json", texts, vocab_size=500)
    tiny = load_config("tiny", ["model.n_layers=1"]).model
    config = transformers.GPT2Config(
        vocab_size=load_tokenizer(tokenizer).vocab_size,
        n_positions=tiny.max_seq_len,
        n_embd=tiny.d_model,
        n_layer=tiny.n_layers,
        n_head=tiny.n_heads,
        activation_function="gelu_new",
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    (root / "shards").mkdir()
    for i in range(2):
        part = texts[i::2]
        table = pa.table({"text": part, "id": list(range(len(part)))})
        pq.write_table(table, root / f"shards/{i}.parquet")


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """The README's commands, run as written in a fresh directory holding the user's files."""
    transformers, _ = transformers_and_torch()
    root = tmp_path_factory.mktemp("byo")
    commands, _ = readme_blocks()
    assert len(commands) == 4
    users_files(root, transformers)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for line in commands:
            assert cli_main.main(shlex.split(line)[1:]) == 0, line
    return root


def test_the_exported_files_are_readable_as_any_other_output(flow):
    from scone_jax.atomic import current_umask

    [table] = flow.rglob("fgram_table.safetensors")  # the Hugging Face export, not the user's
    weights = sorted(table.parent.glob("*.safetensors"))
    assert {p.name for p in weights} == {"model.safetensors", "fgram_table.safetensors"}
    for path in weights:
        assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask(), path


def test_the_snippet_adds_the_rows_and_gets_scone_jax_logits(flow, monkeypatch):
    transformers, torch = transformers_and_torch()
    trace = list((flow / "runs/scone/profile").rglob("*.xplane.pb"))
    assert len(trace) == 1 and trace[0].stat().st_size > 0  # train.profile_steps
    scone = json.loads((flow / "hf/scone/scone.json").read_text())
    assert scone["combine"] == "gated" and scone["max_n"] == 5
    monkeypatch.chdir(flow)
    namespace: dict = {}
    exec(compile(readme_blocks()[1], "README.md", "exec"), namespace)
    assert type(namespace["model"]).__name__ == "GPT2LMHeadModel"
    ids, match = namespace["ids"], namespace["match"].numpy()
    assert ids == load_tokenizer("gpt2/tokenizer.json").encode("the quick brown fox")
    run = load_run_params("runs/scone")
    fgram_ids, _ = tag_tokens(FgramSet.load(run.info["fgram_set"]), np.asarray(ids))
    np.testing.assert_array_equal(match, fgram_ids)  # the snippet's matches are our tagger's
    assert (match >= 0).sum() >= 2
    engine = engine_from_run("runs/scone", "tables/scone")
    ours = np.asarray(engine.logits(np.asarray([ids]), fgram_ids[None]))
    np.testing.assert_allclose(ours, namespace["logits"].detach().numpy(), rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and the rows matter: without them the logits differ
        plain = namespace["model"](torch.tensor([ids])).logits.numpy()
    assert np.abs(plain - ours).max() > 1e-3


def test_init_from_gives_the_checkpoints_parameters_and_export_then_init_round_trips(flow):
    """A baseline run started from the user's checkpoint holds exactly its tensors; one started
    from the SCONE run's export holds exactly that run's backbone."""
    scone = load_run_params(flow / "runs/scone")
    vocab, tokenizer = scone.info["vocab_size"], scone.info["tokenizer_sha256"]
    overrides = [f"data.dataset={flow / 'data/web'}", "model.n_layers=1"]
    cfg = load_config("tiny", [*overrides, f"model.init_from={flow / 'gpt2'}"])
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(build_model_fn(cfg, vocab), tx, 0, scone.mesh, scone.rules)
    state = initial_state(setup, cfg, vocab, tokenizer)
    _, tensors = read_checkpoint(flow / "gpt2")
    user = from_hf_tensors(tensors, cfg.model, "gpt2")
    jax.tree.map(np.testing.assert_array_equal, user, jax.device_get(state["params"]))
    again = load_config("tiny", [*overrides, f"model.init_from={flow / 'hf/scone'}"])
    state = initial_state(setup, again, vocab, tokenizer)
    exported = host_params(scone)["backbone"]
    jax.tree.map(np.testing.assert_array_equal, exported, jax.device_get(state["params"]))
    other = load_config(
        "tiny", [*overrides, f"model.init_from={flow / 'gpt2'}", "model.n_layers=2"]
    )
    with pytest.raises(UserError, match=r"init_from .*: n_layers=1 in its config.json, but this"):
        initial_state(setup, other, vocab, tokenizer)
    with pytest.raises(UserError, match=r"its tokenizer tokenizer.json is not the one the dataset"):
        initial_state(setup, cfg, vocab, "0" * 64)
