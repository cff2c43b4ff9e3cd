"""YAML → typed `Config`, with dotted overrides and errors that name the key and the file."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import itertools
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from rlvr_jax.config import schema
from rlvr_jax.config.checks import ConfigError, check
from rlvr_jax.config.schema import Config


def load(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Loads `path` (YAML; None = defaults only), applies `key.sub=value` overrides."""
    source = str(path) if path is not None else "<defaults>"
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{source}: config file not found")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{source}: not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: top level must be a mapping, got {type(loaded).__name__}")
        raw = loaded
    for ov in overrides:
        _apply_override(raw, ov)
    where = source if not overrides else f"{source} (with overrides {list(overrides)})"
    return from_dict(raw, source=where)


def from_dict(raw: dict[str, Any], *, source: str = "<dict>") -> Config:
    """Validates a plain nested dict against the schema."""
    cfg = _build(Config, raw, "", source)
    check(cfg, source=source)
    return cfg


def to_dict(cfg: Any) -> Any:
    """The config as plain YAML-able data."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, list | tuple):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def replace(cfg: Any, **dotted: Any) -> Any:
    """`replace(cfg, **{"train.max_steps": 3})`: a copy with dotted fields changed."""
    for key, value in dotted.items():
        head, _, rest = key.partition(".")
        if rest:
            cfg = dataclasses.replace(cfg, **{head: replace(getattr(cfg, head), **{rest: value})})
        else:
            cfg = dataclasses.replace(cfg, **{head: value})
    return cfg


def _apply_override(raw: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected key.sub=value")
    key, _, text = override.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {override!r}: empty key")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {e}") from None
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {'.'.join(parts[: i + 1])} is not a section")
        node = nxt
    node[parts[-1]] = value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(schema))


def _build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: {prefix.rstrip('.') or '<top>'} must be a mapping, got {raw!r}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean '{prefix}{near[0]}'?" if near else ""
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'{hint}")
    hints = _hints(cls)
    kwargs = {}
    for name, f in fields.items():
        key = prefix + name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            # a section's defaults are its default instance's values (e.g. the actor mesh's
            # data=-1), overridden key by key by what the file sets
            given = raw.get(name, {})
            if not isinstance(given, dict):
                raise ConfigError(f"{source}: {key} must be a mapping, got {given!r}")
            kwargs[name] = _build(tp, _merge(_section_defaults(f), given), key + ".", source)
        elif name in raw:
            kwargs[name] = _convert(tp, raw[name], key, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required value {key!r}")
    return cls(**kwargs)


def _section_defaults(f: dataclasses.Field) -> dict[str, Any]:
    """The default values of a nested section (empty when it has required fields)."""
    if f.default_factory is dataclasses.MISSING:
        return {}
    try:
        return to_dict(f.default_factory())
    except TypeError:  # a section with required values has no default instance
        return {}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _type_name(tp: Any) -> str:
    """Readable type: `int`, `str | None`, `'sync' | 'async'`, `list[int]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_SCALARS = {bool: bool, int: int, float: int | float, str: str}
"""The scalar schema types and the YAML values each takes (a bool is never an int or float)."""


def _convert(tp: Any, value: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    bad = ConfigError(f"{source}: {key} expects {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ConfigError):
                    return _convert(arg, value, key, source)
        raise bad
    if origin is Literal:
        if value in args:
            return value
        near = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(
            f"{source}: {key} must be one of {list(args)}, got {value!r}{hint}"
        ) from None
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".", source)
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_convert(args[0], v, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return {
            _convert(args[0], k, f"{key}.<key>", source): _convert(args[1], v, f"{key}.{k}", source)
            for k, v in value.items()
        }
    if tp in _SCALARS:
        if isinstance(value, _SCALARS[tp]) and (tp is bool or not isinstance(value, bool)):
            return float(value) if tp is float else value
        if tp is float and isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    raise ConfigError(f"{source}: {key}: unsupported schema type {tp!r}")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field of a schema dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for prev, node in itertools.pairwise(body):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def describe(
    cls: type = Config, prefix: str = "", _listed: dict[type, str] | None = None
) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default as YAML, docstring) for every leaf of the schema, for docs
    and `--describe`. A list of sections (`data.sources`) is followed by its entries' keys
    (`data.sources[].path`, ...), written out at the first such list; later lists of the same
    section point to it."""
    listed = {} if _listed is None else _listed
    rows = []
    hints = _hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + ".", listed))
            continue
        doc = docs.get(f.name, "")
        if "unset" in f.metadata:
            doc += f" Unset: the preset's value, else `{f.metadata['unset']}`."
        entry = _listed_section(tp)
        if entry is not None and entry in listed:
            doc += f" Entries take the keys of `{listed[entry]}[]`."
        rows.append((key, _type_name(tp), _default_text(f), doc))
        if entry is not None and entry not in listed:
            listed[entry] = key
            rows.extend(describe(entry, key + "[].", listed))
    return rows


def _listed_section(tp: Any) -> type | None:
    """The section class of a `list[Section]` field, else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _default_text(f: dataclasses.Field) -> str:
    """A field's default as YAML (`required` when it has none)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = to_dict(f.default_factory())
    else:
        return "required"
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()
