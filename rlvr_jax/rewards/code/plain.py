"""Plain values: the only data that crosses the sandbox boundary or is compared there.

A program under test can return an object whose `__eq__` always says True. Two defences live
here, and both look at exact builtin types (`type(v) is int`), never `isinstance`, so a subclass
with a lying `__eq__` is refused:

- `canonical_json(v)` turns a result into canonical JSON text inside the sandbox. The parent
  decodes it and compares with `==` on fresh builtin objects, so no code of the program runs
  in the parent. Tuples become lists (JSON has no tuple); sets, complex numbers and bytes get a
  one-key tag object (`{"__set__": [...]}`); a real dict that happens to look like a tag is
  wrapped in `{"__dict__": ...}`, so a program cannot forge a tag. Integral floats become ints
  (`2.0` and `2` are equal under `==` anyway) so set members sort the same way either side.
- `trusted(v)` returns `v` unchanged when it is made of builtin types only, and raises
  otherwise. Generic assert tests wrap every operand of a comparison in it, so their `==`
  runs between builtins whose methods a program cannot replace.

Standard library only: the sandbox harness imports this module as a bare script module.
"""

from __future__ import annotations

import json
import math
from typing import Any

TRUSTED_NAME = "__rlvr_trusted__"
"""Name under which guarded assert tests call `trusted` inside the sandbox (see `cases.py`)."""
MAX_DEPTH = 100
"""Deepest container nesting `canonical_json` accepts."""
MAX_NODES = 1_000_000
"""Most values `canonical_json` and `trusted` visit in one call."""

_TAGS = frozenset({"__set__", "__complex__", "__bytes__", "__dict__"})
_ATOMS = (type(None), bool, int, str)
_TRUSTED_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, type, range})
_TRUSTED_CONTAINERS = frozenset({list, tuple, set, frozenset})


class NotPlainError(TypeError):
    """A value is not made of builtin data types (or is too deep, too large or cyclic)."""


def canonical_json(value: Any) -> str:
    """Canonical JSON text of a plain value (see the module docstring); raises NotPlainError."""
    budget = [MAX_NODES]
    plain = _to_plain(value, 0, budget)
    try:
        return json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except ValueError as err:  # e.g. an int with more digits than int->str allows
        raise NotPlainError(f"cannot encode value: {err}") from None


def _to_plain(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlainError(f"value has more than {MAX_NODES} parts")
    if depth > MAX_DEPTH:
        raise NotPlainError(f"value is nested deeper than {MAX_DEPTH} (or cyclic)")
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is float:
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if kind is list or kind is tuple:
        return [_to_plain(item, depth + 1, budget) for item in value]
    if kind is dict:
        plain = {_plain_key(key): _to_plain(item, depth + 1, budget) for key, item in value.items()}
        return {"__dict__": plain} if len(plain) == 1 and next(iter(plain)) in _TAGS else plain
    if kind is set or kind is frozenset:
        members = [_to_plain(item, depth + 1, budget) for item in value]
        return {"__set__": sorted(members, key=_sort_key)}
    if kind is complex:
        return {
            "__complex__": [
                _to_plain(value.real, depth, budget),
                _to_plain(value.imag, depth, budget),
            ]
        }
    if kind is bytes:
        return {"__bytes__": value.hex()}
    raise NotPlainError(f"value of type {type_name(kind)} is not plain data")


def _plain_key(key: Any) -> str:
    """Dict keys follow json.dumps: str stays, int/float/bool/None become their JSON text."""
    kind = type(key)
    if kind is str:
        return key
    if kind in (int, float, bool, type(None)):
        return json.dumps(key, allow_nan=True)
    raise NotPlainError(f"dict key of type {type_name(kind)} is not plain data")


def _sort_key(plain: Any) -> str:
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=True)


def trusted(value: Any) -> Any:
    """Returns `value` if it and everything inside it has an exact builtin type; else raises.

    Visits each container once (cycles are fine) and at most MAX_NODES values.
    """
    stack = [value]
    seen: set[int] = set()
    visited = 0
    while stack:
        item = stack.pop()
        visited += 1
        if visited > MAX_NODES:
            raise NotPlainError(f"value has more than {MAX_NODES} parts")
        kind = type(item)
        if kind in _TRUSTED_ATOMS:
            continue
        if kind not in _TRUSTED_CONTAINERS and kind is not dict:
            raise NotPlainError(f"value of type {type_name(kind)} is not builtin data")
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend(item.keys() if kind is dict else ())
        stack.extend(item.values() if kind is dict else item)
    return value


def type_name(kind: type) -> str:
    """A type's name without trusting a metaclass that overrides `__name__`."""
    name = type.__dict__["__name__"].__get__(kind)
    return name if type(name) is str else "?"
