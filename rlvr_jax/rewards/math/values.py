"""Values of parsed answers, and bounded construction of SymPy numbers.

A parsed answer is a SymPy expression or one of the structures below (tuples/intervals, sets,
unions, matrices, relations). Numbers are built only through the checked helpers here, which
refuse results over a size budget before SymPy computes them: `safe_pow` refuses a^b when
|b|·log2|a| exceeds `MAX_BITS` (a power tower never evaluates), `small_int` bounds factorial
and binomial arguments, `check_size` bounds every exact rational produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import sympy

MAX_BITS = 100_000
"""Largest numerator or denominator (bits) of any exact rational built while parsing."""
MAX_EXPONENT = 4096
"""Largest |integer exponent| on a non-rational or symbolic base."""
MAX_FACTORIAL = 4000
"""Largest n in n! or binom(n, k) that is evaluated."""

PM = sympy.Symbol("\\pm")
"""Placeholder sign of ±: `a \\pm b` parses to a + PM*b and is expanded to {a+b, a-b}."""


class ParseError(ValueError):
    """The text is outside the grammar or over a size limit."""


@dataclass(frozen=True)
class Bracketed:
    """An ordered tuple or an interval: `(1, 2)`, `[0, \\infty)`."""

    open: str
    close: str
    items: tuple[Value, ...]


@dataclass(frozen=True)
class SetValue:
    """An unordered collection: `\\{1, 2\\}` or a bare list `1, 2`."""

    items: tuple[Value, ...]


@dataclass(frozen=True)
class UnionValue:
    """Parts joined by `\\cup` (unordered)."""

    parts: tuple[Value, ...]


@dataclass(frozen=True)
class MatrixValue:
    """A matrix (or column vector) from a LaTeX matrix environment."""

    rows: tuple[tuple[sympy.Expr, ...], ...]


@dataclass(frozen=True)
class Relation:
    """`operands[0] ops[0] operands[1] ...`, ops in {"=", "!=", "<", "<=", ">", ">="}."""

    operands: tuple[sympy.Expr, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Assignment:
    """`x = (1, 2)`, `x \\in [0, 1]`: a variable given a structured (non-scalar) value."""

    var: sympy.Symbol
    value: Value


Value = Union[  # noqa: UP007
    sympy.Expr, Bracketed, SetValue, UnionValue, MatrixValue, Relation, Assignment
]


def bits(x: sympy.Rational) -> int:
    """Bits of the larger of numerator and denominator."""
    return max(int(x.p).bit_length(), int(x.q).bit_length())


def describe(x: sympy.Expr) -> str:
    """A short description of a value for error messages (huge integers are not printed)."""
    if isinstance(x, sympy.Rational) and bits(x) > 256:
        return f"<{bits(x)}-bit number>"
    return str(x)[:80]


def check_size(x: sympy.Expr) -> sympy.Expr:
    """x itself; a ParseError when it is a rational over the size budget."""
    if isinstance(x, sympy.Rational) and bits(x) > MAX_BITS:
        raise ParseError(f"number larger than {MAX_BITS} bits")
    return x


def as_expr(v: Value, what: str) -> sympy.Expr:
    """v when it is a scalar expression; a ParseError naming `what` otherwise."""
    if not isinstance(v, sympy.Expr):
        raise ParseError(f"{what} needs a number or expression, got {type(v).__name__}")
    return v


def safe_pow(base: sympy.Expr, exp: sympy.Expr) -> sympy.Expr:
    """base**exp, refused when the exact result would exceed the size budget."""
    if isinstance(exp, sympy.Rational) and base not in (0, 1, -1) and exp != 0:
        magnitude = abs(exp)
        if isinstance(base, sympy.Rational):
            bits = max(math.log2(abs(int(base.p))), math.log2(int(base.q)))
            if magnitude * bits > MAX_BITS:
                raise ParseError(f"power too large: ({describe(base)})^({describe(exp)})")
        elif magnitude > MAX_EXPONENT:
            raise ParseError(f"exponent {describe(exp)} larger than {MAX_EXPONENT}")
        if exp.q > MAX_EXPONENT:
            raise ParseError(f"root index {describe(exp)} larger than {MAX_EXPONENT}")
    return check_size(sympy.Pow(base, exp))


def small_int(x: sympy.Expr, what: str) -> sympy.Integer | None:
    """The argument as a bounded non-negative integer, None if symbolic; refuses the rest."""
    if not x.is_number:
        return None
    if not (isinstance(x, sympy.Integer) and 0 <= x <= MAX_FACTORIAL):
        raise ParseError(
            f"{what} of {describe(x)} is not evaluated (need an integer in [0, {MAX_FACTORIAL}])"
        )
    return x
