"""Typed configuration: `load(path, overrides)` returns a validated `Config`."""

from rlvr_jax.config.checks import ConfigError, check, check_context, check_runtime
from rlvr_jax.config.loader import (
    describe,
    dump,
    from_dict,
    load,
    replace,
    to_dict,
)
from rlvr_jax.config.schema import Config

__all__ = [
    "Config",
    "ConfigError",
    "check",
    "check_context",
    "check_runtime",
    "describe",
    "dump",
    "from_dict",
    "load",
    "replace",
    "to_dict",
]
