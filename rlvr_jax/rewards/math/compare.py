"""Structural and symbolic equality of parsed answers (runs inside a killable worker).

Structure first: tuples and intervals are ordered and keep their brackets, sets and `\\cup`
unions are unordered, matrices compare entry by entry, `a \\pm b` is the set {a+b, a-b}, a
`x = ...` prefix is dropped (`n = 2, 3` is the set {2, 3}), equations compare as equations (equal
up to a non-zero factor) and inequalities as intervals or up to a positive factor.

Scalars: exact rationals compare exactly (1/2004! ≠ 1/2006!). Otherwise d = a − b must be shown
to be zero: structurally, by `expand`, `simplify`, or `Expr.equals`. A quick numeric check first
rejects d that evaluates (with SymPy's guaranteed precision) to a clear non-zero at a few
rational points; numeric closeness is never accepted as equality.
"""

from __future__ import annotations

import random

import sympy

from rlvr_jax.rewards.math.normalize import Normalized, normalize
from rlvr_jax.rewards.math.parse import parse_answer
from rlvr_jax.rewards.math.values import (
    PM,
    Assignment,
    Bracketed,
    MatrixValue,
    ParseError,
    Relation,
    SetValue,
    UnionValue,
    Value,
)

_PROBE_POINTS = 3
_PROBE_DIGITS = 30
_INFINITIES = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)


def _numerically_nonzero(d: sympy.Expr) -> bool:
    """True when d is certainly non-zero: at a random rational point (for each free symbol) it
    evaluates to a number whose value SymPy reports with real precision. False = don't know."""
    rng = random.Random(0)
    symbols = sorted(d.free_symbols, key=str)
    for _ in range(_PROBE_POINTS if symbols else 1):
        point = {s: sympy.Rational(rng.randint(11, 97), rng.randint(13, 41)) for s in symbols}
        try:
            value = d.subs(point).evalf(_PROBE_DIGITS)
        except (ValueError, TypeError, ZeroDivisionError, ArithmeticError):
            continue
        if not value.is_number or value.has(*_INFINITIES):
            continue
        for part in sympy.re(value), sympy.im(value):
            if isinstance(part, sympy.Float) and part != 0 and part._prec > 20:
                return True
    return False


