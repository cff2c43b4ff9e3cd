"""Importing TensorFlow (and TFDS) without letting it take the accelerators from JAX.

On import TensorFlow (a data-loading dependency: TFDS, JetStream's server) claims every GPU
and TPU; `CUDA_VISIBLE_DEVICES` would hide them from JAX too, so TensorFlow is told right after
import that it may see none. Every module imports it through `import_tensorflow()`.
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
    """TensorFlow, imported with `TF_CPP_MIN_LOG_LEVEL=2` (unless set) and GPUs and TPUs hidden
    from it (a warning when its runtime was initialised already and they cannot be)."""
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
