"""The FLOP counts behind MFU against a brute-force count: every dot_general in the traced
program, 2 x (output elements) x (contracted size)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scone_jax.config import FgramConfig, ModelConfig
from scone_jax.metrics.flops import fgram_forest_forward, model_flops
from scone_jax.model import Transformer
from scone_jax.model.scone import SconeModel


def traced_matmul_flops(fn, *args) -> int:
    def count(jaxpr) -> int:
        total = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (contract, _), _ = eqn.params["dimension_numbers"]
                lhs = eqn.invars[0].aval.shape
                total += (
                    2
                    * int(np.prod(eqn.outvars[0].aval.shape))
                    * int(np.prod([lhs[d] for d in contract]))
                )
            for value in eqn.params.values():  # sub-programs: jit, custom_jvp, scan, cond branches
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    sub = getattr(sub, "jaxpr", sub)  # a closed program's inner one
                    if hasattr(sub, "eqns"):
                        total += count(sub)
        return total

    return count(jax.make_jaxpr(fn)(*args).jaxpr)


MODELS = {
    "gpt2": ModelConfig(family="gpt2", d_model=48, n_layers=2, n_heads=4, max_seq_len=24),
    "llama": ModelConfig(
        family="llama",
        d_model=48,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=24,
        tie_embeddings=False,
    ),
}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_backbone_flops_count_every_matmul(family, rng):
    cfg, vocab, batch, seq = MODELS[family], 96, 3, 20
    model = Transformer(cfg, vocab, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, seq)), jnp.int32)
    assert (
        traced_matmul_flops(model, tokens)
        == model_flops(cfg, vocab, seq).forward_per_token * batch * seq
    )


@pytest.mark.parametrize(
    "family, fgram_width, layers", [("gpt2", 0, 2), ("gpt2", 32, 1), ("llama", 64, 2)]
)
def test_fgram_flops_count_the_forest_slots_and_outputs_computed(family, fgram_width, layers, rng):
    backbone = MODELS[family]
    fcfg = FgramConfig(enabled=True, max_n=4, block_size=8, d_model=fgram_width, n_layers=layers)
    model = SconeModel(backbone, fcfg, 96, rngs=nnx.Rngs(0))
    groups, blocks, outputs = 2, int(rng.integers(2, 5)), int(rng.integers(3, 12))
    shape = (groups, blocks, fcfg.block_size)
    embeddings = jnp.asarray(rng.normal(size=(*shape, backbone.d_model)), jnp.float32)
    paths = jnp.asarray(rng.integers(-1, fcfg.block_size, (*shape, fcfg.max_n)), jnp.int32)
    rows = jnp.asarray(rng.integers(0, blocks * fcfg.block_size, (groups, outputs)), jnp.int32)
    counted = traced_matmul_flops(model.fgram.forest, embeddings, paths, rows)
    assert counted == fgram_forest_forward(fcfg, backbone, int(np.prod(shape)), groups * outputs)
