"""Typed configuration: `load(path, overrides)` returns a validated `Config`."""

from rlvr_jax.config.loader import (
    ConfigError,
    check_runtime,
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
    "check_runtime",
    "describe",
    "dump",
    "from_dict",
    "load",
    "replace",
    "to_dict",
]
