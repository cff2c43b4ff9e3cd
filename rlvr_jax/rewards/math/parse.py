"""A small, bounded recursive-descent parser: normalised LaTeX answer → SymPy objects.

Model text is never given to `eval`, `exec` or `sympify`. The grammar is the whitelist below;
anything else is a `ParseError` (the caller then falls back to string comparison).

    answer   := item ("," item)*                 several items: an unordered `SetValue`
    item     := relation ("\\cup" relation)*     several parts: a `UnionValue`
    relation := sum (relop sum)*                 = \\neq < > \\leq \\geq (chains allowed);
                                                 `x = (1, 2)`: an `Assignment`
    sum      := term (("+" | "-" | "\\pm" | "\\mp") term)*
    term     := unary (("*" | "\\cdot" | "\\times" | "/" | "\\div") unary | power)*
    unary    := ("-" | "+" | "\\pm" | "\\mp") unary | power
    power    := postfix ("^" exponent)?          right-associative
    postfix  := primary "!"*
    primary  := number | letter | word | greek | \\pi | \\infty | \\emptyset
              | "(" answer ")" | "[" answer "]"  (mixed "(...]" are intervals)
              | "{" answer "}" | "\\{" answer "\\}" | "|" sum "|"
              | \\frac{.}{.} | \\sqrt[n]{.} | \\binom{.}{.} | function argument
              | \\begin{pmatrix} ... \\end{pmatrix} (and bmatrix, matrix, ...)

Limits make evaluation bounded before SymPy ever sees a number: input length, token count,
nesting depth and digits per literal here; the size of every number built (powers, factorials,
binomials, rationals) in `values`. Decimals become exact rationals (0.1 = 1/10):
there is no floating point anywhere, so 1/2004! and 1/2006! stay different.

Conventions: `e` is Euler's number and `i` the imaginary unit; `\\log` is the natural log
(`\\log_b x` has base b); a run of letters is one symbol (`xy`, `Evelyn`), never a product of
letters, so "no" and "on" differ; `1\\frac{3}{4}` is the mixed number 7/4; `\\pm` becomes a
placeholder sign (`PM`) that the comparison expands into two values.
"""

from __future__ import annotations

import sympy

from rlvr_jax.rewards.math.lexer import Tok, tokenize
from rlvr_jax.rewards.math.values import (
    MAX_EXPONENT,
    PM,
    Assignment,
    Bracketed,
    MatrixValue,
    ParseError,
    Relation,
    SetValue,
    UnionValue,
    Value,
    as_expr,
    check_size,
    describe,
    safe_pow,
    small_int,
)

MAX_DEPTH = 48
"""Deepest nesting of brackets / unary operators / powers."""
MAX_DIGITS = 400
"""Most digits in one numeric literal."""
MAX_ITEMS = 64
"""Most items in a list, set, tuple or matrix."""

_RELOPS = {"=": "=", "<": "<", ">": ">", "\\leq": "<=", "\\geq": ">=", "\\neq": "!="}
_RELOPS |= {"\\lt": "<", "\\gt": ">"}
_SIGNS = {"+": 1, "-": -1, "\\pm": PM, "\\mp": -PM}
_MUL = ("*", "\\cdot", "\\times")
_DIV = ("/", "\\div")
_MATRIX_ENVS = ("pmatrix", "bmatrix", "matrix", "Bmatrix", "vmatrix", "smallmatrix", "array")
_GREEK = frozenset((
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon",
    "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma",
    "Upsilon", "Phi", "Psi", "Omega",
))  # fmt: skip
_FUNCTIONS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot,
    "sec": sympy.sec, "csc": sympy.csc, "arcsin": sympy.asin, "arccos": sympy.acos,
    "arctan": sympy.atan, "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh,
    "ln": sympy.log, "log": sympy.log, "exp": sympy.exp, "sqrt": sympy.sqrt,
}  # fmt: skip
_INVERSE = {"sin": sympy.asin, "cos": sympy.acos, "tan": sympy.atan}
_CONSTANTS = {"pi": sympy.pi, "infty": sympy.oo, "e": sympy.E, "i": sympy.I}
_PRIMARY_COMMANDS = ("frac", "sqrt", "binom", "pi", "infty", "emptyset", "{")


