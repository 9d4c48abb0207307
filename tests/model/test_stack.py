"""The layer stack's options change how a model is computed, never what: fused attention equals
attention written out, rematerialized and scanned stacks give the unrolled model's outputs and
gradients (backbone and f-gram forest), and the two parameter layouts convert exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from scone_jax.config import FgramConfig, ModelConfig
from scone_jax.errors import UserError
from scone_jax.forest.batcher import FgramBatcher
from scone_jax.model import Transformer
from scone_jax.model.layers import Attention, attention_implementation
from scone_jax.model.scone import SconeModel
from scone_jax.model.stack import stack_layers, unstack_layers
from tests.forest.helpers import VOCAB, K, T, random_batch, random_fgram_set
from tests.model import reference

FAMILIES = {
    "gpt2": dict(family="gpt2", d_model=32, n_layers=3, n_heads=2, max_seq_len=T),
    "llama": dict(family="llama", d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=T),
}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_attention_written_out(family, masked, rng):
    cfg = ModelConfig(**FAMILIES[family], attention="xla")
    attn = Attention(cfg, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    x = jnp.asarray(rng.normal(size=(3, 9, cfg.d_model)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(9), (3, 9))
    causal = np.tril(np.ones((9, 9), bool))[None]
    # an arbitrary mask (every query keeps itself), like the prefix forest's paths
    mask = (rng.random((3, 9, 9)) < 0.5) | np.eye(9, dtype=bool) if masked else causal
    q, k, v = attn._qkv(x, positions)
    got = attn.heads(x, positions, jnp.asarray(mask) if masked else None)
    np.testing.assert_allclose(got, reference.attention(q, k, v, mask), rtol=2e-5, atol=2e-6)


def test_auto_attention_is_xla_off_gpu_and_cudnn_is_refused_there():
    assert attention_implementation("auto", jnp.bfloat16) == "xla"  # the tests run on CPU
    assert attention_implementation("xla", jnp.bfloat16) == "xla"
    with pytest.raises(UserError, match=r"model.attention='cudnn' needs an NVIDIA GPU"):
        attention_implementation("cudnn", jnp.bfloat16)
    with pytest.raises(UserError, match=r"model.remat='all' \(expected one of"):
        ModelConfig(remat="all").validate()
    with pytest.raises(UserError, match=r"model.attention='flash' \(expected one of"):
        ModelConfig(attention="flash").validate()


def backbone_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def value_and_grads(model, loss, *args):
    graphdef, params = nnx.split(model)
    return jax.jit(jax.value_and_grad(lambda p: loss(nnx.merge(graphdef, p), *args)))(params)


def pure(params):
    return nnx.to_pure_dict(params)


def assert_trees_close(a, b, rtol=2e-5, atol=1e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "family, remat, scan",
    [
        ("gpt2", "dots", False),
        ("llama", "block", False),
        ("gpt2", "none", True),
        ("llama", "dots", True),
    ],
)
def test_backbone_remat_and_scan_give_the_unrolled_loss_and_gradients(family, remat, scan, rng):
    seed = int(rng.integers(1 << 30))
    tokens = jnp.asarray(rng.integers(0, VOCAB, size=(2, T + 1)), jnp.int32)
    plain = Transformer(ModelConfig(**FAMILIES[family]), VOCAB, rngs=nnx.Rngs(seed))
    other = Transformer(
        ModelConfig(**FAMILIES[family], remat=remat, scan_layers=scan), VOCAB, rngs=nnx.Rngs(seed)
    )
    if scan:  # the same initial values, stacked
        assert_trees_close(pure(nnx.state(other)), stack_layers(pure(nnx.state(plain))), 0, 0)
    (la, ga), (lb, gb) = (value_and_grads(m, backbone_loss, tokens) for m in (plain, other))
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    assert_trees_close(stack_layers(pure(ga)) if scan else pure(ga), pure(gb))


def scone_loss(model, batch):
    inputs = jax.tree.map(jnp.asarray, batch["forest"].arrays())
    logits = model(jnp.asarray(batch["inputs"]), **inputs)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.asarray(batch["targets"])
    ).mean()


@pytest.mark.parametrize("family, remat, scan", [("gpt2", "dots", False), ("llama", "block", True)])
def test_scone_remat_and_scan_give_the_unrolled_loss_and_gradients(family, remat, scan, rng):
    seed = int(rng.integers(1 << 30))
    fcfg = FgramConfig(enabled=True, max_n=K, combine="add", n_layers=2)
    set_tokens, set_lengths = random_fgram_set(rng, 30, vocab=6)
    batch, tag_ids, tag_lengths = random_batch(rng, 4, 500, 30)
    batch = FgramBatcher(
        tag_ids, tag_lengths, set_tokens, set_lengths, block=8, capacity=8, output_capacity=64
    )(batch)
    plain = SconeModel(ModelConfig(**FAMILIES[family]), fcfg, VOCAB, rngs=nnx.Rngs(seed))
    other = SconeModel(
        ModelConfig(**FAMILIES[family], remat=remat, scan_layers=scan),
        fcfg,
        VOCAB,
        rngs=nnx.Rngs(seed),
    )
    (la, ga), (lb, gb) = (value_and_grads(m, scone_loss, batch) for m in (plain, other))
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    ga = pure(ga)
    if scan:
        ga = {"backbone": stack_layers(ga["backbone"]), "fgram": stack_layers(ga["fgram"])}
    assert_trees_close(ga, pure(gb))
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(pure(gb)["fgram"]))


def test_stacking_and_unstacking_layers_round_trip(rng):
    tree = {
        "blocks": {
            i: {
                "attn": {"wq": rng.normal(size=(2, 3)).astype("f4")},
                "norm": rng.normal(size=4).astype("f4"),
            }
            for i in range(3)
        },
        "embed_table": rng.normal(size=(5, 2)).astype("f4"),
    }
    stacked = stack_layers(tree)
    assert stacked["blocks"]["attn"]["wq"].shape == (3, 2, 3)
    np.testing.assert_array_equal(stacked["blocks"]["norm"][1], tree["blocks"][1]["norm"])
    back = unstack_layers(stacked)
    assert_trees_close(back, tree, 0, 0)
