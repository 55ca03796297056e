"""The gate rule grammar: a comparison of arithmetic over numbers and dotted result fields.

    rule   := side CMP side [CMP side]          CMP: <  <=  >  >=  ==  !=
    side   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | FIELD | "(" side ")" | "-" factor
    FIELD  := NAME ("." NAME)*                   e.g. direct.http_req_duration.p95

Parsed with `ast` and then checked node by node: anything else (calls, subscripts,
strings, boolean operators, lambdas, ...) is rejected, so a policy can never run code.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass

CMP_OPS: dict[type, tuple[str, Callable[[float, float], bool]]] = {
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
}
BIN_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class RuleSyntaxError(ValueError):
    """A rule that is not in the grammar; the message says what is wrong."""


class MissingField(LookupError):
    """A dotted field that a result does not have (or that is not a number)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


Resolver = Callable[[str], float]


@dataclass(frozen=True)
class Rule:
    """One parsed comparison; `fields` lists every dotted name it reads."""

    text: str
    tree: ast.Compare
    fields: tuple[str, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(CMP_OPS[type(op)][0] for op in self.tree.ops)

    def sides(self) -> tuple[str, ...]:
        """Source text of each side of the comparison, for the pass/fail table."""
        return tuple(ast.unparse(n) for n in (self.tree.left, *self.tree.comparators))

    def evaluate(self, resolve: Resolver) -> tuple[bool, tuple[float, ...]]:
        """(holds, value of each side). Raises MissingField from the resolver."""
        values = tuple(_eval(n, resolve) for n in (self.tree.left, *self.tree.comparators))
        holds = all(
            CMP_OPS[type(op)][1](values[i], values[i + 1]) for i, op in enumerate(self.tree.ops)
        )
        return holds, values


def parse_rule(text: str) -> Rule:
    """Parse and validate one rule; RuleSyntaxError explains a rejection."""
    if not isinstance(text, str) or not text.strip():
        raise RuleSyntaxError("empty rule; expected e.g. 'direct.http_req_duration.p95 < 50'")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise RuleSyntaxError(f"cannot parse {text.strip()!r}: {exc.msg}") from exc
    if not isinstance(tree, ast.Compare):
        raise RuleSyntaxError(
            f"{text.strip()!r} is not a comparison; a rule needs one of < <= > >= == !="
        )
    for op in tree.ops:
        if type(op) not in CMP_OPS:
            raise RuleSyntaxError(f"operator {type(op).__name__} is not allowed; use < <= > >= == !=")
    if len(tree.ops) > 2:
        raise RuleSyntaxError("at most one chained comparison (a < b < c) per rule")
    fields: list[str] = []
    for side in (tree.left, *tree.comparators):
        _check(side, fields)
    return Rule(text=text.strip(), tree=tree, fields=tuple(dict.fromkeys(fields)))


def _check(node: ast.AST, fields: list[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise RuleSyntaxError(f"only numbers are allowed as constants, not {node.value!r}")
        return
    if isinstance(node, ast.Name | ast.Attribute):
        fields.append(field_name(node))
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in BIN_OPS:
            raise RuleSyntaxError(f"operator {ast.unparse(node)!r} is not allowed; use + - * /")
        _check(node.left, fields)
        _check(node.right, fields)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        _check(node.operand, fields)
        return
    if isinstance(node, ast.Compare):
        raise RuleSyntaxError("one comparison per rule (write a second rule instead)")
    raise RuleSyntaxError(
        f"{ast.unparse(node)!r} is not allowed: rules use numbers, dotted fields, + - * / and parentheses"
    )


def field_name(node: ast.AST) -> str:
    """ast.Name / chain of ast.Attribute -> 'a.b.c'; anything else is rejected."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise RuleSyntaxError(f"{ast.unparse(node)!r} is not a dotted field name")
    parts.append(node.id)
    dunder = [p for p in parts if p.startswith("__")]
    if dunder:
        # lookup only walks JSON dicts, but refuse Python-object names outright
        raise RuleSyntaxError(f"field segment {dunder[0]!r} is not allowed")
    return ".".join(reversed(parts))


def _eval(node: ast.AST, resolve: Resolver) -> float:
    if isinstance(node, ast.Constant):
        value = node.value
        assert isinstance(value, int | float), "parse_rule admits only numeric constants"
        return float(value)
    if isinstance(node, ast.Name | ast.Attribute):
        return resolve(field_name(node))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, resolve), _eval(node.right, resolve)
        if isinstance(node.op, ast.Div) and right == 0:
            # A zero denominator is a measured value of 0, not a policy error.
            return float("inf") if left > 0 else float("-inf") if left < 0 else float("nan")
        return BIN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, resolve)
        return -value if isinstance(node.op, ast.USub) else value
    raise RuleSyntaxError(f"unexpected node {ast.dump(node)}")  # pragma: no cover - _check rejects it
