"""Synthetic multi-step integer arithmetic, answered in `\\boxed{}` and checked by `math`.

A problem is a random expression tree over `+ - *` with `num_ops` operators and operands in
[0, max_operand]; it is rendered with the fewest parentheses that keep its value, and its
answer is computed exactly on the tree. Difficulty grows with the number of operations and the
operand size (`ArithmeticSpec.for_level`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

OPS = ("+", "-", "*")
"""Operators a problem may use."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2}

PROMPT_TEMPLATES = (
    "Compute {expr}. Put your final answer in \\boxed{{}}.",
    "What is the value of {expr}? Give the final answer as \\boxed{{answer}}.",
    "Evaluate the expression {expr} step by step, then write the result in \\boxed{{}}.",
)
"""Phrasings of an arithmetic problem; `{expr}` is the expression."""


@dataclass(frozen=True)
class ArithmeticSpec:
    """The difficulty knob of the arithmetic domain."""

    min_ops: int = 1
    """Fewest operators in an expression."""
    max_ops: int = 3
    """Most operators in an expression."""
    max_operand: int = 20
    """Operands are drawn uniformly from [0, max_operand]."""
    ops: tuple[str, ...] = OPS
    """Operators drawn from (a subset of `+ - *`)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(
                f"ArithmeticSpec needs 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}"
            )
        if self.max_operand < 1:
            raise ValueError(f"ArithmeticSpec.max_operand must be >= 1, got {self.max_operand}")
        unknown = [op for op in self.ops if op not in OPS]
        if unknown or not self.ops:
            raise ValueError(f"ArithmeticSpec.ops must be a non-empty subset of {OPS}: {self.ops}")

    @classmethod
    def for_level(cls, level: int) -> ArithmeticSpec:
        """Level 1 (one op on single digits) to 5 (up to six ops on operands up to 999)."""
        table = {1: (1, 1, 9), 2: (1, 2, 20), 3: (2, 3, 50), 4: (3, 4, 99), 5: (4, 6, 999)}
        if level not in table:
            raise ValueError(f"arithmetic level must be one of {sorted(table)}, got {level}")
        min_ops, max_ops, max_operand = table[level]
        return cls(min_ops=min_ops, max_ops=max_ops, max_operand=max_operand)


@dataclass(frozen=True)
class Node:
    """An expression tree: a leaf holds `value`; an inner node holds `op`, `left`, `right`."""

    value: int | None = None
    op: str | None = None
    left: Node | None = None
    right: Node | None = None


def random_tree(rng: np.random.Generator, num_ops: int, spec: ArithmeticSpec) -> Node:
    """A uniformly split random tree with exactly `num_ops` operators."""
    if num_ops == 0:
        return Node(value=int(rng.integers(0, spec.max_operand + 1)))
    op = spec.ops[int(rng.integers(0, len(spec.ops)))]
    left_ops = int(rng.integers(0, num_ops))
    left = random_tree(rng, left_ops, spec)
    right = random_tree(rng, num_ops - 1 - left_ops, spec)
    return Node(op=op, left=left, right=right)


def apply_op(op: str, a: int, b: int) -> int:
    """`a op b` for one of the operators `+`, `-`, `*`."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def fold(node: Node, step: Callable[[str, int, int], int]) -> int:
    """The tree's value with each operation done by `step(op, a, b)`, innermost first (the
    left operand before the right)."""
    if node.op is None:
        assert node.value is not None
        return node.value
    assert node.left is not None and node.right is not None
    a, b = fold(node.left, step), fold(node.right, step)
    return step(node.op, a, b)


def evaluate(node: Node) -> int:
    """The exact integer value of the tree."""
    return fold(node, apply_op)


def render(node: Node) -> str:
    """The expression as text, `a op b` with spaces, parenthesised only where needed."""
    if node.op is None:
        return str(node.value)
    assert node.left is not None and node.right is not None
    return f"{_operand(node.left, node.op, False)} {node.op} {_operand(node.right, node.op, True)}"


def _operand(child: Node, parent_op: str, is_right: bool) -> str:
    text = render(child)
    if child.op is None:
        return text
    child_prec, parent_prec = _PRECEDENCE[child.op], _PRECEDENCE[parent_op]
    # a - (b + c) and a - (b - c) need parentheses; a + (b - c) and a * (b * c) do not.
    needs = child_prec < parent_prec or (is_right and parent_op == "-" and child_prec == 1)
    return f"({text})" if needs else text


def steps(node: Node) -> list[str]:
    """Worked solution: one `a op b = c` line per operator, innermost first."""
    lines: list[str] = []
    _collect_steps(node, lines)
    return lines


def _collect_steps(node: Node, lines: list[str]) -> int:
    if node.op is None:
        assert node.value is not None
        return node.value
    assert node.left is not None and node.right is not None
    a = _collect_steps(node.left, lines)
    b = _collect_steps(node.right, lines)
    c = evaluate(Node(op=node.op, left=Node(value=a), right=Node(value=b)))
    lines.append(f"{a} {node.op} {b} = {c}")
    return c


def make_problem(rng: np.random.Generator, spec: ArithmeticSpec) -> tuple[str, dict]:
    """One problem: (its canonical key, the data row). The key is the expression text, so two
    rows with the same expression share a key whatever their phrasing."""
    num_ops = int(rng.integers(spec.min_ops, spec.max_ops + 1))
    tree = random_tree(rng, num_ops, spec)
    expr = render(tree)
    template = PROMPT_TEMPLATES[int(rng.integers(0, len(PROMPT_TEMPLATES)))]
    row = {
        "prompt": template.format(expr=expr),
        "ground_truth": str(evaluate(tree)),
        "verifier": "math",
        "domain": "arithmetic",
        "verifier_kwargs": {},
        "expression": expr,
    }
    return expr, row


def parse(expr: str) -> Node:
    """The tree of a `render`ed expression (Python's parser, nothing evaluated); ValueError
    on anything but integers, `+ - *` and parentheses."""
    try:
        body = ast.parse(expr, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from e
    return _from_ast(body, expr)


def _from_ast(node: ast.expr, expr: str) -> Node:
    ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Node(value=node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        left, right = _from_ast(node.left, expr), _from_ast(node.right, expr)
        return Node(op=ops[type(node.op)], left=left, right=right)
    raise ValueError(f"not an arithmetic expression over + - * and integers: {expr!r}")


def reference_response(row: dict) -> str:
    """A correct worked answer for an arithmetic row (for SFT warm-up and tests)."""
    tree = parse(row["expression"])
    return "\n".join([*steps(tree), f"The answer is \\boxed{{{evaluate(tree)}}}."])
