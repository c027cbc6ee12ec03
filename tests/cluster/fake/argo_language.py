"""What the emulated Argo controller reads in a Workflow: names, expressions, `{{...}}`, `depends`.

Node ids and pod names are Argo's (`Workflow.NodeID`, `GeneratePodName` v2: FNV-1a of 32 bits
of the node's name); expressions are the subset of expr-lang simrun's manifests use (`==`,
`!=`, `<`, `<=`, `>`, `>=`, `!`, `&&`, `||`, `?:`, parentheses, `asInt`, `asFloat`, string and
number literals; as in expr, `==` never converts and an ordering needs numbers); `{{name}}`
and `{{=expression}}` are substituted from a scope of dotted names; `depends` (and the
`dependencies` it replaces, `workflow/common/ancestry.go`) is parsed into task results;
`withSequence`/`withItems`/`withParam` give the items of a fan-out.

Not emulated, refused with `Refused`: the rest of expr (`in`, `matches`, arithmetic, maps,
lists, sprig), items that are lists or maps, `withSequence` formats other than `%d`-like ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

MAX_POD_NAME_PREFIX = 253 - 10 - 1


class Refused(Exception):
    """An input the emulator does not emulate: the workflow ends in Error naming it."""


class ExpressionError(Refused):
    """An expression outside the emulated subset of expr, or one that fails to evaluate."""


# --- names ---------------------------------------------------------------------------------


def fnv32a(text: str) -> int:
    """FNV-1a of 32 bits, the hash of Argo's node ids and pod names."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def node_id(workflow: str, node_name: str) -> str:
    """`Workflow.NodeID`: the workflow's name for its root, else `<workflow>-<fnv32a>`."""
    return workflow if node_name == workflow else f"{workflow}-{fnv32a(node_name)}"


def pod_name(workflow: str, node_name: str, template: str) -> str:
    """`GeneratePodName` of pod name format v2."""
    if node_name == workflow:
        return workflow
    prefix = f"{workflow}-{template}" if template else workflow
    return f"{prefix[:MAX_POD_NAME_PREFIX]}-{fnv32a(node_name)}"


# --- expressions: the subset of expr-lang simrun uses --------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<number>\d+(?:\.\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!?:(),]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None or match.lastgroup is None:
            raise ExpressionError(
                f"expression {text!r}: {text[position:].strip()!r} is outside the emulated "
                "subset of expr"
            )
        tokens.append((match.lastgroup, match.group(match.lastgroup)))
        position = match.end()
    return tokens


