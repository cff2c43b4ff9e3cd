"""Inline fast paths of the math verifier: string, plain-number and multiple-choice matches.

These run in the caller's process (no SymPy, bounded regular expressions, exact `Fraction`
arithmetic on literals of bounded length) and decide most realistic cases; what they cannot
decide goes to the symbolic comparison in a worker process.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr_jax.rewards.math.normalize import (
    Normalized,
    mcq_gold_letter,
    mcq_response_letter,
    normalize,
    split_assignment,
)

_MAX_LITERAL = 200
_DECIMAL = re.compile(r"^[+-]?\d+(?:\.\d+)?$")
_SLASH = re.compile(r"^([+-]?\d+)/(\d+)$")
_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z ]+$")


def simple_number(text: str) -> Fraction | None:
    """An integer, decimal, a/b or \\frac{a}{b} literal as an exact Fraction; else None."""
    if len(text) > _MAX_LITERAL:
        return None
    if _DECIMAL.match(text):
        return Fraction(text)
    if (m := _SLASH.match(text)) is not None:
        return None if int(m.group(2)) == 0 else Fraction(int(m.group(1)), int(m.group(2)))
    if (m := _FRAC.match(text)) is not None:
        den = int(m.group(3))
        if den == 0:
            return None
        value = Fraction(int(m.group(2)), den)
        return -value if m.group(1) == "-" else value
    return None


def _numbers_match(answer: Normalized, gold: Normalized, a: Fraction, g: Fraction) -> bool:
    if a == g:
        return True
    if answer.percent != gold.percent:  # 50% against 0.5
        scale_a = Fraction(1, 100) if answer.percent else 1
        scale_g = Fraction(1, 100) if gold.percent else 1
        return a * scale_a == g * scale_g
    return False


def quick_match(answer: str, gold: str) -> bool | None:
    """True/False when the fast paths decide; None when the symbolic comparison must."""
    a, g = normalize(answer), normalize(gold)
    if not a.text:
        return False
    if a.text == g.text:
        return True
    if _WORDS.match(a.text) and _WORDS.match(g.text) and len(g.text) > 1:
        return a.text.lower() == g.text.lower()
    letter = mcq_gold_letter(g.text)
    if letter is not None:
        return mcq_response_letter(a.text) == letter
    var_a, rest_a = split_assignment(a.text)
    var_g, rest_g = split_assignment(g.text)
    if var_a is not None and var_g is not None and var_a != var_g:
        return False
    if rest_a == rest_g and (var_a is None or var_g is None):
        return True
    num_a, num_g = simple_number(rest_a), simple_number(rest_g)
    if num_a is not None and num_g is not None:
        return _numbers_match(a, g, num_a, num_g)
    return None
