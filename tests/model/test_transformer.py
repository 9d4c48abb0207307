import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scone_jax.config import ModelConfig
from scone_jax.metrics.flops import count_params
from scone_jax.model import Transformer

CONFIGS = {
    "gpt2": ModelConfig(family="gpt2", d_model=32, n_layers=2, n_heads=4, max_seq_len=16),
    "llama": ModelConfig(
        family="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16
    ),
    "gpt2_untied": ModelConfig(
        family="gpt2",
        d_model=32,
        n_layers=1,
        n_heads=2,
        max_seq_len=16,
        tie_embeddings=False,
        d_ff=48,
    ),
}
VOCAB = 50


def build(cfg, seed=0):
    return Transformer(cfg, VOCAB, rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("name", CONFIGS)
def test_param_count_matches_formula(name):
    model = build(CONFIGS[name])
    actual = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert actual == count_params(CONFIGS[name], VOCAB)[0]


@pytest.mark.parametrize("name", CONFIGS)
def test_causal_future_tokens_do_not_change_past_logits(name, rng):
    model = build(CONFIGS[name], seed=int(rng.integers(1 << 30)))
    tokens = rng.integers(0, VOCAB, (2, 12))
    changed = tokens.copy()
    changed[:, 7:] = rng.integers(0, VOCAB, (2, 5))
    a, b = model(jnp.asarray(tokens)), model(jnp.asarray(changed))
    np.testing.assert_allclose(a[:, :7], b[:, :7], atol=1e-5)
    assert np.abs(np.asarray(a[:, 7:] - b[:, 7:])).max() > 1e-4


def test_tied_head_uses_the_embedding_table():
    model = build(CONFIGS["gpt2"])
    h = jnp.ones((1, 1, 32))
    np.testing.assert_allclose(
        model.logits(h)[0, 0], model.embed_table[...] @ jnp.ones(32), rtol=1e-5
    )


def test_rope_is_relative(rng):
    """llama: shifting every position by a constant leaves the outputs unchanged."""
    model = build(CONFIGS["llama"])
    tokens = jnp.asarray(rng.integers(0, VOCAB, (1, 10)))
    x = model.embed(tokens)
    pos = jnp.arange(10)[None]
    np.testing.assert_allclose(model.hidden(x, pos), model.hidden(x, pos + 37), atol=2e-4)


def test_gpt2_positions_matter(rng):
    model = build(CONFIGS["gpt2"])
    x = model.embed(jnp.asarray(rng.integers(0, VOCAB, (1, 8))))
    pos = jnp.arange(8)[None]
    assert np.abs(np.asarray(model.hidden(x, pos) - model.hidden(x, pos + 3))).max() > 1e-3


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_bfloat16_compute_tracks_float32(name, rng):
    cfg32 = CONFIGS[name]
    cfg16 = ModelConfig(**{**cfg32.__dict__, "dtype": "bfloat16"})
    tokens = jnp.asarray(rng.integers(0, VOCAB, (2, 12)))
    a, b = build(cfg32)(tokens), build(cfg16)(tokens)
    assert b.dtype == jnp.float32 and np.isfinite(np.asarray(b)).all()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0.05)


def test_attention_matches_reference(rng):
    """Our attention (GQA, float32) against a plain numpy reference for one layer."""
    cfg = CONFIGS["llama"]
    model = build(cfg, seed=3)
    attn = model.blocks[0].attn
    x = jnp.asarray(rng.normal(size=(1, 6, 32)), jnp.float32)
    pos = jnp.arange(6)[None]
    mask = jnp.tril(jnp.ones((6, 6), bool))[None]
    out = np.asarray(attn(x, pos, mask))
    from scone_jax.model.layers import rope

    q = np.asarray(rope(jnp.einsum("btd,dhk->bthk", x, attn.wq[...]), pos, cfg.rope_theta))[0]
    k = np.asarray(rope(jnp.einsum("btd,dhk->bthk", x, attn.wk[...]), pos, cfg.rope_theta))[0]
    v = np.asarray(jnp.einsum("btd,dhk->bthk", x, attn.wv[...]))[0]
    ref = np.zeros((6, 4, 8))
    for h in range(4):
        kv = h // 2
        for t in range(6):
            s = q[: t + 1, h][-1] @ k[: t + 1, kv].T / np.sqrt(8)
            p = np.exp(s - s.max())
            ref[t, h] = (p / p.sum()) @ v[: t + 1, kv]
    expected = np.einsum("thk,hkd->td", ref, np.asarray(attn.wo[...]))
    np.testing.assert_allclose(out[0], expected, atol=1e-5)
