"""Alert rules over the watch window: TOML in, alerts out, Prometheus-style `for`.

    [[rule]]
    name = "memory-bandwidth"
    expr = "mem_copy_util_pct"        # arithmetic over internal metric names
    op = ">="                         # > >= < <= == !=
    threshold = 80
    for = "30s"                       # condition must hold on every sample this long
    message = "bandwidth-bound ..."

A rule is pending from the first sample where it holds and fires once it has held
for `for` seconds without a break; a sample where it fails (or its data is missing)
resolves it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from zgtool.dcgm.metrics import KNOWN_METRICS, GpuReading
from zgtool.errors import UsageError
from zgtool.http.toml import parse_toml

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}
_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}
_FUNCS: dict[str, Callable[..., float]] = {"min": min, "max": max, "abs": abs}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration_s(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise UsageError(f"negative duration {value!r}")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise UsageError(f"bad duration {value!r}: use seconds or e.g. '500ms', '30s', '2m', '1h'")
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) * scale


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str
    threshold: float
    op: str = ">="
    for_s: float = 0.0
    message: str = ""
    severity: str = "warning"
    _code: ast.Expression = field(init=False, repr=False, compare=False)
    metrics: frozenset[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise UsageError(f"rule {self.name!r}: op must be one of {' '.join(OPS)}, not {self.op!r}")
        if self.for_s < 0:
            raise UsageError(f"rule {self.name!r}: for must be >= 0")
        try:
            code = ast.parse(self.expr, mode="eval")
        except SyntaxError as exc:
            raise UsageError(f"rule {self.name!r}: cannot parse expr {self.expr!r}: {exc.msg}") from exc
        names = _check(code.body, self.name)
        unknown = names - KNOWN_METRICS
        if unknown:
            raise UsageError(
                f"rule {self.name!r}: unknown metric {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(KNOWN_METRICS))}"
            )
        object.__setattr__(self, "_code", code)
        object.__setattr__(self, "metrics", frozenset(names))

    def value(self, metrics: dict[str, float]) -> float | None:
        """The expression over one reading; None when a metric is missing or it divides by 0."""
        try:
            return float(_eval(self._code.body, metrics))
        except (KeyError, ZeroDivisionError):
            return None

    def holds(self, value: float | None) -> bool:
        return value is not None and OPS[self.op](value, self.threshold)

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "expr": self.expr, "op": self.op, "threshold": self.threshold,
                "for_s": self.for_s, "severity": self.severity, "message": self.message}


def _check(node: ast.AST, rule: str) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return set()
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _check(node.left, rule) | _check(node.right, rule)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _check(node.operand, rule)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and node.args and not node.keywords):
        out: set[str] = set()
        for a in node.args:
            out |= _check(a, rule)
        return out
    raise UsageError(
        f"rule {rule!r}: expr may use metric names, numbers, + - * /, min() max() abs(); "
        f"not {ast.unparse(node)!r}"
    )


def _eval(node: ast.AST, m: dict[str, float]) -> float:
    if isinstance(node, ast.Name):
        return m[node.id]
    if isinstance(node, ast.Constant):
        value = node.value
        assert isinstance(value, int | float), "_check admits only numeric constants"
        return float(value)
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, m), _eval(node.right, m))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, m)
        return -v if isinstance(node.op, ast.USub) else v
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return float(_FUNCS[node.func.id](*(_eval(a, m) for a in node.args)))


def load_rules(path: Path | None = None) -> list[Rule]:
    """Rules from a TOML file, or the shipped defaults (zgtool/dcgm/default_rules.toml)."""
    if path is None:
        text = resources.files("zgtool.dcgm").joinpath("default_rules.toml").read_text()
        where = "default_rules.toml"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read rules file {path}: {exc.strerror or exc}") from exc
        where = str(path)
    doc = parse_toml(text, where)
    specs = doc.get("rule", [])
    if not isinstance(specs, list):
        raise UsageError(f"{where}: rules are [[rule]] tables")
    rules = []
    for i, spec in enumerate(specs):
        name = str(spec.get("name", f"rule{i + 1}"))
        missing = [k for k in ("expr", "threshold") if k not in spec]
        if missing:
            raise UsageError(f"{where}: rule {name!r} needs {' and '.join(missing)}")
        extra = set(spec) - {"name", "expr", "threshold", "op", "for", "message", "severity"}
        if extra:
            raise UsageError(f"{where}: rule {name!r} has unknown keys {', '.join(sorted(extra))}")
        try:
            threshold = float(spec["threshold"])
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{where}: rule {name!r}: threshold must be a number") from exc
        rules.append(Rule(
            name=name, expr=str(spec["expr"]), threshold=threshold, op=str(spec.get("op", ">=")),
            for_s=parse_duration_s(spec.get("for", 0)), message=str(spec.get("message", "")),
            severity=str(spec.get("severity", "warning")),
        ))
    return rules


@dataclass
class Alert:
    rule: str
    key: str
    severity: str
    message: str
    pending_since_s: float
    fired_at_s: float | None = None
    resolved_at_s: float | None = None
    peak_value: float | None = None

    @property
    def state(self) -> str:
        if self.resolved_at_s is not None:
            return "resolved"
        return "firing" if self.fired_at_s is not None else "pending"


class RuleEvaluator:
    """Feeds timestamped readings through the rules; keeps every alert that ever fired."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._open: dict[tuple[str, str], Alert] = {}
        self.history: list[Alert] = []  # fired alerts (firing or resolved), in firing order

    def observe(self, t_s: float, readings: list[GpuReading]) -> None:
        seen = set()
        for r in readings:
            for rule in self.rules:
                k = (rule.name, r.key)
                seen.add(k)
                self._step(k, rule, t_s, rule.value(r.metrics))
        # A GPU that vanished from the scrape has no data: its alerts resolve.
        for k in [k for k in self._open if k not in seen]:
            self._close(k, t_s)

    def _step(self, k: tuple[str, str], rule: Rule, t_s: float, value: float | None) -> None:
        alert = self._open.get(k)
        if not rule.holds(value):
            if alert is not None:
                self._close(k, t_s)
            return
        assert value is not None
        if alert is None:
            alert = self._open[k] = Alert(rule.name, k[1], rule.severity, rule.message, t_s)
        alert.peak_value = value if alert.peak_value is None else max(alert.peak_value, value)
        if alert.fired_at_s is None and t_s - alert.pending_since_s >= rule.for_s:
            alert.fired_at_s = t_s
            self.history.append(alert)

    def _close(self, k: tuple[str, str], t_s: float) -> None:
        alert = self._open.pop(k)
        if alert.fired_at_s is not None:
            alert.resolved_at_s = t_s

    def active(self) -> list[Alert]:
        """Pending and firing alerts right now (for the live table)."""
        return sorted(self._open.values(), key=lambda a: (a.key, a.rule))

    def firing(self) -> list[Alert]:
        return [a for a in self.active() if a.state == "firing"]
