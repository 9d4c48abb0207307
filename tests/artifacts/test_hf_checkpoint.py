"""The Hugging Face checkpoint format: transformers (on CPU) computes our backbone's logits,
for gpt2 and llama (grouped-query heads, an untied head), and reading the checkpoint back gives
exactly the parameters written."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest
from flax import nnx

from scone_jax.artifacts.hf_checkpoint import (
    CONFIG,
    check_compatible,
    from_hf_tensors,
    hf_config,
    model_fields,
    read_checkpoint,
    to_hf_tensors,
    write_weights,
)
from scone_jax.config.schema import ModelConfig
from scone_jax.errors import UserError
from scone_jax.model.transformer import Transformer
from tests.hf_env import transformers_and_torch

VOCAB = 61
SHAPES = {
    "gpt2": ModelConfig(family="gpt2", d_model=32, n_layers=2, n_heads=2, max_seq_len=16),
    "llama": ModelConfig(
        family="llama",
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=16,
        tie_embeddings=False,
        rope_theta=500.0,
    ),
}


def random_model(cfg: ModelConfig, rng: np.random.Generator):
    """Our backbone's random parameters (biases and norms too, which init leaves 0 and 1) and
    its jitted logits; built abstractly, so no op runs eagerly."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, VOCAB, rngs=nnx.Rngs(0))))
    params = jax.tree.map(
        lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), nnx.to_pure_dict(state)
    )
    nnx.replace_by_pure_dict(state, params)
    logits = jax.jit(lambda st, tokens: nnx.merge(graphdef, st)(tokens))
    return (lambda tokens: logits(state, tokens)), params


def write_checkpoint(directory, cfg, params):
    directory.mkdir()
    write_weights(directory, to_hf_tensors(params, cfg))
    (directory / CONFIG).write_text(json.dumps(hf_config(cfg, VOCAB, 3, 1)))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_transformers_gives_our_logits_and_reading_back_gives_our_params(tmp_path, rng, family):
    transformers, torch = transformers_and_torch()
    cfg = SHAPES[family]
    model, params = random_model(cfg, rng)
    write_checkpoint(tmp_path / "hf", cfg, params)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[family]
    tokens = rng.integers(0, VOCAB, (3, cfg.max_seq_len))
    with torch.no_grad():
        expected = theirs(torch.as_tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(tokens)), expected, rtol=1e-4, atol=1e-4)
    config, tensors = read_checkpoint(tmp_path / "hf")
    check_compatible(model_fields(config, "hf"), cfg, VOCAB, "hf")
    back = from_hf_tensors(tensors, cfg, "hf")
    jax.tree.map(np.testing.assert_array_equal, back, params)


def test_mismatches_and_missing_tensors_are_one_line(tmp_path, rng):
    cfg = SHAPES["gpt2"]
    _, params = random_model(cfg, rng)
    write_checkpoint(tmp_path / "hf", cfg, params)
    config, tensors = read_checkpoint(tmp_path / "hf")
    fields = model_fields(config, "ckpt")
    other = ModelConfig(family="gpt2", d_model=32, n_layers=3, n_heads=2, max_seq_len=16)
    with pytest.raises(UserError, match=r"ckpt: n_layers=2 in its config.json, but this run has "):
        check_compatible(fields, other, VOCAB, "ckpt")
    with pytest.raises(UserError, match=r"ckpt: vocab_size=61 .* model.vocab_size=64"):
        check_compatible(fields, cfg, 64, "ckpt")
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(UserError, match=r"ckpt: no tensor 'transformer.h.1.mlp.c_fc.bias'"):
        from_hf_tensors(tensors, cfg, "ckpt")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(UserError, match=r"is not a readable Hugging Face checkpoint"):
        read_checkpoint(tmp_path / "hf")
    with pytest.raises(UserError, match=r"ckpt: config.json has model_type='bert'"):
        model_fields({"model_type": "bert"}, "ckpt")


CHANGED_FUNCTION = [  # config.json settings our blocks do not compute: each refused by name
    ("gpt2", {"activation_function": "relu"}, "activation_function='relu'"),
    ("gpt2", {"scale_attn_weights": False}, "scale_attn_weights=False"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ("llama", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ("llama", {"attention_bias": True}, "attention_bias=True"),
    ("llama", {"mlp_bias": True}, "mlp_bias=True"),
    (
        "llama",
        {"rope_scaling": {"rope_type": "llama3", "factor": 32.0}},
        "rope_scaling has rope_type='llama3'",
    ),
    (
        "llama",
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling has rope_type='linear'",
    ),
    (
        "llama",
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0}},
        "rope_parameters has rope_type='yarn'",
    ),
]


@pytest.mark.parametrize("family, change, named", CHANGED_FUNCTION)
def test_settings_our_model_would_compute_differently_are_refused(family, change, named):
    config = {**hf_config(SHAPES[family], VOCAB, 3, 1), **change}
    with pytest.raises(UserError, match="ckpt: " + re.escape(named)) as e:
        model_fields(config, "ckpt")
    assert "does not implement" in str(e.value) and "\n" not in str(e.value)


def test_the_settings_our_model_computes_are_accepted_as_written_or_left_out():
    for family, accepted in (
        ("gpt2", {"activation_function": "gelu_pytorch_tanh"}),
        ("llama", {"rope_scaling": None, "rope_parameters": {"rope_type": "default"}}),
    ):
        config = hf_config(SHAPES[family], VOCAB, 3, 1)
        model_fields({**config, **accepted}, "ckpt")
        fixed = {field for _, change, _ in CHANGED_FUNCTION for field in change}
        bare = {k: v for k, v in config.items() if k not in fixed}  # transformers' defaults
        assert model_fields(bare, "ckpt") == model_fields(config, "ckpt")


def test_weights_get_the_permissions_of_any_other_output(tmp_path):
    """safetensors creates its file 0600: a checkpoint shared with a serving account would be
    unreadable to it."""
    import os

    old = os.umask(0o022)
    try:
        write_weights(tmp_path, {"w": np.zeros((2, 3), np.float32)})
    finally:
        os.umask(old)
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == 0o644
