"""Tools as typed Python functions: their JSON schema from the signature and docstring, a
bounded call, and the built-in `calculator`, `python` (our code sandbox) and `lookup` (a
hidden table, `envs.lookup`: the tool-use task's).

A tool is a function with annotated parameters (`int`, `float`, `str`, `bool`, `list[...]`,
`dict`, `Literal[...]`, optional ones with defaults) returning something printable; its
docstring's first paragraph describes it and an `Args:` section its parameters. `env.tools`
names built-ins or `module:function`.

`call_tool` never raises: bad arguments, an exception, or a call that outlives its timeout
come back as an error text the episode shows the model ("error: ..."). A timed-out call's
thread is abandoned (Python cannot kill it): tools that can hang should bound themselves,
as `python` does (the sandbox kills the program at its own limit).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import math
import operator
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rlvr_jax.envs.lookup import lookup

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object"}


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable tool and the schema the chat template shows the model."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    """`{"type": "function", "function": {"name", "description", "parameters"}}`."""


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is Literal:
        return {"type": _JSON_TYPES[type(args[0])], "enum": list(args)}
    if origin in (list, tuple, Sequence):
        return {"type": "array", **({"items": _json_type(args[0], where)} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _json_type(inner, where)
    raise TypeError(f"{where}: annotation {annotation!r} has no JSON schema type")


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:\n")
    params, name, indent = {}, None, 0
    for line in rest.splitlines():
        depth = len(line) - len(line.lstrip())
        match = re.match(r"(\s+)(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if match and (name is None or depth <= indent):
            name, indent, params[match[2]] = match[2], depth, match[3]
        elif name and depth > indent and line.strip():
            params[name] += " " + line.strip()
        elif line.strip() and not depth:
            break
    return " ".join(head.split("\n\n")[0].split()), params


def make_tool(fn: Callable[..., Any], name: str | None = None) -> Tool:
    """The `Tool` of a typed function. Raises TypeError naming a parameter without a usable
    annotation."""
    name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    description, docs = _doc_parts(fn.__doc__ or "")
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args / **kwargs have no schema")
        if p.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} needs a type annotation")
        properties[p.name] = _json_type(hints[p.name], f"tool {name!r}, parameter {p.name!r}")
        if p.name in docs:
            properties[p.name]["description"] = docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    schema = {"name": name, "description": description, "parameters": parameters}
    return Tool(name, fn, {"type": "function", "function": schema})


def resolve_tool(spec: str | Callable[..., Any]) -> Tool:
    """A built-in tool name (`BUILTIN_TOOLS`), `module:function`, or a function."""
    if callable(spec):
        return make_tool(spec)
    if spec in BUILTIN_TOOLS:
        return make_tool(BUILTIN_TOOLS[spec], spec)
    module, sep, attr = spec.partition(":")
    if not sep:
        known = sorted(BUILTIN_TOOLS)
        raise ValueError(f"env.tools: {spec!r} is not one of {known} nor 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"env.tools: cannot import {spec!r}: {e}") from e
    return make_tool(fn, attr)


def call_tool(tool: Tool, arguments: Any, timeout_s: float) -> tuple[str, bool, float]:
    """Runs `tool` on `arguments` (a dict) within `timeout_s`; returns (text, ok, seconds).
    Never raises: failures are "error: ..." texts with ok False."""
    if not isinstance(arguments, dict):
        return f"error: {tool.name} takes an object of arguments, got {arguments!r}", False, 0.0
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as e:
        return f"error: bad arguments for {tool.name}: {e}", False, 0.0
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = tool.fn(**arguments)
        except BaseException as e:  # reported to the model, never raised
            box["error"] = f"{type(e).__name__}: {e}"

    start = time.perf_counter()
    thread = threading.Thread(target=run, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = time.perf_counter() - start
    if thread.is_alive():
        return f"error: {tool.name} timed out after {timeout_s:g} s", False, seconds
    if "error" in box:
        return f"error: {box['error']}", False, seconds
    value = box.get("value")
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text, True, seconds


# ---- built-in tools -----------------------------------------------------------------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_DIGITS = 1000


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        digits = abs(right) * math.log10(max(abs(left), 2))
        if isinstance(node.op, ast.Pow) and digits > _MAX_DIGITS:
            raise ValueError(f"the result would have more than {_MAX_DIGITS} digits")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
      expression: numbers with + - * / // % ** and parentheses, e.g. "12345 * (678 + 9)".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    value = _evaluate(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints.

    Args:
      code: the program; its standard output is the result.
    """
    from rlvr_jax.rewards.code import SandboxLimits
    from rlvr_jax.rewards.code.sandbox import run_sandboxed

    (outcome,) = run_sandboxed(
        code, [{"kind": "stdio", "stdin": ""}], limits=SandboxLimits(timeout_s=5.0)
    )
    if outcome.status != "ok":
        raise RuntimeError(f"{outcome.status}: {outcome.detail}".strip(": "))
    return outcome.stdout


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {
    "calculator": calculator,
    "lookup": lookup,
    "python": python,
}
"""Tools `env.tools` may name."""
