"""Typed config: one schema (`schema.py`), YAML presets with `key=value` overrides (`load.py`)."""

from scone_jax.config.load import load_config, parse_overrides, resolve_preset, save_config, to_dict
from scone_jax.config.schema import (
    CheckpointConfig,
    Config,
    DataConfig,
    FgramConfig,
    LoggingConfig,
    MeshConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)

__all__ = [
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "FgramConfig",
    "LoggingConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "TrainConfig",
    "load_config",
    "parse_overrides",
    "resolve_preset",
    "save_config",
    "to_dict",
]
