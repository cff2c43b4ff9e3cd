"""Validation of IFEval instruction arguments (the per-instruction `kwargs` of a ground truth).

The reference fills a missing or out-of-range argument with a random value; a reward must be
deterministic, so here every argument an instruction uses is required and checked, and a bad
one raises a ValueError naming the instruction and the argument. `None` values count as absent
(the Hugging Face copy of IFEval stores every argument name on every row, mostly as null), and
integral floats are accepted as integers (Parquet and pandas round-trips turn ints into floats).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RELATIONS = ("less than", "at least")
"""Comparison relations: actual < threshold, or actual >= threshold."""


class ArgumentError(ValueError):
    """A malformed argument of one instruction; the message names the instruction."""


@dataclass(frozen=True)
class Param:
    """One named argument and the function that validates and normalises its value."""

    name: str
    parse: Callable[[Any], Any]
    """Returns the normalised value, or raises ValueError saying what was expected."""


def _integer(value: Any, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {value}")
    return value


def count(name: str, minimum: int = 0) -> Param:
    """An integer argument (a threshold or an index) of at least `minimum`."""
    return Param(name, lambda value: _integer(value, minimum))


def _relation(value: Any) -> str:
    if value not in RELATIONS:
        raise ValueError(f"expected one of {RELATIONS}, got {value!r}")
    return value


def relation(name: str) -> Param:
    """A comparison relation, "less than" or "at least"."""
    return Param(name, _relation)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def text(name: str) -> Param:
    """A non-empty string."""
    return Param(name, _text)


def _texts(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise ValueError(f"expected a non-empty list of strings, got {value!r}")
    return tuple(_text(item) for item in value)


def texts(name: str) -> Param:
    """A non-empty list of non-empty strings."""
    return Param(name, _texts)


def _letter(value: Any) -> str:
    letter = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(letter, str) or len(letter) != 1 or not "a" <= letter <= "z":
        raise ValueError(f"expected one ASCII letter, got {value!r}")
    return letter


def letter(name: str) -> Param:
    """One ASCII letter, normalised to lower case."""
    return Param(name, _letter)


def choice(name: str, options: Mapping[str, Any]) -> Param:
    """A string that must be one of the keys of `options`."""

    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {sorted(options)}, got {value!r}")
        return value

    return Param(name, parse)


def parse_kwargs(
    instruction_id: str, params: tuple[Param, ...], kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Validate one instruction's kwargs against its params.

    Args:
      instruction_id: named in error messages.
      params: the arguments the instruction takes, all required.
      kwargs: the ground truth's arguments for it; None-valued entries count as absent.

    Returns:
      The normalised arguments, keyed by param name.

    Raises:
      ArgumentError: a missing, unknown or malformed argument.
    """
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise ArgumentError(
            f"ifeval instruction {instruction_id!r}: kwargs must be a dict, got {kwargs!r}"
        )
    given = {key: value for key, value in kwargs.items() if value is not None}
    names = [param.name for param in params]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ArgumentError(
            f"ifeval instruction {instruction_id!r}: unknown kwargs {unknown}; "
            f"it takes {names or 'no arguments'}"
        )
    parsed = {}
    for param in params:
        if param.name not in given:
            raise ArgumentError(
                f"ifeval instruction {instruction_id!r}: missing kwarg {param.name!r}"
            )
        try:
            parsed[param.name] = param.parse(given[param.name])
        except ValueError as error:
            raise ArgumentError(
                f"ifeval instruction {instruction_id!r}: kwarg {param.name!r}: {error}"
            ) from None
    return parsed
