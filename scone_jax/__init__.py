"""scone_jax: SCONE n-gram embeddings for JAX language models.

Pipeline: tokenize -> count -> tag -> train -> export -> serve.
"""

__version__ = "0.1.0"
