"""Test harness: 8 simulated CPU devices, strict rank promotion, small thread pools."""

import gc
import os

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# jax is imported only after the environment above is set
import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_platforms", "cpu")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops every compiled XLA program after each test module. Each CPU executable keeps a
    few memory mappings; over the whole suite (thousands of programs) one process reached
    Linux's `vm.max_map_count` (65,530) and XLA aborted mid-compile (CI: SIGABRT in
    test_sft after 30 min, SIGSEGV in sharded decode before)."""
    yield
    jax.clear_caches()
    gc.collect()
