"""`module:function` references of a config (tools, environments, verifiers, answer
transforms, losses, model builders): imported when the config is loaded, so that a missing
module fails at once with the key named, not minutes later after the model has loaded.

The module may be on the import path or in the working directory: `import_function` appends
the working directory to `sys.path` (never shadowing an installed package), and processes the
run starts later (the reward workers) inherit that path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


def search_working_directory() -> None:
    """Appends the working directory to `sys.path` unless it is there (or `''` is)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def is_ref(value: Any) -> bool:
    """Whether `value` is a `module:function` reference (not a registered name)."""
    return isinstance(value, str) and ":" in value


def import_function(ref: str, key: str) -> Callable[..., Any]:
    """The callable `ref` names (`package.module:function`, the function part may be dotted);
    ValueError `key: ...` says why it cannot be had."""
    module_name, sep, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: expected 'module:function', got {ref!r}")
    search_working_directory()
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module: any error of its import
        raise ValueError(
            f"{key}: cannot import module {module_name!r} of {ref!r} ({type(e).__name__}: {e}); "
            f"the module must be in the working directory ({os.getcwd()}) or on PYTHONPATH"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}: {ref!r} is a {type(obj).__name__}, not a function")
    return obj
