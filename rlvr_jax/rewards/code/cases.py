"""Test cases of the code verifier: parsed from ground truth, split into what the sandbox may see.

Three kinds of test, as they appear in a data row's `ground_truth`:

- stdio:  `{"stdin": "1 2\\n", "stdout": "3\\n"}` runs the program as a script;
- call:   `{"call": "add", "args": [1, 2], "expected": 3}` (optional `"kwargs": {...}`); a dotted
  name `"Solution.add"` calls `Solution().add(...)`;
- assert: `"assert add(1, 2) == 3"` (any Python test code).

Each case hands the sandbox a `request()` without the expected value and judges the returned
`TestOutcome` in `passed()`, here in the parent. An assert of the form `assert X == Y` is judged
the same way: the sandbox evaluates X (and Y, unless Y is a literal) to canonical JSON, and the
parent compares; the literal never enters the sandbox. Any other assert runs inside the sandbox
with every comparison operand, truth test and boolean operand wrapped in `plain.trusted`, so an
object that lies about `==`, `<` or truthiness fails the test instead of passing it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rlvr_jax.rewards.code import plain
from rlvr_jax.rewards.code.sandbox import TestOutcome


class TestCase(Protocol):
    """A parsed test: what the sandbox runs, and how its outcome is judged."""

    def request(self) -> dict[str, Any]:
        """The JSON request sent into the sandbox (never contains the expected answer)."""
        ...

    def passed(self, outcome: TestOutcome) -> bool:
        """Whether the sandbox outcome passes this test."""
        ...


@dataclass(frozen=True)
class StdioTest:
    """Feed `stdin` to the program run as a script; its stdout must match `stdout`."""

    stdin: str
    stdout: str

    def request(self) -> dict[str, Any]:
        return {"kind": "stdio", "stdin": self.stdin}

    def passed(self, outcome: TestOutcome) -> bool:
        return outcome.status == "ok" and normalize_stdout(outcome.stdout) == normalize_stdout(
            self.stdout
        )


@dataclass(frozen=True)
class CallTest:
    """Call `name(*args, **kwargs)`; the result must equal `expected` (both as canonical JSON)."""

    name: str
    args_json: str
    kwargs_json: str
    expected_json: str

    def request(self) -> dict[str, Any]:
        args, kwargs = json.loads(self.args_json), json.loads(self.kwargs_json)
        return {"kind": "call", "name": self.name, "args": args, "kwargs": kwargs}

    def passed(self, outcome: TestOutcome) -> bool:
        return outcome.status == "ok" and _json_equal(outcome.values, [self.expected_json])


@dataclass(frozen=True)
class AssertEqualTest:
    """`assert X == Y`: the sandbox evaluates `exprs` (X, or X and Y); the parent compares."""

    source: str
    exprs: tuple[str, ...]
    expected_json: str | None
    """Canonical JSON of Y when Y is a literal (then `exprs` is just X), else None."""

    def request(self) -> dict[str, Any]:
        return {"kind": "eval", "exprs": list(self.exprs)}

    def passed(self, outcome: TestOutcome) -> bool:
        if outcome.status != "ok" or len(outcome.values) != len(self.exprs):
            return False
        if self.expected_json is not None:
            return _json_equal(outcome.values, [self.expected_json])
        return _json_equal(outcome.values[:1], outcome.values[1:])


@dataclass(frozen=True)
class AssertTest:
    """Any other test code: passes when it runs to the end inside the sandbox."""

    source: str
    guarded_source: str
    """`source` with comparisons, truth tests and boolean operands wrapped in the trust check."""

    def request(self) -> dict[str, Any]:
        return {"kind": "exec", "source": self.guarded_source}

    def passed(self, outcome: TestOutcome) -> bool:
        return outcome.status == "ok"


def parse_tests(tests: Sequence[Any]) -> list[TestCase]:
    """Parses a list of raw tests; raises ValueError naming the first malformed one."""
    if isinstance(tests, str | bytes | Mapping) or not isinstance(tests, Sequence):
        raise ValueError(f"code tests must be a list, got {type(tests).__name__}")
    if not tests:
        raise ValueError("code tests list is empty")
    return [parse_test(test, index) for index, test in enumerate(tests)]


def parse_test(test: Any, index: int = 0) -> TestCase:
    """One raw test (stdio dict, call dict or assert string) as a TestCase."""
    where = f"code test {index}"
    if isinstance(test, str):
        return _parse_assert(test, where)
    if not isinstance(test, Mapping):
        raise ValueError(f"{where}: expected a dict or an assert string, got {type(test).__name__}")
    if "call" in test:
        return _parse_call(test, where)
    if "stdin" in test or "stdout" in test:
        _check_keys(test, required={"stdin", "stdout"}, optional=set(), where=where)
        for key in ("stdin", "stdout"):
            if not isinstance(test[key], str):
                raise ValueError(
                    f"{where}: {key!r} must be a string, got {type(test[key]).__name__}"
                )
        return StdioTest(stdin=test["stdin"], stdout=test["stdout"])
    raise ValueError(
        f"{where}: a dict test needs 'stdin'/'stdout' or 'call', got keys {sorted(test)}"
    )


def _parse_call(test: Mapping[str, Any], where: str) -> CallTest:
    _check_keys(test, required={"call", "expected"}, optional={"args", "kwargs"}, where=where)
    name = test["call"]
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"{where}: 'call' must be a name like 'f' or 'Solution.f', got {name!r}")
    args = test.get("args", [])
    kwargs = test.get("kwargs", {})
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ValueError(f"{where}: 'args' must be a list, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise ValueError(f"{where}: 'kwargs' must be a dict with string keys, got {kwargs!r}")
    try:
        args_json = json.dumps(list(args), allow_nan=True)
        kwargs_json = json.dumps(dict(kwargs), allow_nan=True)
        expected_json = plain.canonical_json(test["expected"])
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{where}: arguments and expected value must be JSON data: {err}"
        ) from None
    return CallTest(name, args_json, kwargs_json, expected_json)


def _parse_assert(source: str, where: str) -> AssertEqualTest | AssertTest:
    try:
        module = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError) as err:
        raise ValueError(f"{where}: test code does not parse: {err}") from None
    if not module.body:
        raise ValueError(f"{where}: test code is empty")
    statement = module.body[0]
    if len(module.body) == 1 and isinstance(statement, ast.Assert):
        test = statement.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            equal = _assert_equal(source, test.left, test.comparators[0])
            if equal is not None:
                return equal
    guarded = ast.fix_missing_locations(_TrustGuard().visit(module))
    return AssertTest(source=source, guarded_source=ast.unparse(guarded))


def _assert_equal(source: str, left: ast.expr, right: ast.expr) -> AssertEqualTest | None:
    """`X == literal` (either side); else both sides evaluated; None if a literal is not plain."""
    for side, other in ((right, left), (left, right)):
        try:
            literal = ast.literal_eval(side)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        try:
            expected_json = plain.canonical_json(literal)
        except plain.NotPlainError:
            return None
        return AssertEqualTest(source, (ast.unparse(other),), expected_json)
    return AssertEqualTest(source, (ast.unparse(left), ast.unparse(right)), None)


class _TrustGuard(ast.NodeTransformer):
    """Wraps each value a comparison, truth test or boolean operator looks at in `plain.trusted`."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        node.left = _guard(node.left)
        node.comparators = [_guard(item) for item in node.comparators]
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        self.generic_visit(node)
        node.values = [_guard(item) for item in node.values]
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = _guard(node.operand)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        self.generic_visit(node)
        node.test = _guard(node.test)
        return node


def _guard(node: ast.expr) -> ast.expr:
    return ast.Call(func=ast.Name(id=plain.TRUSTED_NAME, ctx=ast.Load()), args=[node], keywords=[])


def _check_keys(
    test: Mapping[str, Any], *, required: set[str], optional: set[str], where: str
) -> None:
    keys = set(test)
    missing = required - keys
    unknown = keys - required - optional
    if missing:
        raise ValueError(f"{where}: missing key(s) {sorted(missing)}")
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")


def _json_equal(actual: Sequence[str], expected: Sequence[str]) -> bool:
    """Compares canonical JSON texts by value (`==` on freshly decoded builtins)."""
    try:
        return [json.loads(text) for text in actual] == [json.loads(text) for text in expected]
    except ValueError:
        return False


def normalize_stdout(text: str) -> list[str]:
    """Lines of `text` with trailing whitespace and trailing blank lines removed."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines
