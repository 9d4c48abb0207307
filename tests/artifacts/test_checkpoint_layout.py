"""A checkpoint saved with one layer layout (model.scan_layers) and resumed with the other is
refused in one line that says which setting resumes it."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.errors import UserError
from scone_jax.model.stack import stack_layers


def state_of(params):
    return {"params": params, "step": jnp.zeros((), jnp.int32)}


@pytest.mark.parametrize("saved_stacked", [False, True])
def test_a_checkpoint_of_the_other_layer_layout_is_refused_in_one_line(
    saved_stacked, tmp_path, rng
):
    unrolled = {
        "blocks": {i: {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)} for i in range(2)},
        "embed_table": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32),
    }
    stacked = jax.tree.map(jnp.asarray, stack_layers(unrolled))
    saved, wanted = (stacked, unrolled) if saved_stacked else (unrolled, stacked)
    ckpt = Checkpointer(tmp_path / "checkpoints", every=1, keep=2, async_save=False)
    ckpt.maybe_save(1, state_of(saved), force=True)
    ckpt.wait()
    shapes = jax.eval_shape(lambda: state_of(wanted))
    replicated = NamedSharding(jax.sharding.Mesh(jax.devices()[:1], ("d",)), PartitionSpec())
    with pytest.raises(UserError) as error:
        ckpt.restore(shapes, jax.tree.map(lambda _: replicated, shapes))
    message = str(error.value)
    assert "\n" not in message
    assert f"resume it with model.scan_layers={str(saved_stacked).lower()}" in message
    same = jax.eval_shape(lambda: state_of(saved))
    restored = ckpt.restore(same, jax.tree.map(lambda _: replicated, same))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), restored["params"], saved))
    ckpt.close()
