"""A tiny evaluator of the subset of Argo's expressions (expr-lang) that simrun's manifests use.

Strings in single quotes, integers, variables with dots (`lastRetry.exitCode`), `asInt(...)`,
`==`, `!=`, `<`, `<=`, `>`, `>=`, `!`, `&&`, `||`, `cond ? a : b` and parentheses. As in expr,
`==` never converts (`'3' == 3` is false) and an ordering needs two numbers. `substitute`
replaces every `{{=...}}` of a text by its value, as Argo does in a template per attempt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'[^']*')|(?P<number>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!?:(),]))"
)
_FUNCTIONS: dict[str, Callable[[object], object]] = {"asInt": lambda value: int(str(value))}
_ORDER: dict[str, Callable[[int, int], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class ExpressionError(ValueError):
    """A text outside the subset, or a value of the wrong type."""


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        if match is None or match.lastgroup is None:
            raise ExpressionError(f"cannot read {text[position:]!r}")
        tokens.append((match.lastgroup, match.group(match.lastgroup)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str, variables: Mapping[str, object]) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.variables = variables

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ExpressionError("the expression ends early")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise ExpressionError(f"expected {expected!r}, got {token[1]!r}")
        self.at += 1
        return token

    def whole(self) -> object:
        value = self.ternary()
        if self.at != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.at][1]!r}")
        return value

    def ternary(self) -> object:
        condition = self.either()
        if self.peek() != "?":
            return condition
        self.take("?")
        yes = self.ternary()
        self.take(":")
        no = self.ternary()
        return yes if _boolean(condition) else no

    def either(self) -> object:
        value = self.both()
        while self.peek() == "||":
            self.take()
            right = self.both()
            value = _boolean(value) or _boolean(right)
        return value

    def both(self) -> object:
        value = self.comparison()
        while self.peek() == "&&":
            self.take()
            right = self.comparison()
            value = _boolean(value) and _boolean(right)
        return value

    def comparison(self) -> object:
        left = self.unary()
        operator = self.peek()
        if operator in ("==", "!="):
            self.take()
            right = self.unary()
            equal = type(left) is type(right) and left == right
            return equal if operator == "==" else not equal
        if operator in _ORDER:
            self.take()
            right = self.unary()
            if not (isinstance(left, int) and isinstance(right, int)):
                raise ExpressionError(f"{left!r} {operator} {right!r}: not two numbers")
            return _ORDER[operator](left, right)
        return left

    def unary(self) -> object:
        if self.peek() == "!":
            self.take()
            return not _boolean(self.unary())
        return self.primary()

    def primary(self) -> object:
        kind, text = self.take()
        if kind == "string":
            return text[1:-1]
        if kind == "number":
            return int(text)
        if text == "(":
            value = self.ternary()
            self.take(")")
            return value
        if kind != "name":
            raise ExpressionError(f"unexpected {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if self.peek() == "(":
            self.take("(")
            argument = self.ternary()
            self.take(")")
            if text not in _FUNCTIONS:
                raise ExpressionError(f"unknown function {text!r}")
            return _FUNCTIONS[text](argument)
        if text not in self.variables:
            raise ExpressionError(f"unknown variable {text!r}")
        return self.variables[text]


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ExpressionError(f"{value!r} is no boolean")
    return value


def evaluate(text: str, variables: Mapping[str, object]) -> object:
    """The value of an expression with the given variables (`lastRetry.exitCode`: a string)."""
    return _Parser(text, variables).whole()


def substitute(text: str, variables: Mapping[str, object]) -> str:
    """`text` with every `{{=expression}}` replaced by its value."""
    return re.sub(r"\{\{=(.*?)\}\}", lambda match: str(evaluate(match.group(1), variables)), text)
