"""`scone-jax export RUN --hf-out DIR`: a run's backbone as a Hugging Face checkpoint
(artifacts/hf_checkpoint.py), its tokenizer beside it, and for a SCONE run the f-gram table's
rows and keys (`fgram_table.safetensors`) with `scone.json`, which tells a runtime (vLLM,
SGLang, plain transformers) how to add a row at the input layer.

Every combine rule exports "what to add": at each position with a match, `inputs_embeds` is the
token embedding plus the row of the longest f-gram ending there (replace mode's row is already
F(w) - T(last token), gated mode's the gated F(w)); elsewhere it is the token embedding alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from scone_jax.artifacts.hf_checkpoint import (
    CONFIG,
    HF_KIND,
    hf_config,
    to_hf_tensors,
    write_weights,
)
from scone_jax.artifacts.restore import host_params, load_run_params
from scone_jax.artifacts.run_dir import CheckpointChoice
from scone_jax.atomic import atomic_dir, plain_permissions
from scone_jax.config.schema import ModelConfig
from scone_jax.data.dataset import META_FILE
from scone_jax.data.hf_tokenizer import HFTokenizer
from scone_jax.data.tokenizer import find_tokenizer_file
from scone_jax.errors import UserError
from scone_jax.model.stack import unstack_layers
from scone_jax.runtime.distributed import barrier
from scone_jax.serve.tables import HostTable

SCONE_FILE = "scone.json"
TABLE_FILE = "fgram_table.safetensors"
INPUT_LAYER = (
    "inputs_embeds[b, i] = embed_tokens[input_ids[b, i]] + rows[f] if f >= 0 else "
    "embed_tokens[input_ids[b, i]], where f is the row of the longest f-gram (2..max_n tokens: "
    "keys[f, :lengths[f]]) equal to input_ids[b, i-n+1 : i+1] inside the sequence (-1 = none). "
    "Rows already hold what to add in every combine mode. gpt2 adds its position embeddings "
    "after this, as GPT2LMHeadModel does to inputs_embeds."
)


def export_hf(
    run_dir: str | Path,
    out: str | Path,
    table_url: str | None = None,
    step: CheckpointChoice = None,
    overwrite: bool = False,
) -> dict:
    """Write the checkpoint; a SCONE run needs its exported table (`table_url`, any dtype:
    rows are stored dequantized, float32). Every process restores; process 0 writes."""
    run = load_run_params(run_dir, step)
    scone = run.cfg.fgrams.enabled
    if scone and not table_url:
        raise UserError(f"run {run_dir} is a SCONE run: its f-gram table must be exported first")
    table = HostTable(table_url) if scone else None
    if table is not None:
        table.check_compatible(run.cfg.model.d_model, run.info["tokenizer_sha256"], run.fingerprint)
    params = host_params(run)
    cfg, vocab = run.cfg.model, run.info["vocab_size"]
    dataset = Path(run.info["dataset"])
    meta = _dataset_meta(dataset)
    config = hf_config(cfg, vocab, meta.get("eos_id"), meta.get("bos_id"))
    backbone = params["backbone"] if scone else params
    tensors = to_hf_tensors(unstack_layers(backbone) if cfg.scan_layers else backbone, cfg)
    info = {
        "checkpoint_step": run.step,
        "checkpoint_fingerprint": run.fingerprint,
        "tokenizer_sha256": run.info["tokenizer_sha256"],
        "architecture": config["architectures"][0],
        "scone": scone,
    }
    if jax.process_index() == 0:
        with atomic_dir(out, overwrite, marker=CONFIG, kind=HF_KIND) as tmp:
            write_weights(tmp, tensors)
            (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            _write_tokenizer(tmp, find_tokenizer_file(dataset), cfg)
            if table is not None:
                info["scone_file"] = SCONE_FILE
                _write_table(tmp, table, run.cfg.fgrams.combine, info)
    barrier("hf-checkpoint-written")
    return info


def _dataset_meta(dataset: Path) -> dict:
    """The dataset's meta.json, for the tokenizer's EOS and BOS ids."""
    try:
        return json.loads((dataset / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # the dataset moved away: config.json then names no special ids


def _write_tokenizer(directory: Path, path: Path, cfg: ModelConfig) -> None:
    """The tokenizer file as the dataset had it; for tokenizer.json also the
    tokenizer_config.json with which `AutoTokenizer.from_pretrained(DIR)` loads it."""
    if not path.is_file():
        return
    (directory / path.name).write_bytes(path.read_bytes())
    if path.name.endswith(".json"):
        tok = HFTokenizer.load(path)
        specials = {
            role: tok.piece(i)
            for role, i in (("eos_token", tok.eos_id), ("bos_token", tok.bos_id))
            if i >= 0
        }
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.max_seq_len,
            **specials,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_table(directory: Path, table: HostTable, combine: str, info: dict) -> None:
    fs = table.fgram_set
    rows = table.gather(np.arange(table.num_rows)).astype(np.float32)
    keys = np.asarray(fs.tokens, np.int32)
    lengths = np.asarray(fs.lengths, np.int32)
    save_file({"rows": rows, "keys": keys, "lengths": lengths}, str(directory / TABLE_FILE))
    plain_permissions(directory / TABLE_FILE)
    scone = {
        "format": "scone-hf/1",
        "table": TABLE_FILE,
        "tensors": {
            "rows": f"float32 [{rows.shape[0]}, {rows.shape[1]}]: the row to add for f-gram f",
            "keys": f"int32 [{keys.shape[0]}, {keys.shape[1]}]: f-gram f's tokens, right-padded "
            "with -1",
            "lengths": f"int32 [{lengths.shape[0]}]: f-gram f's length (2..max_n)",
        },
        "max_n": int(fs.max_n),
        "num_fgrams": int(rows.shape[0]),
        "width": int(rows.shape[1]),
        "combine": combine,
        "input_layer": INPUT_LAYER,
        "fgram_set_fingerprint": fs.fingerprint,
        **info,
    }
    (directory / SCONE_FILE).write_text(json.dumps(scone, indent=2) + "\n", encoding="utf-8")