class _Parser:
    """Recursive descent over a token list; one method per grammar rule (module docstring)."""

    def __init__(self, tokens: list[Tok]):
        self.toks = tokens
        self.pos = 0
        self.depth = 0

    # -- token helpers -------------------------------------------------------------------
    def peek(self, offset: int = 0) -> Tok | None:
        i = self.pos + offset
        return self.toks[i] if i < len(self.toks) else None

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind in ("sym", "cmd") and tok.text in texts

    def take(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end of answer")
        self.pos += 1
        return tok

    def accept(self, text: str) -> bool:
        """Takes the next token when it is `text`."""
        if not self.at(text):
            return False
        self.pos += 1
        return True

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise ParseError(f"expected {text!r}, got {tok.text!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError(f"nesting deeper than {MAX_DEPTH}")

    # -- grammar -------------------------------------------------------------------------
    def answer(self, closers: tuple[str, ...] = ()) -> list[Value]:
        if closers and self.at(*closers):
            return []
        items = [self.item()]
        while self.accept(","):
            items.append(self.item())
            if len(items) > MAX_ITEMS:
                raise ParseError(f"more than {MAX_ITEMS} items")
        return items

    def item(self) -> Value:
        parts = [self.relation()]
        while self.accept("\\cup"):
            parts.append(self.relation())
        if len(parts) == 1:
            return parts[0]
        if isinstance(parts[0], Assignment):  # x \in (-oo, 1) \cup (2, oo)
            return Assignment(parts[0].var, UnionValue((parts[0].value, *parts[1:])))
        return UnionValue(tuple(parts))

    def relation(self) -> Value:
        first = self.sum()
        operands, ops = [first], []
        while self.at(*_RELOPS):
            ops.append(_RELOPS[self.take().text])
            rhs = self.sum()
            structured = not isinstance(rhs, sympy.Expr)
            if ops == ["="] and isinstance(first, sympy.Symbol) and structured:
                if self.at(*_RELOPS):
                    raise ParseError("a relation chain cannot hold a tuple, set or interval")
                return Assignment(first, rhs)
            operands.append(as_expr(rhs, "a relation"))
        if not ops:
            return first
        return Relation(tuple(as_expr(o, "a relation") for o in operands), tuple(ops))

    def sum(self) -> Value:
        left = self.term()
        while self.at("+", "-", "\\pm", "\\mp"):
            op = self.take().text
            right = as_expr(self.term(), f"'{op}'")
            left = as_expr(left, f"'{op}'")
            left = check_size(left + _SIGNS[op] * right)
        return left

    def term(self) -> Value:
        left = self.unary()
        while True:
            if self.at(*_MUL, *_DIV):
                op = self.take().text
                right = as_expr(self.unary(), f"'{op}'")
                left = as_expr(left, f"'{op}'")
                if op in _DIV:
                    if right == 0:
                        raise ParseError("division by zero")
                    right = 1 / right
                left = check_size(left * right)
            elif self.starts_primary():
                if self.peek().kind == "num" and self.toks[self.pos - 1].kind == "num":  # type: ignore[union-attr]
                    raise ParseError("two numbers in a row")
                right = as_expr(self.power(), "a product")
                left = check_size(as_expr(left, "a product") * right)
            else:
                return left

    def unary(self) -> Value:
        if self.at("-", "+", "\\pm", "\\mp"):
            op = self.take().text
            self.enter()
            operand = as_expr(self.unary(), f"'{op}'")
            self.depth -= 1
            return _SIGNS[op] * operand
        return self.power()

    def power(self) -> Value:
        base = self.postfix()
        if not self.accept("^"):
            return base
        self.enter()
        exp = self.exponent()
        self.depth -= 1
        return safe_pow(as_expr(base, "'^'"), exp)

    def exponent(self) -> sympy.Expr:
        if self.at("{"):
            return as_expr(self.group("{", "}"), "an exponent")
        if self.at("-", "+"):
            sign = -1 if self.take().text == "-" else 1
            return sign * as_expr(self.power(), "an exponent")
        return as_expr(self.power(), "an exponent")

    def postfix(self) -> Value:
        value = self.primary()
        while self.accept("!"):
            if self.at("!"):
                raise ParseError("double factorial is not supported")
            arg = as_expr(value, "'!'")
            n = small_int(arg, "factorial")
            value = sympy.factorial(n if n is not None else arg)
        return value

    def starts_primary(self) -> bool:
        tok = self.peek()
        if tok is None:
            return False
        if tok.kind in ("num", "word", "begin"):
            return True
        if tok.kind == "cmd":
            name = tok.text[1:]
            return name in _PRIMARY_COMMANDS or name in _GREEK or name in _FUNCTIONS
        return tok.text in ("(", "[", "{")

    def group(self, open_: str, close: str) -> Value:
        self.expect(open_)
        self.enter()
        items = self.answer((close,))
        self.depth -= 1
        self.expect(close)
        if len(items) == 1:
            return items[0]
        return SetValue(tuple(items))

    def primary(self) -> Value:
        tok = self.take()
        self.enter()
        try:
            return self._primary(tok)
        finally:
            self.depth -= 1

    def _primary(self, tok: Tok) -> Value:
        if tok.kind == "num":
            if len(tok.text) > MAX_DIGITS:
                raise ParseError(f"number with more than {MAX_DIGITS} digits")
            return sympy.Rational(tok.text) + self.mixed_fraction(tok)
        if tok.kind == "word":
            return self.word(tok.text)
        if tok.kind == "begin":
            return self.matrix(tok.text)
        if tok.text in ("(", "["):
            items = self.answer((")", "]"))
            close = self.take().text
            if close not in (")", "]"):
                raise ParseError(f"{tok.text!r} closed by {close!r}")
            if len(items) == 1 and isinstance(items[0], sympy.Expr):
                if tok.text + close in ("()", "[]"):
                    return items[0]
                raise ParseError(f"one-element interval {tok.text}...{close}")
            if len(items) == 1:
                return items[0]
            return Bracketed(tok.text, close, tuple(items))
        if tok.text == "{":
            self.pos -= 1
            return self.group("{", "}")
        if tok.text == "\\{":
            items = self.answer(("\\}",))
            self.expect("\\}")
            return SetValue(tuple(items))
        if tok.text == "|":
            inner = as_expr(self.sum(), "'|...|'")
            self.expect("|")
            return sympy.Abs(inner)
        if tok.kind == "cmd":
            return self.command(tok.text[1:])
        raise ParseError(f"unexpected {tok.text!r}")

    def mixed_fraction(self, whole: Tok) -> sympy.Rational:
        """The 3/4 of a mixed number `1\\frac{3}{4}` (integer, then a fraction of integer
        literals), consumed; 0 when the next tokens are not such a fraction."""
        pattern = ("\\frac", "{", None, "}", "{", None, "}")
        toks = [self.peek(i) for i in range(len(pattern))]
        if "." in whole.text or any(t is None for t in toks):
            return sympy.Integer(0)
        for tok, want in zip(toks, pattern):
            if (want is None and tok.kind != "num") or (want is not None and tok.text != want):
                return sympy.Integer(0)
        num, den = sympy.Rational(toks[2].text), sympy.Rational(toks[5].text)
        if den == 0 or num.q != 1 or den.q != 1 or num >= den:
            return sympy.Integer(0)
        self.pos += len(pattern)
        return num / den

    def word(self, text: str) -> Value:
        if text in _FUNCTIONS:
            return self.function(text)
        if self.accept("_"):  # x_1, a_{10}: one symbol
            return sympy.Symbol(f"{text}_{self.subscript()}")
        if text == "pi" or (len(text) == 1 and text in _CONSTANTS):
            return _CONSTANTS[text]
        return sympy.Symbol(text)

    def subscript(self) -> str:
        if not self.at("{"):
            return self.take().text
        self.take()
        parts = []
        while not self.at("}"):
            parts.append(self.take().text)
            if len(parts) > 16:
                raise ParseError("subscript too long")
        self.take()
        return "".join(parts)

    def arg(self) -> sympy.Expr:
        """A command argument: `{...}` or a single token (`\\frac12`)."""
        if self.at("{"):
            return as_expr(self.group("{", "}"), "a command argument")
        tok = self.take()
        if tok.kind == "num" and len(tok.text) == 1:
            return sympy.Integer(tok.text)
        if tok.kind == "word" and len(tok.text) == 1:
            return as_expr(self.word(tok.text), "a command argument")
        if tok.kind == "cmd":
            return as_expr(self.command(tok.text[1:]), "a command argument")
        raise ParseError(f"bad command argument {tok.text!r}")

    def command(self, name: str) -> Value:
        if name == "frac":
            num, den = self.arg(), self.arg()
            if den == 0:
                raise ParseError("division by zero")
            return check_size(num / den)
        if name == "sqrt":
            index = None
            if self.accept("["):
                index = as_expr(self.sum(), "a root index")
                self.expect("]")
            radicand = self.arg()
            if index is None:
                return sympy.sqrt(radicand)
            if not (isinstance(index, sympy.Integer) and 2 <= index <= MAX_EXPONENT):
                raise ParseError(
                    f"root index {describe(index)} is not an integer in [2, {MAX_EXPONENT}]"
                )
            if radicand.is_number and radicand.is_negative and index % 2 == 1:
                return sympy.real_root(radicand, index)
            return sympy.root(radicand, index)
        if name == "binom":
            n, k = self.arg(), self.arg()
            ni, ki = small_int(n, "binom"), small_int(k, "binom")
            return sympy.binomial(ni if ni is not None else n, ki if ki is not None else k)
        if name in _CONSTANTS and name not in ("e", "i"):
            return _CONSTANTS[name]
        if name == "emptyset":
            return SetValue(())
        if name in _GREEK:
            return sympy.Symbol(name)
        if name in _FUNCTIONS:
            return self.function(name)
        raise ParseError(f"unsupported command \\{name}")

    def function(self, name: str) -> sympy.Expr:
        fn = _FUNCTIONS[name]
        power = None
        base = None
        if name == "log" and self.at("_"):
            self.take()
            base = self.arg()
        if self.accept("^"):
            power = self.exponent()
            if power == -1 and name in _INVERSE:
                fn, power = _INVERSE[name], None
        if self.accept("("):
            argument = as_expr(self.sum(), f"\\{name}")
            self.expect(")")
        elif self.at("{"):
            argument = as_expr(self.group("{", "}"), f"\\{name}")
        else:  # \sin 2x: the argument runs over the following factors that are not functions
            argument = as_expr(self.power(), f"\\{name}")
            while self.starts_primary() and not self._starts_function():
                argument = check_size(argument * as_expr(self.power(), f"\\{name}"))
        value = fn(argument) if base is None else sympy.log(argument, base)
        return value if power is None else safe_pow(value, power)

    def _starts_function(self) -> bool:
        tok = self.peek()
        return tok is not None and tok.text.lstrip("\\") in _FUNCTIONS

    def matrix(self, env: str) -> MatrixValue:
        if env not in _MATRIX_ENVS:
            raise ParseError(f"unsupported environment {env}")
        if env == "array" and self.at("{"):  # column spec {cc}
            self.take()
            while not self.at("}"):
                self.take()
            self.take()
        rows: list[tuple[sympy.Expr, ...]] = []
        row: list[sympy.Expr] = []
        while True:
            tok = self.peek()
            if tok is None:
                raise ParseError(f"unterminated \\begin{{{env}}}")
            if tok.kind == "end":
                self.take()
                if tok.text != env:
                    raise ParseError(f"\\begin{{{env}}} closed by \\end{{{tok.text}}}")
                break
            row.append(as_expr(self.sum(), "a matrix entry"))
            if not self.accept("&") and self.accept("\\\\"):
                rows.append(tuple(row))
                row = []
            if sum(map(len, rows)) + len(row) > MAX_ITEMS * 4:
                raise ParseError("matrix too large")
        if row:
            rows.append(tuple(row))
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged or empty matrix")
        return MatrixValue(tuple(rows))


def parse_answer(text: str) -> Value:
    """Parses a normalised answer into a `Value`; raises ParseError outside the grammar."""
    tokens = tokenize(text)
    if not tokens:
        raise ParseError("empty answer")
    parser = _Parser(tokens)
    items = parser.answer()
    if parser.peek() is not None:
        raise ParseError(f"unexpected {parser.peek().text!r} after the answer")  # type: ignore[union-attr]
    return items[0] if len(items) == 1 else SetValue(tuple(items))
