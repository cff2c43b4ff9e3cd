"""Fault injection for `rlvr-serve` started as a subprocess by tests/test_serve_cli.py (put
this directory on PYTHONPATH). Nothing of rlvr_jax is imported here: when the console script
first imports `rlvr_jax.rollout.engine`, `EngineCore.generate` (what both front ends call) is
wrapped so that it
- sleeps `RLVR_TEST_SLOW_GENERATE` seconds per call (streams are surely mid-flight), and
- raises "injected engine failure" once the file `RLVR_TEST_FAIL_FILE` exists.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

TARGET = "rlvr_jax.rollout.engine"


def _patch(module):
    generate = module.EngineCore.generate
    slow = float(os.environ.get("RLVR_TEST_SLOW_GENERATE", "0"))
    fail_file = os.environ.get("RLVR_TEST_FAIL_FILE")

    def faulty_generate(self, *args, **kwargs):
        if fail_file and os.path.exists(fail_file):
            raise RuntimeError("injected engine failure (device fell over)")
        if slow:
            time.sleep(slow)
        return generate(self, *args, **kwargs)

    module.EngineCore.generate = faulty_generate


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("RLVR_TEST_SLOW_GENERATE") or os.environ.get("RLVR_TEST_FAIL_FILE"):
    sys.meta_path.insert(0, _Finder())
