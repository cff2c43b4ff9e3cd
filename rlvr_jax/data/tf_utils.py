"""Importing TensorFlow (and TFDS) without letting it take the accelerators from JAX.

TensorFlow is only a data-loading dependency here (TFDS, and JetStream's server), but on
import it claims every visible GPU and TPU and pre-allocates their memory. Hiding devices with
`CUDA_VISIBLE_DEVICES` would hide them from JAX too, so instead TensorFlow is told, right after
import and before it initialises its runtime, that it may see no GPU and no TPU. Every module
that needs TensorFlow goes through `import_tensorflow()`; no library module imports it at top
level.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)

HIDDEN_DEVICE_TYPES = ("GPU", "TPU")
"""Device types TensorFlow is never allowed to use: they belong to JAX."""


@functools.cache
def import_tensorflow() -> ModuleType:
    """Imports TensorFlow quietly with GPUs and TPUs hidden from it; returns the module.

    Sets `TF_CPP_MIN_LOG_LEVEL=2` (unless the user set it) before the import. If TensorFlow's
    runtime was already initialised elsewhere (its devices can then no longer be hidden), a
    warning says so and the module is returned anyway.
    """
    from rlvr_jax.logs import quiet_native_import

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_native_import():  # its native INFO lines bypass TF_CPP_MIN_LOG_LEVEL
        import tensorflow as tf

        for device_type in HIDDEN_DEVICE_TYPES:
            try:
                tf.config.set_visible_devices([], device_type)
            except RuntimeError as e:  # the runtime was initialised before we got here
                logger.warning(
                    "TensorFlow was initialised before rlvr_jax could hide %s devices from "
                    "it; it may hold accelerator memory that JAX needs (%s)",
                    device_type,
                    e,
                )
    return tf


@functools.cache
def import_tfds() -> ModuleType:
    """Imports `tensorflow_datasets` after `import_tensorflow()`; returns the module."""
    import_tensorflow()
    import tensorflow_datasets as tfds

    return tfds
