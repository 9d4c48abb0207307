"""Pure flax nnx models: the decoder backbone (and, with SCONE, the f-gram model).

Models know arrays, not files, loops or checkpoints.
"""

from scone_jax.model.transformer import Transformer

__all__ = ["Transformer"]
