"""Name → function registries (loss variants, advantage estimators, presets, ...).

`Registry.get` resolves a registered name (`"ppo_clip"`), a `module:function` string (imported
on first use, so a user's variant in their own file is selectable from YAML) or a callable.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

import jax.numpy as jnp

F = TypeVar("F", bound=Callable[..., Any])


class RegistryError(ValueError):
    """An unknown name, or a `module:function` reference that cannot be resolved."""


class Registry:
    """Names → callables of one `kind` (e.g. "loss variant", for errors), filled by a decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, *aliases: str) -> Callable[[F], F]:
        """Decorator registering a function under `name` (and optional aliases)."""

        def decorate(fn: F) -> F:
            for key in (name, *aliases):
                if ":" in key or not key:
                    raise RegistryError(f"{self.kind} name {key!r} must be non-empty without ':'")
                if key in self._entries and self._entries[key] is not fn:
                    raise RegistryError(f"{self.kind} {key!r} is already registered")
                self._entries[key] = fn
            return fn

        return decorate

    def names(self) -> tuple[str, ...]:
        """Registered names (aliases included), sorted."""
        return tuple(sorted(self._entries))

    def canonical_names(self) -> tuple[str, ...]:
        """One name per registered function (the first registered), in registration order."""
        seen: dict[int, str] = {}
        for key, fn in self._entries.items():
            seen.setdefault(id(fn), key)
        return tuple(seen.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, ref: str | Callable[..., Any]) -> Callable[..., Any]:
        """Resolves a registered name, a `module:function` string, or a callable; RegistryError
        lists the names and the closest match."""
        if callable(ref):
            return ref
        if not isinstance(ref, str):
            raise RegistryError(
                f"{self.kind} must be a name, a 'module:function' string or a callable, "
                f"got {type(ref).__name__}"
            )
        if ":" in ref:
            return self._import(ref)
        if ref in self._entries:
            return self._entries[ref]
        raise unknown_name(self.kind, ref, self.names(), suffix="; or give 'module:function'")

    def _import(self, ref: str) -> Callable[..., Any]:
        module_name, _, attr = ref.partition(":")
        if not module_name or not attr or ":" in attr:
            raise RegistryError(f"{self.kind} {ref!r} is not of the form 'module:function'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise RegistryError(
                f"{self.kind} {ref!r}: cannot import module {module_name!r} "
                f"({type(e).__name__}: {e})"
            ) from e
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise RegistryError(
                    f"{self.kind} {ref!r}: module {module_name!r} has no attribute {attr!r}"
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise RegistryError(
                f"{self.kind} {ref!r}: {attr!r} in module {module_name!r} is not callable "
                f"(it is a {type(obj).__name__})"
            )
        return obj


def split_output(out: Any, what: str, shape: tuple[int, ...], one: str) -> tuple[Any, dict]:
    """A variant's result `ℓ` or `(ℓ, aux)` as (float32 ℓ of `shape`, aux dict); `what` names
    the variant and `one` what ℓ holds (e.g. "one loss per pair, [B]") in the ValueError."""
    loss, aux = out if isinstance(out, tuple) else (out, {})
    if not isinstance(aux, dict):
        raise ValueError(f"{what} returned aux of type {type(aux).__name__}")
    loss = jnp.asarray(loss)
    if loss.shape != shape:
        raise ValueError(
            f"{what} returned a loss of shape {loss.shape}; a variant returns {one} = {shape}"
        )
    return loss.astype(jnp.float32), aux


def unknown_name(kind: str, name: str, choices: Iterable[str], suffix: str = "") -> RegistryError:
    """The error for an unknown `name`: lists the choices and the closest match."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return RegistryError(
        f"unknown {kind} {name!r}{hint}. Choose from: {', '.join(choices)}{suffix}"
    )


def display_name(ref: str | Callable[..., Any]) -> str:
    """A short name for a registry reference, for error messages and tables."""
    if isinstance(ref, str):
        return ref
    if hasattr(ref, "__qualname__"):
        return f"{ref.__module__}:{ref.__qualname__}"
    return repr(ref)


def keyword_parameters(fn: Callable[..., Any], contract: Collection[str]) -> dict[str, Any]:
    """`fn`'s keyword parameters beyond the `contract` ones, with their defaults
    (`inspect.Parameter.empty` for none)."""
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if name not in contract
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }


def takes_any_keyword(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has a `**kwargs` parameter."""
    kinds = [p.kind for p in inspect.signature(fn).parameters.values()]
    return inspect.Parameter.VAR_KEYWORD in kinds


def check_params(
    fn: Callable[..., Any], what: str, contract: Collection[str], params: Collection[str]
) -> None:
    """ValueError naming `what` unless `fn` takes the `contract` keywords and every one of
    `params`, and needs no other (a `**kwargs` function takes anything)."""
    if takes_any_keyword(fn):
        return
    signature = inspect.signature(fn).parameters
    lacks = [a for a in contract if a not in signature]
    if lacks:
        raise ValueError(
            f"{what} must accept the keyword arguments {', '.join(contract)}; "
            f"it lacks {', '.join(lacks)}"
        )
    own = keyword_parameters(fn, contract)
    unknown = sorted(k for k in params if k not in own)
    if unknown:
        raise ValueError(
            f"{what} takes no parameter {', '.join(map(repr, unknown))} "
            f"(its parameters: {', '.join(own) or 'none'})"
        )
    required = sorted(k for k, d in own.items() if d is inspect.Parameter.empty and k not in params)
    if required:
        raise ValueError(f"{what} needs parameter(s) {', '.join(required)}")