def exprs_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Symbolic equality of two scalar expressions (see module docstring)."""
    if a == b:
        return True
    if a.has(*_INFINITIES) or b.has(*_INFINITIES):
        return False
    if isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
        return False  # exact and already compared
    d = a - b
    if d == 0:
        return True
    if _numerically_nonzero(d):
        return False
    if sympy.expand(d) == 0 or sympy.simplify(d) == 0:
        return True
    return d.equals(0) is True


def _expand_pm(v: Value) -> Value:
    if isinstance(v, sympy.Expr) and v.has(PM):
        return SetValue((v.subs(PM, 1), v.subs(PM, -1)))
    return v


def _split_assignment(v: Value) -> tuple[sympy.Symbol | None, Value]:
    """`x = 5` → (x, 5); `x \\in [0, 1]` → (x, [0, 1]); anything else → (None, v)."""
    if isinstance(v, Assignment):
        return v.var, v.value
    if (
        isinstance(v, Relation)
        and v.ops == ("=",)
        and isinstance(v.operands[0], sympy.Symbol)
        and v.operands[0] != PM
    ):
        return v.operands[0], v.operands[1]
    return None, v


def _canonical(v: Value) -> Value:
    v = _expand_pm(v)
    if isinstance(v, SetValue) and len(v.items) == 1:
        return _canonical(v.items[0])
    if isinstance(v, UnionValue) and len(v.parts) == 1:
        return _canonical(v.parts[0])
    return v


def _unordered_equal(xs: tuple[Value, ...], ys: tuple[Value, ...]) -> bool:
    if len(xs) != len(ys):
        return False
    unused = list(ys)
    for x in xs:
        match = next((i for i, y in enumerate(unused) if values_equal(x, y)), None)
        if match is None:
            return False
        unused.pop(match)
    return True


def _relation_as_interval(r: Relation) -> Bracketed | None:
    """`x > 3` → (3, ∞), `-1 \\leq x < 2` → [-1, 2); None when it is not of that shape."""
    flipped = _flip_to_less(r)
    if len(flipped.ops) == 1:
        lo, hi = flipped.operands
        if isinstance(hi, sympy.Symbol) and lo.is_number:  # lo < x
            return Bracketed("(" if flipped.ops[0] == "<" else "[", ")", (lo, sympy.oo))
        if isinstance(lo, sympy.Symbol) and hi.is_number:  # x < hi
            return Bracketed("(", ")" if flipped.ops[0] == "<" else "]", (-sympy.oo, hi))
        return None
    if len(flipped.ops) == 2 and isinstance(flipped.operands[1], sympy.Symbol):
        lo, _, hi = flipped.operands
        if lo.is_number and hi.is_number and set(flipped.ops) <= {"<", "<="}:
            left = "(" if flipped.ops[0] == "<" else "["
            right = ")" if flipped.ops[1] == "<" else "]"
            return Bracketed(left, right, (lo, hi))
    return None


def _flip_to_less(r: Relation) -> Relation:
    """Rewrites `a > b > c` as `c < b < a` (so only =, !=, <, <= remain)."""
    if any(op in (">", ">=") for op in r.ops):
        flip = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "=", "!=": "!="}
        return Relation(r.operands[::-1], tuple(flip[op] for op in reversed(r.ops)))
    return r


def _relations_equal(a: Relation, b: Relation) -> bool:
    a, b = _flip_to_less(a), _flip_to_less(b)
    if a.ops != b.ops:
        return False
    if len(a.ops) == 1:
        da = a.operands[0] - a.operands[1]
        db = b.operands[0] - b.operands[1]
        if exprs_equal(da, db):
            return True
        if db == 0 or da == 0:
            return False
        ratio = sympy.simplify(da / db)
        if not (ratio.is_number and ratio.is_real and ratio != 0):
            return False
        return a.ops[0] in ("=", "!=") or bool(ratio > 0)
    return all(exprs_equal(x, y) for x, y in zip(a.operands, b.operands))


def values_equal(a: Value, b: Value) -> bool:
    """Equality of two parsed answers (see module docstring)."""
    a, b = _canonical(a), _canonical(b)
    var_a, a = _split_assignment(a)
    var_b, b = _split_assignment(b)
    if var_a is not None and var_b is not None and var_a != var_b:
        return False
    if (var_a is None) != (var_b is None):  # `y = 2x+1` against an equation `2y = 4x+2`
        other = b if var_a is not None else a
        if isinstance(other, Relation) and isinstance(a if var_a is not None else b, sympy.Expr):
            lhs = var_a if var_a is not None else var_b
            rhs = a if var_a is not None else b
            return _relations_equal(Relation((lhs, rhs), ("=",)), other)
    a, b = _canonical(a), _canonical(b)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return exprs_equal(a, b)
    if isinstance(a, SetValue) and isinstance(b, SetValue):
        return _unordered_equal(a.items, b.items)
    if isinstance(a, UnionValue) and isinstance(b, UnionValue):
        return _unordered_equal(a.parts, b.parts)
    if isinstance(a, Bracketed) and isinstance(b, Bracketed):
        return (
            (a.open, a.close) == (b.open, b.close)
            and len(a.items) == len(b.items)
            and all(values_equal(x, y) for x, y in zip(a.items, b.items))
        )
    if isinstance(a, MatrixValue) and isinstance(b, MatrixValue):
        return (
            len(a.rows) == len(b.rows)
            and all(len(x) == len(y) for x, y in zip(a.rows, b.rows))
            and all(exprs_equal(x, y) for ra, rb in zip(a.rows, b.rows) for x, y in zip(ra, rb))
        )
    if isinstance(a, Relation) and isinstance(b, Relation):
        if _relations_equal(a, b):
            return True
        ia, ib = _relation_as_interval(a), _relation_as_interval(b)
        return ia is not None and ib is not None and values_equal(ia, ib)
    if isinstance(a, Relation) and isinstance(b, Bracketed | UnionValue):
        interval = _relation_as_interval(a)
        return interval is not None and values_equal(interval, b)
    if isinstance(b, Relation) and isinstance(a, Bracketed | UnionValue):
        interval = _relation_as_interval(b)
        return interval is not None and values_equal(a, interval)
    return False


def _scaled(v: Value, factor: sympy.Rational) -> Value | None:
    return v * factor if isinstance(v, sympy.Expr) else None


def normalized_match(answer: Normalized, gold: Normalized) -> bool:
    """Parses both normalised strings and compares them; a percent sign on one side only also
    tries the value divided by 100 (50% = 0.5). Unparseable → False (strings already differ)."""
    try:
        a, g = parse_answer(answer.text), parse_answer(gold.text)
    except (ParseError, ValueError, TypeError, ArithmeticError, RecursionError):
        return False
    if values_equal(a, g):
        return True
    if answer.percent != gold.percent:
        hundredth = sympy.Rational(1, 100)
        a2 = _scaled(a, hundredth) if answer.percent else a
        g2 = _scaled(g, hundredth) if gold.percent else g
        return a2 is not None and g2 is not None and values_equal(a2, g2)
    return False


def symbolic_match_any(answer: str, golds: tuple[str, ...]) -> bool:
    """Worker entry point: True if the extracted answer equals any gold answer."""
    normalized = normalize(answer)
    for gold in golds:
        try:
            if normalized_match(normalized, normalize(gold)):
                return True
        except (ValueError, TypeError, ArithmeticError, RecursionError, AttributeError):
            continue  # SymPy failing on odd input counts as "not shown equal"
    return False
