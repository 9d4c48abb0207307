"""The Hugging Face checkpoint format of a backbone, both ways: `model.safetensors` plus
`config.json` that `transformers` loads as `GPT2LMHeadModel` (gpt2) or `LlamaForCausalLM`
(llama), and back into our parameter tree (`model.init_from`).

Pure numpy and safetensors: neither torch nor transformers is needed to write or read one.
Weights are written in float32. The maps are exact: GPT-2's `Conv1D` stores [in, out] (our
layout; q, k, v concatenated in `c_attn`), Llama's `nn.Linear` [out, in] (transposed), and our
RoPE is Llama's half-split layout, so no permutation is needed. A SCONE export adds
`fgram_table.safetensors` and `scone.json` (export/hf.py writes them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.flax import load_file
from safetensors.numpy import save_file

from scone_jax.atomic import plain_permissions
from scone_jax.config.schema import ModelConfig
from scone_jax.errors import UserError

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
HF_KIND = "a Hugging Face checkpoint"  # every one holds CONFIG
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
# buffers older GPT-2 checkpoints carry beside the weights (causal masks), not parameters
_GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")


def hf_config(cfg: ModelConfig, vocab_size: int, eos_id: int | None, bos_id: int | None) -> dict:
    """config.json for `cfg`: what transformers needs to rebuild the same network."""
    ids = {
        "bos_token_id": bos_id if bos_id is not None and bos_id >= 0 else None,
        "eos_token_id": eos_id if eos_id is not None and eos_id >= 0 else None,
    }
    common = {
        "architectures": [ARCHITECTURES[cfg.family]],
        "model_type": cfg.family,
        "vocab_size": vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
        **ids,
    }
    if cfg.family == "gpt2":
        if cfg.kv_heads != cfg.n_heads:
            raise UserError(
                f"model.n_kv_heads={cfg.n_kv_heads}: GPT2LMHeadModel has no grouped-query "
                f"attention (expected n_kv_heads 0 or {cfg.n_heads})"
            )
        return {
            **common,
            "n_positions": cfg.max_seq_len,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.ffn_dim,
            "activation_function": "gelu_new",  # the tanh GeLU our gpt2 MLP uses
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
        }
    return {
        **common,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4 reads this, 5 the next
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
    }


# config.json settings that change the function but have no ModelConfig field: only the value
# our blocks implement is accepted (field, the default transformers assumes, accepted values)
_FIXED = {
    "gpt2": (
        ("activation_function", "gelu_new", ("gelu_new", "gelu_pytorch_tanh")),
        ("scale_attn_weights", True, (True,)),
        ("scale_attn_by_inverse_layer_idx", False, (False,)),
    ),
    "llama": (
        ("hidden_act", "silu", ("silu",)),
        ("attention_bias", False, (False,)),
        ("mlp_bias", False, (False,)),
    ),
}


def _check_implemented(config: dict, kind: str, where: str) -> None:
    """One line for a setting our model would silently compute differently."""
    for field, default, accepted in _FIXED[kind]:
        value = config.get(field, default)
        if value not in accepted:
            raise UserError(
                f"{where}: {field}={value!r} in its config.json, which scone_jax's {kind} "
                f"does not implement (expected {' or '.join(map(repr, accepted))})"
            )
    if kind == "llama":
        for field in ("rope_parameters", "rope_scaling"):
            rope = config.get(field) or {}
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise UserError(
                    f"{where}: {field} has rope_type={rope_type!r} in its config.json, which "
                    "scone_jax's llama does not implement (expected 'default': plain RoPE)"
                )


def model_fields(config: dict, where: str) -> dict[str, Any]:
    """The ModelConfig fields a config.json fixes (the inverse of `hf_config`); settings with no
    field must be the ones our model computes."""
    kind = config.get("model_type")
    if kind in _FIXED:
        _check_implemented(config, kind, where)
    try:
        if kind == "gpt2":
            d = config["n_embd"]
            return {
                "family": "gpt2",
                "vocab_size": config["vocab_size"],
                "d_model": d,
                "n_layers": config["n_layer"],
                "n_heads": config["n_head"],
                "n_kv_heads": config["n_head"],
                "d_ff": config.get("n_inner") or 4 * d,
                "max_seq_len": config["n_positions"],
                "tie_embeddings": config.get("tie_word_embeddings", True),
                "norm_eps": config.get("layer_norm_epsilon", 1e-5),
            }
        if kind == "llama":
            heads = config["num_attention_heads"]
            rope = (config.get("rope_parameters") or {}).get("rope_theta")
            return {
                "family": "llama",
                "vocab_size": config["vocab_size"],
                "d_model": config["hidden_size"],
                "n_layers": config["num_hidden_layers"],
                "n_heads": heads,
                "n_kv_heads": config.get("num_key_value_heads") or heads,
                "d_ff": config["intermediate_size"],
                "tie_embeddings": config.get("tie_word_embeddings", False),
                "norm_eps": config.get("rms_norm_eps", 1e-6),
                "rope_theta": float(rope or config.get("rope_theta", 10000.0)),
            }
    except KeyError as e:
        raise UserError(
            f"{where}: config.json has no {e.args[0]!r} (expected a full config)"
        ) from None
    raise UserError(f"{where}: config.json has model_type={kind!r} (expected 'gpt2' or 'llama')")


def to_hf_tensors(params: dict, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our backbone's parameter tree -> the transformers state dict, float32."""
    p = _float32(params)
    d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
    out: dict[str, np.ndarray] = {}
    for i in range(cfg.n_layers):
        b = p["blocks"][i]
        a, m = b["attn"], b["mlp"]
        if cfg.family == "gpt2":
            pre = f"transformer.h.{i}."
            out |= {
                pre + "ln_1.weight": b["attn_norm"]["scale"],
                pre + "ln_1.bias": b["attn_norm"]["bias"],
                pre + "attn.c_attn.weight": np.concatenate(
                    [a[w].reshape(d, -1) for w in ("wq", "wk", "wv")], axis=1
                ),
                pre + "attn.c_attn.bias": np.concatenate(
                    [a[w].ravel() for w in ("bq", "bk", "bv")]
                ),
                pre + "attn.c_proj.weight": a["wo"].reshape(h * hd, d),
                pre + "attn.c_proj.bias": a["bo"],
                pre + "ln_2.weight": b["mlp_norm"]["scale"],
                pre + "ln_2.bias": b["mlp_norm"]["bias"],
                pre + "mlp.c_fc.weight": m["w_in"],
                pre + "mlp.c_fc.bias": m["b_in"],
                pre + "mlp.c_proj.weight": m["w_out"],
                pre + "mlp.c_proj.bias": m["b_out"],
            }
        else:
            pre = f"model.layers.{i}."
            out |= {
                pre + "input_layernorm.weight": b["attn_norm"]["scale"],
                pre + "self_attn.q_proj.weight": a["wq"].reshape(d, h * hd).T,
                pre + "self_attn.k_proj.weight": a["wk"].reshape(d, kv * hd).T,
                pre + "self_attn.v_proj.weight": a["wv"].reshape(d, kv * hd).T,
                pre + "self_attn.o_proj.weight": a["wo"].reshape(h * hd, d).T,
                pre + "post_attention_layernorm.weight": b["mlp_norm"]["scale"],
                pre + "mlp.gate_proj.weight": m["w_gate"].T,
                pre + "mlp.up_proj.weight": m["w_in"].T,
                pre + "mlp.down_proj.weight": m["w_out"].T,
            }
    if cfg.family == "gpt2":
        out |= {
            "transformer.wte.weight": p["embed_table"],
            "transformer.wpe.weight": p["pos_embed"],
            "transformer.ln_f.weight": p["final_norm"]["scale"],
            "transformer.ln_f.bias": p["final_norm"]["bias"],
        }
    else:
        out |= {
            "model.embed_tokens.weight": p["embed_table"],
            "model.norm.weight": p["final_norm"]["scale"],
        }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = p["lm_head"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_hf_tensors(tensors: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> dict:
    """The inverse of `to_hf_tensors`: a transformers state dict -> our backbone's tree.

    Accepts GPT-2 checkpoints with or without the `transformer.` prefix (the original GPT-2
    files have none) and ignores their causal-mask buffers; any other missing or left-over
    tensor is an error naming it.
    """
    t = dict(tensors)
    if cfg.family == "gpt2":
        t = {
            (k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v
            for k, v in t.items()
            if not k.endswith(_GPT2_BUFFERS)
        }
    if cfg.tie_embeddings:
        t.pop("lm_head.weight", None)  # a tied head saved anyway is the embedding table
    d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim

    def take(name: str) -> np.ndarray:
        if name not in t:
            raise UserError(f"{where}: no tensor {name!r} (expected a {cfg.family} checkpoint)")
        return np.asarray(t.pop(name), np.float32)

    blocks = {}
    for i in range(cfg.n_layers):
        if cfg.family == "gpt2":
            pre = f"transformer.h.{i}."
            qkv, qkv_b = take(pre + "attn.c_attn.weight"), take(pre + "attn.c_attn.bias")
            q, k, v = np.split(qkv, [h * hd, (h + kv) * hd], axis=1)
            bq, bk, bv = np.split(qkv_b, [h * hd, (h + kv) * hd])
            blocks[i] = {
                "attn_norm": {"scale": take(pre + "ln_1.weight"), "bias": take(pre + "ln_1.bias")},
                "attn": {
                    "wq": q.reshape(d, h, hd),
                    "wk": k.reshape(d, kv, hd),
                    "wv": v.reshape(d, kv, hd),
                    "wo": take(pre + "attn.c_proj.weight").reshape(h, hd, d),
                    "bq": bq.reshape(h, hd),
                    "bk": bk.reshape(kv, hd),
                    "bv": bv.reshape(kv, hd),
                    "bo": take(pre + "attn.c_proj.bias"),
                },
                "mlp_norm": {"scale": take(pre + "ln_2.weight"), "bias": take(pre + "ln_2.bias")},
                "mlp": {
                    "w_in": take(pre + "mlp.c_fc.weight"),
                    "b_in": take(pre + "mlp.c_fc.bias"),
                    "w_out": take(pre + "mlp.c_proj.weight"),
                    "b_out": take(pre + "mlp.c_proj.bias"),
                },
            }
        else:
            pre = f"model.layers.{i}."
            blocks[i] = {
                "attn_norm": {"scale": take(pre + "input_layernorm.weight")},
                "attn": {
                    "wq": take(pre + "self_attn.q_proj.weight").T.reshape(d, h, hd),
                    "wk": take(pre + "self_attn.k_proj.weight").T.reshape(d, kv, hd),
                    "wv": take(pre + "self_attn.v_proj.weight").T.reshape(d, kv, hd),
                    "wo": take(pre + "self_attn.o_proj.weight").T.reshape(h, hd, d),
                },
                "mlp_norm": {"scale": take(pre + "post_attention_layernorm.weight")},
                "mlp": {
                    "w_gate": take(pre + "mlp.gate_proj.weight").T,
                    "w_in": take(pre + "mlp.up_proj.weight").T,
                    "w_out": take(pre + "mlp.down_proj.weight").T,
                },
            }
    if cfg.family == "gpt2":
        tree = {
            "embed_table": take("transformer.wte.weight"),
            "pos_embed": take("transformer.wpe.weight"),
            "final_norm": {
                "scale": take("transformer.ln_f.weight"),
                "bias": take("transformer.ln_f.bias"),
            },
        }
    else:
        tree = {
            "embed_table": take("model.embed_tokens.weight"),
            "final_norm": {"scale": take("model.norm.weight")},
        }
    tree["blocks"] = blocks
    if not cfg.tie_embeddings:
        tree["lm_head"] = take("lm_head.weight").T
    if t:
        raise UserError(
            f"{where}: unexpected tensors {sorted(t)[:3]} (expected exactly a {cfg.family} "
            f"checkpoint of {cfg.n_layers} layers)"
        )
    return tree


def write_weights(directory: Path, tensors: dict[str, np.ndarray], name: str = WEIGHTS) -> None:
    save_file(tensors, str(directory / name), metadata={"format": "pt"})
    plain_permissions(directory / name)


def read_checkpoint(directory: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json, every tensor) of a checkpoint directory, single-file or sharded."""
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
        if (directory / WEIGHTS_INDEX).is_file():
            index = json.loads((directory / WEIGHTS_INDEX).read_text(encoding="utf-8"))
            files = sorted(set(index["weight_map"].values()))
        else:
            files = [WEIGHTS]
        tensors = {}
        for name in files:
            tensors |= {
                k: np.asarray(v, np.float32) for k, v in load_file(directory / name).items()
            }
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(
            f"{directory} is not a readable Hugging Face checkpoint ({reason}; expected "
            f"{CONFIG} and {WEIGHTS})"
        ) from None
    return config, tensors


def check_compatible(fields: dict[str, Any], cfg: ModelConfig, vocab: int, where: str) -> None:
    """One line naming the first field where the checkpoint and this run's model differ."""
    mine = {
        "family": cfg.family,
        "vocab_size": vocab,
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads,
        "d_ff": cfg.ffn_dim,
        "max_seq_len": cfg.max_seq_len,
        "tie_embeddings": cfg.tie_embeddings,
        "norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
    }
    for key, theirs in fields.items():
        ours = mine[key]
        same = math.isclose(ours, theirs) if isinstance(ours, float) else ours == theirs
        if not same:
            raise UserError(
                f"{where}: {key}={theirs!r} in its config.json, but this run has "
                f"model.{key}={ours!r} (expected equal; vocab_size is the run's model vocabulary)"
            )


def _float32(tree):
    if isinstance(tree, dict):
        return {k: _float32(v) for k, v in tree.items()}
    return np.asarray(tree, np.float32)
