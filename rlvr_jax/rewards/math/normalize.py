"""String normalisation of a math answer (model's or gold), before comparing or parsing.

Each step is a small pure function; `normalize` applies them in order. The result is a
canonical LaTeX-ish string: math delimiters, spacing commands, `\\left`/`\\right`, `\\text{}`
wrappers, units, degrees, currency, percent signs, thousands separators and trailing periods
are gone; `\\dfrac`/`\\tfrac`/`\\frac12` are `\\frac{1}{2}`; unicode operators are LaTeX
commands; whitespace survives only between two letters (`\\pi r`) or two digits. Percent
signs are recorded in `Normalized.percent` so that 50% can also match 0.5. Units are dropped,
not converted: "12 feet" and "12 inches" both read as 12 (gold answers are bare numbers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlvr_jax.rewards.math.extract import match_brace

_UNICODE = {
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": "\\times ", "\u00b7": "\\cdot ",
    "\u22c5": "\\cdot ", "\u00f7": "\\div ", "\u221a": "\\sqrt", "\u03c0": "\\pi ",
    "\u221e": "\\infty ", "\u2264": "\\leq ", "\u2265": "\\geq ", "\u2260": "\\neq ",
    "\u222a": "\\cup ", "\u00b1": "\\pm ", "\u00b0": "^\\circ", "\u00a0": " ", "\uff0c": ",",
    "\u2026": "\\ldots ", "\u2205": "\\emptyset ",
}  # fmt: skip
_TEXT_COMMANDS = (
    "text", "textbf", "textit", "textrm", "textnormal", "mathrm", "mathbf", "mathit",
    "mbox", "operatorname", "boldsymbol", "textup", "textsf",
)  # fmt: skip
_UNIT_WORDS = (
    "cm", "mm", "km", "meters?", "metres?", "inch(?:es)?", "foot", "feet", "ft", "yards?",
    "yd", "miles?", "mph", "kph", "kg", "mg", "grams?", "kilograms?", "lbs?", "pounds?",
    "ounces?", "oz", "tons?", "liters?", "litres?", "ml", "gallons?", "quarts?", "pints?",
    "seconds?", "secs?", "minutes?", "mins?", "hours?", "hrs?", "days?", "weeks?", "months?",
    "years?", "degrees?", "radians?", "dollars?", "cents?", "euros?", "units?", "usd",
)  # fmt: skip
_SINGLE_LETTER_UNITS = ("m", "g", "s", "h", "l", "in", "sq")  # only inside \text{...}
_UNIT = rf"(?:(?:square|sq\.?|cubic)\s+)?(?:{'|'.join(_UNIT_WORDS)})"
_UNIT_PHRASE = rf"{_UNIT}(?:\s*(?:/|per)\s*{_UNIT})?(?:\s*\^\s*\{{?[23]\}}?)?"
_UNIT_ONLY = re.compile(
    rf"^\s*(?:{_UNIT_PHRASE}|(?:{'|'.join(_SINGLE_LETTER_UNITS)})(?:\s*\^\s*\{{?[23]\}}?)?)\s*$",
    re.IGNORECASE,
)
_TRAILING_UNIT = re.compile(rf"(?<=[\d}}])\s*{_UNIT_PHRASE}\s*$", re.IGNORECASE)
_POWER_AFTER_UNIT = re.compile(r"\s*\^\s*\{?[23]\}?")  # used with .match(s, pos)
_SPACING = re.compile(
    r"(?<!\\)\\[,;:! ]|\\q?quad\b|~|\\displaystyle|\\textstyle"
    r"|\\left(?![a-zA-Z])\.?|\\right(?![a-zA-Z])\.?|\\[bB]ig{1,2}[lr]?(?![a-zA-Z])"
)
_CANONICAL = (
    (re.compile(r"\\[dt]frac(?![a-zA-Z])"), r"\\frac"),
    (re.compile(r"\\[dt]binom(?![a-zA-Z])"), r"\\binom"),
    (re.compile(r"\\(?:leqslant|leq|le)(?![a-zA-Z])|<="), r"\\leq "),
    (re.compile(r"\\(?:geqslant|geq|ge)(?![a-zA-Z])|>="), r"\\geq "),
    (re.compile(r"\\(?:neq|ne)(?![a-zA-Z])"), r"\\neq "),
    (re.compile(r"\\(?:dots|cdots|ldots|dotsc|dotsb)(?![a-zA-Z])|\.\.\."), r"\\ldots "),
    (re.compile(r"\\(?:varnothing|emptyset)(?![a-zA-Z])|\\\{\s*\\\}"), r"\\emptyset "),
    (re.compile(r"\\lbrace(?![a-zA-Z])"), r"\\{"),
    (re.compile(r"\\rbrace(?![a-zA-Z])"), r"\\}"),
    (re.compile(r"\\(?:lvert|rvert|vert|mid)(?![a-zA-Z])"), "|"),
    (re.compile(r"\\ast(?![a-zA-Z])"), "*"),
    (re.compile(r"\\in(?![a-zA-Z])"), "="),  # x \in [0, 1] reads as x = [0, 1]
    (re.compile(r"\\infin(?![a-zA-Z])|\b(?:infinity|inf)\b", re.IGNORECASE), r"\\infty "),
)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])")
_CURRENCY = re.compile(r"\\\$|\$|\u20ac|\u00a3|\u00a5|\\euro(?![a-zA-Z])")
_PERCENT = re.compile(r"\\%|%|\bpercent\b", re.IGNORECASE)
_FRAC_SHORT = (
    (re.compile(r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*([0-9a-zA-Z])\s*\{"), r"\\frac{\1}{"),
    (re.compile(r"\\frac\s*(\{[^{}]*\})\s*([0-9a-zA-Z])"), r"\\frac\1{\2}"),
    (re.compile(r"\\sqrt\s*([0-9a-zA-Z])"), r"\\sqrt{\1}"),
)
_AND_OR = re.compile(r"\s*,?\s*\b(?:and|or)\b\s*")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_SINGLE_CHAR_BRACES = re.compile(r"([\^_])\{(\w)\}(?!\w)")
_DROPPED_SPACE = re.compile(
    r"(?<![A-Za-z0-9]) | (?![A-Za-z0-9])|(?<=[A-Za-z]) (?=\d)|(?<=\d) (?=[A-Za-z])"
)  # a space survives only between two letters or two digits
_SPACED_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d.])")
_LEADING_DOT = re.compile(r"(?<![\d}])\.(\d)")
_VAR_PREFIX = re.compile(r"^([A-Za-z](?:_\{?\w+\}?)?|\\[a-zA-Z]+)=(?!.*=)(.+)$")
_MCQ_GOLD = re.compile(r"^(?:\(([A-Ja-j])\)|([A-J]))$")
_MCQ_RESPONSE = re.compile(
    r"^(?:(?:option|choice)\s*)?(?:\(([A-Ja-j])\)|([A-J])(?=$|[.:)]))", re.IGNORECASE
)


@dataclass(frozen=True)
class Normalized:
    """A normalised answer string."""

    text: str
    """The canonical string."""
    percent: bool
    """Whether a percent sign (or the word) was removed."""


def replace_unicode(s: str) -> str:
    """Unicode math symbols → LaTeX commands (− → -, π → \\pi, ∞ → \\infty, ...)."""
    return "".join(_UNICODE.get(ch, ch) for ch in s)


def strip_math_delimiters(s: str) -> str:
    """Removes surrounding `$...$`, `$$...$$`, `\\(...\\)` and `\\[...\\]`."""
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : len(s) - len(right)].strip()
    return s


def _substitute(s: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    """`s` with each (pattern, replacement) of `rules` applied in turn."""
    for pattern, repl in rules:
        s = pattern.sub(repl, s)
    return s


def remove_spacing(s: str) -> str:
    """Drops spacing commands, `\\left`/`\\right` (and `\\left.`), `\\big` and `\\displaystyle`."""
    return _SPACING.sub(" ", s)


def canonical_commands(s: str) -> str:
    """One spelling per command: `\\dfrac` → `\\frac`, `\\le`/`<=` → `\\leq`, `...` → `\\ldots`."""
    return _substitute(s, _CANONICAL)


def unwrap_text(s: str) -> str:
    """`\\text{...}`-like wrappers → their content; a wrapper holding only a unit (`\\text{ cm}`,
    `\\mbox{inches}^2`) is dropped together with a following `^2`/`^3`."""
    pattern = re.compile(rf"\\(?:{'|'.join(_TEXT_COMMANDS)})\s*(?=\{{)")
    out: list[str] = []
    i = 0
    while (m := pattern.search(s, i)) is not None:
        close = match_brace(s, m.end())
        if close is None:
            break
        out.append(s[i : m.start()])
        content = s[m.end() + 1 : close]
        i = close + 1
        if _UNIT_ONLY.match(content):
            unit_power = _POWER_AFTER_UNIT.match(s, i)
            if unit_power is not None:
                i = unit_power.end()
        else:
            out.append(content)
    out.append(s[i:])
    return "".join(out)


def strip_degrees(s: str) -> str:
    """Removes `^\\circ`, `^{\\circ}`, `\\circ` and `\\degree`."""
    return _DEGREES.sub("", s)


def strip_currency(s: str) -> str:
    """Removes `\\$`, `$`, €, £, ¥."""
    return _CURRENCY.sub("", s)


def strip_percent(s: str) -> tuple[str, bool]:
    """Removes `\\%`, `%` and the word "percent"; says whether there was one."""
    out, n = _PERCENT.subn("", s)
    return out, n > 0


def strip_trailing_units(s: str) -> str:
    """Removes a unit after a number at the end: "12 cm^2" → "12", "5 miles per hour" → "5"."""
    return _TRAILING_UNIT.sub("", s)


def expand_frac_shorthand(s: str) -> str:
    """`\\frac12` → `\\frac{1}{2}`, `\\frac1{x}`, `\\frac{a}2`, `\\sqrt2` → `\\sqrt{2}`."""
    return _substitute(s, _FRAC_SHORT)


def and_or_to_commas(s: str) -> str:
    """Lists written in words: "1, 2 and 3" / "1 or 2" → "1,2,3" / "1,2"."""
    return _AND_OR.sub(",", s)


def remove_thousands(s: str) -> str:
    """1,234,567 → 1234567 and `1{,}000` → 1000. Left alone inside bracketed answers, where
    the comma separates coordinates: "(10,100)" is a point."""
    s = s.replace("{,}", "")
    if s.startswith(("(", "[", "\\{")):
        return s
    return _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s)


def collapse_whitespace(s: str) -> str:
    """Digit groups "1 000 000" are joined; otherwise whitespace only survives between two
    letters (`\\pi r`, `no solution`) or two digits (`\\log_2 8`)."""
    s = re.sub(r"\s+", " ", s.strip())
    s = _SPACED_THOUSANDS.sub(lambda m: m.group(0).replace(" ", ""), s)
    return _DROPPED_SPACE.sub("", s)


def strip_trailing_punctuation(s: str) -> str:
    """Removes trailing `.`, `,`, `;` (a sentence end, not part of the answer)."""
    return s.rstrip(".,; ") if not s.endswith("\\ldots") else s


def tidy_numbers(s: str) -> str:
    """`.5` → `0.5`; `x^{2}` → `x^2` (braces around one character, not before a digit)."""
    s = _LEADING_DOT.sub(r"0.\1", s)
    return _SINGLE_CHAR_BRACES.sub(r"\1\2", s)


def normalize(answer: str) -> Normalized:
    """Applies every step above in order; see the module docstring."""
    s = strip_math_delimiters(replace_unicode(answer))
    s = canonical_commands(remove_spacing(s))
    s = unwrap_text(s)
    s, percent = strip_percent(strip_currency(strip_degrees(s)))
    s = strip_trailing_units(s)
    s = expand_frac_shorthand(s)
    s = and_or_to_commas(s)
    s = collapse_whitespace(s)
    s = remove_thousands(strip_trailing_punctuation(strip_math_delimiters(s)))
    return Normalized(tidy_numbers(s).strip(","), percent)


def split_assignment(s: str) -> tuple[str | None, str]:
    """ "x=5" → ("x", "5"); "y=2x+1" → ("y", "2x+1"); without a `var=` prefix → (None, s)."""
    m = _VAR_PREFIX.match(s)
    return (m.group(1), m.group(2)) if m else (None, s)


def mcq_gold_letter(s: str) -> str | None:
    """The option letter of a multiple-choice gold answer ("C", "(c)"), else None."""
    m = _MCQ_GOLD.match(s)
    return None if m is None else (m.group(1) or m.group(2)).upper()


def mcq_response_letter(s: str) -> str | None:
    """The option letter a response picks: "(B)", "B", "B. 42", "B) 42", "option B"."""
    m = _MCQ_RESPONSE.match(s)
    return None if m is None else (m.group(1) or m.group(2)).upper()