def _as_number(value: Any, text: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExpressionError(f"expression {text!r}: {value!r} is not a number")
    return value


def _as_int(value: Any) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ExpressionError(f"asInt({value!r}): not an integer") from None


def _as_float(value: Any) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise ExpressionError(f"asFloat({value!r}): not a number") from None


_FUNCTIONS: dict[str, Callable[[Any], Any]] = {"asInt": _as_int, "asFloat": _as_float}


class _Expression:
    """A recursive descent evaluator: ternary, `||`, `&&`, comparisons, `!`, primaries."""

    def __init__(self, text: str, scope: Mapping[str, Any]) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0
        self.scope = scope

    def value(self) -> Any:
        result = self.ternary()
        if self.at != len(self.tokens):
            raise ExpressionError(f"expression {self.text!r}: unexpected {self.peek()!r}")
        return result

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise ExpressionError(f"expression {self.text!r} ends early")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise ExpressionError(f"expression {self.text!r}: expected {expected!r}")
        self.at += 1
        return token

    def boolean(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ExpressionError(f"expression {self.text!r}: {value!r} is not a boolean")
        return value

    def ternary(self) -> Any:
        condition = self.either()
        if self.peek() != "?":
            return condition
        self.take("?")
        yes = self.ternary()
        self.take(":")
        no = self.ternary()
        return yes if self.boolean(condition) else no

    def either(self) -> Any:
        value = self.both()
        while self.peek() == "||":
            self.take()
            other = self.both()
            value = self.boolean(value) or self.boolean(other)
        return value

    def both(self) -> Any:
        value = self.comparison()
        while self.peek() == "&&":
            self.take()
            other = self.comparison()
            value = self.boolean(value) and self.boolean(other)
        return value

    def comparison(self) -> Any:
        left = self.unary()
        op = self.peek()
        if op not in ("==", "!=", "<", "<=", ">", ">="):
            return left
        self.take()
        right = self.unary()
        if op == "==":
            return type(left) is type(right) and left == right
        if op == "!=":
            return not (type(left) is type(right) and left == right)
        a, b = _as_number(left, self.text), _as_number(right, self.text)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not self.boolean(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, token = self.take()
        if kind == "string":
            return json.loads('"' + token[1:-1].replace('"', '\\"') + '"')
        if kind == "number":
            return float(token) if "." in token else int(token)
        if kind == "op" and token == "(":
            value = self.ternary()
            self.take(")")
            return value
        if kind == "name":
            if token in ("true", "false"):
                return token == "true"
            if self.peek() == "(":
                function = _FUNCTIONS.get(token)
                if function is None:
                    raise ExpressionError(
                        f"expression {self.text!r}: function {token!r} is not emulated"
                    )
                self.take("(")
                argument = self.ternary()
                self.take(")")
                return function(argument)
            if token not in self.scope:
                raise ExpressionError(f"expression {self.text!r}: unknown name {token!r}")
            return self.scope[token]
        raise ExpressionError(f"expression {self.text!r}: unexpected {token!r}")


def evaluate(text: str, scope: Mapping[str, Any]) -> Any:
    """The value of an expression over `scope` (dotted names as keys, e.g. `lastRetry.exitCode`)."""
    return _Expression(text, scope).value()


def evaluate_bool(text: str, scope: Mapping[str, Any]) -> bool:
    value = evaluate(text, scope)
    if not isinstance(value, bool):
        raise ExpressionError(f"expression {text!r} is {value!r}, not a boolean")
    return value


# --- templates: Argo's `{{...}}` substitution ----------------------------------------------

_TAG = re.compile(r"\{\{(.*?)\}\}", re.S)


class Unresolved(Exception):
    """A `{{tag}}` whose variable the scope lacks (Argo: `failed to resolve {{tag}}`)."""


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def substitute_text(text: str, scope: Mapping[str, str]) -> str:
    """Every `{{name}}` and `{{=expression}}` of a text replaced from `scope`."""

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        if inner.startswith("="):
            return format_value(evaluate(inner[1:], scope))
        if inner not in scope:
            raise Unresolved(f"failed to resolve {{{{{inner}}}}}")
        return scope[inner]

    return _TAG.sub(replace, text)


def substitute(value: Any, scope: Mapping[str, str]) -> Any:
    """A JSON value with every string substituted (`substitute_text`)."""
    if isinstance(value, str):
        return substitute_text(value, scope) if "{{" in value else value
    if isinstance(value, list):
        return [substitute(item, scope) for item in value]
    if isinstance(value, dict):
        return {key: substitute(item, scope) for key, item in value.items()}
    return value


# --- DAG dependencies (`depends`, `dependencies`) ------------------------------------------

_RESULTS = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned")
_DEPENDS_TOKEN = re.compile(r"\s*(?:(?P<op>&&|\|\||[!()])|(?P<name>[A-Za-z0-9_][-A-Za-z0-9_.]*))")


def _depends_tokens(text: str) -> list[str]:
    tokens: list[str] = []
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _DEPENDS_TOKEN.match(text, position)
        if match is None:
            raise Refused(f"depends {text!r}: cannot read {text[position:]!r}")
        tokens.append(match.group(match.lastgroup or "name"))
        position = match.end()
    return tokens


class Depends:
    """A `depends` expression: task results joined by `&&`, `||`, `!` and parentheses."""

    def __init__(self, text: str, continue_on: Mapping[str, Mapping[str, Any]]) -> None:
        self.text = text
        self.tokens = _depends_tokens(text)
        self.at = 0
        self.continue_on = continue_on
        self.tree = self._either()
        if self.at != len(self.tokens):
            raise Refused(f"depends {text!r}: unexpected {self.tokens[self.at]!r}")

    @classmethod
    def of_task(cls, task: Mapping[str, Any], tasks: Mapping[str, Mapping[str, Any]]) -> Depends:
        continue_on = {name: other.get("continueOn") or {} for name, other in tasks.items()}
        if task.get("depends"):
            return cls(str(task["depends"]), continue_on)
        return cls(" && ".join(task.get("dependencies") or []), continue_on)

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _either(self) -> Any:
        if self._peek() is None:
            return None
        node = self._both()
        while self._peek() == "||":
            self.at += 1
            node = ("or", node, self._both())
        return node

    def _both(self) -> Any:
        node = self._not()
        while self._peek() == "&&":
            self.at += 1
            node = ("and", node, self._not())
        return node

    def _not(self) -> Any:
        if self._peek() == "!":
            self.at += 1
            return ("not", self._not())
        if self._peek() == "(":
            self.at += 1
            node = self._either()
            if self._peek() != ")":
                raise Refused(f"depends {self.text!r}: missing ')'")
            self.at += 1
            return node
        token = self._peek()
        if token is None or token in ("&&", "||", ")"):
            raise Refused(f"depends {self.text!r}: a task name is missing")
        self.at += 1
        name, _, result = token.partition(".")
        if result and result not in (*_RESULTS, "AnySucceeded", "AllFailed"):
            raise Refused(f"depends {self.text!r}: task result {result!r} is not emulated")
        if not result:  # `expandDependency`: what a bare name (or `dependencies`) accepts
            accepted = ["Succeeded", "Skipped", "Daemoned"]
            continue_on = self.continue_on.get(name) or {}
            if continue_on.get("error"):
                accepted.append("Errored")
            if continue_on.get("failed"):
                accepted.append("Failed")
            return ("any", name, tuple(accepted))
        return ("any", name, (result,))

    def tasks(self) -> list[str]:
        found: list[str] = []

        def walk(node: Any) -> None:
            if node is None:
                return
            if node[0] == "any":
                if node[1] not in found:
                    found.append(node[1])
            else:
                for child in node[1:]:
                    walk(child)

        walk(self.tree)
        return found

    def holds(self, results: Mapping[str, Mapping[str, bool]]) -> bool:
        def walk(node: Any) -> bool:
            if node[0] == "any":
                return any(results[node[1]].get(result, False) for result in node[2])
            if node[0] == "not":
                return not walk(node[1])
            left, right = walk(node[1]), walk(node[2])
            return left and right if node[0] == "and" else left or right

        return True if self.tree is None else walk(self.tree)


# --- fan-out -------------------------------------------------------------------------------


def item_text(item: Any, where: str) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int | str):
        return str(item)
    if isinstance(item, float):
        return format_value(item)
    raise Refused(f"{where}: items that are lists or maps are not emulated")


def expand_items(task: Mapping[str, Any], scope: Mapping[str, str]) -> list[str] | None:
    """The items of a task's `withSequence`/`withItems`/`withParam`; None when it has none."""
    name = task["name"]
    if "withSequence" in task:
        sequence = task["withSequence"] or {}
        start = int(substitute(str(sequence.get("start", 0)), scope))
        fmt = sequence.get("format") or "%d"
        if "count" in sequence:
            numbers = list(range(start, start + int(substitute(str(sequence["count"]), scope))))
        elif "end" in sequence:
            end = int(substitute(str(sequence["end"]), scope))
            numbers = list(range(start, end + 1) if end >= start else range(start, end - 1, -1))
        else:
            raise Refused(f"task {name!r}: withSequence needs a count or an end")
        try:
            return [fmt % number for number in numbers]
        except (TypeError, ValueError):
            raise Refused(f"task {name!r}: withSequence format {fmt!r} is not emulated") from None
    if "withItems" in task:
        return [item_text(item, f"task {name!r}") for item in task["withItems"] or []]
    if "withParam" in task:
        text = substitute(str(task["withParam"]), scope)
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            raise Refused(f"task {name!r}: withParam {text!r} is no JSON list") from None
        if not isinstance(items, list):
            raise Refused(f"task {name!r}: withParam {text!r} is no JSON list")
        return [item_text(item, f"task {name!r}") for item in items]
    return None
