"""Typed configuration: `load(path, overrides)` returns a validated `Config`."""

from rlvr_jax.config.loader import ConfigError, describe, dump, from_dict, load, replace, to_dict
from rlvr_jax.config.schema import Config

__all__ = ["Config", "ConfigError", "describe", "dump", "from_dict", "load", "replace", "to_dict"]
