"""Gate policies: a small TOML file of rules, parsed into frozen dataclasses.

    # every rule is a comparison over dotted result fields (see zgtool/gate/expr.py)
    rules = ["failure_rate < 0.01"]            # shorthand: applies to every result

    [[rule]]
    check = "direct.http_req_duration.p95 <= 0.6 * gateway.http_req_duration.p95"
    name = "direct path is much faster"        # optional label for the table
    kind = "bench.k6"                          # optional glob over the result kind
    skip_missing = true                        # optional: a missing field skips the row
                                               #   instead of failing the policy (exit 2)
    category = "measurement"                   # optional: a rule about the load generator's own
                                               #   health; a breach means "the measurement is
                                               #   unreliable" (exit 5), not a gate failure
    [paired]                                   # latency_split results of a baseline and candidates
    fields = ["total_ms", "ttft_ms"]           #   measured interleaved in one job: per-request
    material = "5%"                            #   fields compared by their paired median difference;
    material_ms = 0.5                          #   a breach is significant AND above both thresholds
    confidence = 0.95                          #   family-wise (Bonferroni over every comparison)
    inconclusive = "warn"                      #   a pass whose interval reaches above the allowance:
                                               #   "warn" (a pass, marked) or "unreliable" (exit 5)
    [regression]                               # used with --baseline FILE
    max = "10%"                                # --max-regression overrides it
    fields = ["*http_req_duration.p95", "*_ms.p95"]   # globs over leaf names; '*' spans dots
    noise_floor = 1.0                          # ignore increases smaller than this (field units)
    method = "intervals"                       # or "percentile": p95 by percentage alone (the old way)
    paths = "auto"                             # intervals: each path's own median judged in a run of one
                                               #   path only ("always", "never"); the hops' taxes always
    inconclusive = "warn"                      # intervals: a pass whose interval reaches past the limit,
                                               #   as in [paired]: "warn" or "unreliable" (exit 5)

Every mistake is a PolicyError naming the file, line and field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.gate.expr import Rule, RuleSyntaxError, parse_rule
from zgtool.http.toml import parse_toml

REGRESSION_METHODS = ("intervals", "percentile")
REGRESSION_PATHS = ("auto", "always", "never")
DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "default_gates.toml"
_RULE_KEYS = {"check", "name", "kind", "skip_missing", "category"}
_REGRESSION_KEYS = {"max", "fields", "noise_floor", "method", "paths", "inconclusive"}
_PAIRED_KEYS = {"fields", "material", "material_ms", "confidence", "inconclusive"}
INCONCLUSIVE = ("warn", "unreliable")
GATE, MEASUREMENT = "gate", "measurement"
CATEGORIES = (GATE, MEASUREMENT)
# end-to-end latencies only: sub-ms phases (blocked, sending) jitter far more than 10%
DEFAULT_REGRESSION_FIELDS = ("*http_req_duration.p95", "*_ms.p95")
_TOP_KEYS = {"rules", "rule", "regression", "paired"}


class PolicyError(UsageError):
    """An invalid policy (exit 2)."""


@dataclass(frozen=True)
class PolicyRule:
    rule: Rule
    name: str
    kind: str = "*"
    skip_missing: bool = False
    line: int | None = None
    category: str = GATE   # GATE: a breach fails the gate; MEASUREMENT: it makes the run unreliable


@dataclass(frozen=True)
class RegressionSpec:
    max_ratio: float = 0.10
    fields: tuple[str, ...] = DEFAULT_REGRESSION_FIELDS
    noise_floor: float = 1.0
    # intervals: a latency_split or bench.k6 field breaches when this run's median interval lies above the
    # baseline run's by more than the allowance, and a hop's tax when its interval lies above the baseline
    # run's (zgtool/gate/acrossruns.py); percentile: the field's p95 against the baseline's by percentage
    # alone (k6 results written before they kept their medians' intervals are always read so)
    method: str = "intervals"
    # under "intervals", each path's own median: "auto" judges it only in a run of one path (a run of two or
    # more is judged by its hops' taxes, which the machine's drift between runs does not move: a path's own
    # median moved past its allowance in 0-3 of 11 A/A pairs of runs per condition, the taxes in none);
    # "always"; "never"
    paths: str = "auto"
    # under "intervals", a pass whose interval still reaches past the limit (a regression that large could
    # pass unseen between two runs this wide): "warn" marks it, "unreliable" makes the run exit 5
    inconclusive: str = "warn"

    def __post_init__(self) -> None:
        if self.inconclusive not in INCONCLUSIVE:
            raise PolicyError(f"[regression] inconclusive must be one of {', '.join(map(repr, INCONCLUSIVE))}, "
                              f"not {self.inconclusive!r}")
        if self.paths not in REGRESSION_PATHS:
            raise PolicyError(f"regression paths must be {', '.join(REGRESSION_PATHS)}, not {self.paths!r}")
        if self.method not in REGRESSION_METHODS:
            raise PolicyError(f"regression method must be {' or '.join(REGRESSION_METHODS)}, not {self.method!r}")
        if not 0 <= self.max_ratio < 100:
            raise PolicyError(f"max regression must be between 0% and 10000%, not {self.max_ratio:.0%}")
        if not self.fields:
            raise PolicyError("regression fields must not be empty")
        if self.noise_floor < 0:
            raise PolicyError("regression noise_floor must be >= 0")


@dataclass(frozen=True)
class PairedSpec:
    """Baseline vs candidates measured interleaved in one latency_split run (the first target is the
    baseline). A field regresses when the paired median difference is significant at the family-wise
    `confidence` AND larger than both material thresholds: a difference too small to matter never
    fails CI, however many requests made it significant."""

    fields: tuple[str, ...] = ("total_ms", "ttft_ms")
    material_ratio: float = 0.05
    material_ms: float = 0.5
    confidence: float = 0.95
    # a pass whose interval still reaches above the allowance could hide a regression of that size: "warn"
    # marks it (still a pass), "unreliable" makes the run unjudgeable (exit 5), for a CI that must not pass blind
    inconclusive: str = "warn"

    def __post_init__(self) -> None:
        if not self.fields:
            raise PolicyError("[paired] fields must not be empty")
        if self.inconclusive not in INCONCLUSIVE:
            raise PolicyError(f"[paired] inconclusive must be one of {', '.join(map(repr, INCONCLUSIVE))}, "
                              f"not {self.inconclusive!r}")
        if not 0 <= self.material_ratio < 100:
            raise PolicyError(f"[paired] material must be between 0% and 10000%, not {self.material_ratio:.0%}")
        if self.material_ms < 0:
            raise PolicyError("[paired] material_ms must be >= 0")
        if not 0.5 <= self.confidence < 1:
            raise PolicyError(f"[paired] confidence must be in [0.5, 1), not {self.confidence}")

    def threshold_ms(self, baseline_median_ms: float) -> float:
        return max(self.material_ms, self.material_ratio * baseline_median_ms)


@dataclass(frozen=True)
class Policy:
    source: str
    rules: tuple[PolicyRule, ...]
    regression: RegressionSpec = field(default_factory=RegressionSpec)
    paired: PairedSpec | None = None


def parse_percent(value: Any, *, what: str = "max regression") -> float:
    """'10%', '10', 10 or 0.1 -> 0.10. Bare numbers above 1 are read as percent."""
    if isinstance(value, bool):
        raise PolicyError(f"{what}: expected a percentage like '10%', not {value!r}")
    if isinstance(value, int | float):
        ratio = float(value)
        return ratio / 100.0 if ratio > 1 else ratio
    text = str(value).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(%?)", text)
    if not m:
        raise PolicyError(f"{what}: expected a percentage like '10%', not {text!r}")
    number = float(m.group(1))
    return number / 100.0 if m.group(2) or number > 1 else number


def _line_of(text: str, needle: str) -> int | None:
    idx = text.find(needle)
    return None if idx < 0 else text.count("\n", 0, idx) + 1


def _line_of_key(text: str, key: str) -> int | None:
    m = re.search(rf"(?m)^\s*{re.escape(key)}\s*=", text) or re.search(rf"(?m)^\s*\[+{re.escape(key)}\]", text)
    return None if m is None else text.count("\n", 0, m.start()) + 1


def _where(source: str, line: int | None) -> str:
    return f"{source} line {line}" if line else source


def load_policy(path: str | Path | None) -> Policy:
    p = Path(path) if path is not None else DEFAULT_POLICY
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise PolicyError(f"policy file not found: {p}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read policy {p}: {exc}") from exc
    return parse_policy(text, source=str(p))


def parse_policy(text: str, *, source: str = "<policy>") -> Policy:
    doc = parse_toml(text, source, PolicyError)
    for key in doc:
        if key not in _TOP_KEYS:
            raise PolicyError(
                f"{_where(source, _line_of_key(text, key))}: unknown key {key!r}; "
                f"a policy has rules = [...], [[rule]] tables, [regression] and [paired]"
            )
    rules: list[PolicyRule] = []
    shorthand = doc.get("rules", [])
    if not isinstance(shorthand, list) or not all(isinstance(r, str) for r in shorthand):
        raise PolicyError(f"{_where(source, _line_of_key(text, 'rules'))}: 'rules' must be a list of strings")
    for check in shorthand:
        line = _line_of(text, check)
        rules.append(PolicyRule(rule=_parse(check, source, line, "rules"), name=check, line=line))
    tables = doc.get("rule", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise PolicyError(f"{_where(source, _line_of_key(text, 'rule'))}: use [[rule]] tables for rules")
    for i, table in enumerate(tables, start=1):
        rules.append(_table_rule(table, i, text, source))
    paired = _paired(doc.get("paired"), text, source)
    if not rules and paired is None:
        raise PolicyError(f"{source}: the policy has no rules (add rules = [...], [[rule]] tables or [paired])")
    return Policy(source=source, rules=tuple(rules), regression=_regression(doc.get("regression"), text, source),
                  paired=paired)


def _table_rule(table: dict[str, Any], index: int, text: str, source: str) -> PolicyRule:
    check = table.get("check")
    line = _line_of(text, check) if isinstance(check, str) and check else None
    where = _where(source, line)
    for key in table:
        if key not in _RULE_KEYS:
            raise PolicyError(
                f"{_where(source, _line_of_key(text, key))}: [[rule]] #{index}: unknown field {key!r} "
                f"(allowed: {', '.join(sorted(_RULE_KEYS))})"
            )
    if not isinstance(check, str) or not check.strip():
        raise PolicyError(f"{where}: [[rule]] #{index} needs check = \"<comparison>\"")
    name = table.get("name", check)
    kind = table.get("kind", "*")
    skip = table.get("skip_missing", False)
    if not isinstance(name, str) or not isinstance(kind, str):
        raise PolicyError(f"{where}: [[rule]] #{index}: name and kind must be strings")
    if not isinstance(skip, bool):
        raise PolicyError(f"{where}: [[rule]] #{index}: skip_missing must be true or false")
    category = table.get("category", GATE)
    if category not in CATEGORIES:
        raise PolicyError(f"{where}: [[rule]] #{index}: category must be one of {', '.join(CATEGORIES)}, "
                          f"not {category!r}")
    return PolicyRule(rule=_parse(check, source, line, "check"), name=name, kind=kind, skip_missing=skip, line=line,
                      category=category)


def _parse(check: str, source: str, line: int | None, key: str) -> Rule:
    try:
        return parse_rule(check)
    except RuleSyntaxError as exc:
        raise PolicyError(f"{_where(source, line)}: {key}: {exc}") from exc


def _regression(section: Any, text: str, source: str) -> RegressionSpec:
    if section is None:
        return RegressionSpec()
    where = _where(source, _line_of_key(text, "regression"))
    if not isinstance(section, dict):
        raise PolicyError(f"{where}: [regression] must be a table")
    for key in section:
        if key not in _REGRESSION_KEYS:
            raise PolicyError(
                f"{_where(source, _line_of_key(text, key))}: [regression]: unknown field {key!r} "
                f"(allowed: {', '.join(sorted(_REGRESSION_KEYS))})"
            )
    fields = section.get("fields", list(DEFAULT_REGRESSION_FIELDS))
    if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
        raise PolicyError(f"{where}: [regression] fields must be a list of glob strings")
    floor = section.get("noise_floor", 1.0)
    if isinstance(floor, bool) or not isinstance(floor, int | float):
        raise PolicyError(f"{where}: [regression] noise_floor must be a number")
    method = section.get("method", "intervals")
    if method not in REGRESSION_METHODS:
        raise PolicyError(f"{_where(source, _line_of_key(text, 'method'))}: [regression] method must be "
                          f"{' or '.join(REGRESSION_METHODS)}, not {method!r}")
    paths = section.get("paths", "auto")
    if paths not in REGRESSION_PATHS:
        raise PolicyError(f"{_where(source, _line_of_key(text, 'paths'))}: [regression] paths must be "
                          f"{', '.join(REGRESSION_PATHS)}, not {paths!r}")
    try:
        ratio = parse_percent(section.get("max", "10%"))
        return RegressionSpec(max_ratio=ratio, fields=tuple(fields), noise_floor=float(floor), method=str(method),
                              paths=str(paths), inconclusive=str(section.get("inconclusive", "warn")))
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc.message}") from exc


def _paired(section: Any, text: str, source: str) -> PairedSpec | None:
    if section is None:
        return None
    where = _where(source, _line_of_key(text, "paired"))
    if not isinstance(section, dict):
        raise PolicyError(f"{where}: [paired] must be a table")
    for key in section:
        if key not in _PAIRED_KEYS:
            raise PolicyError(
                f"{_where(source, _line_of_key(text, key))}: [paired]: unknown field {key!r} "
                f"(allowed: {', '.join(sorted(_PAIRED_KEYS))})"
            )
    fields = section.get("fields", list(PairedSpec.fields))
    if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
        raise PolicyError(f"{where}: [paired] fields must be a list of per-request field names (total_ms, ...)")
    numbers = {}
    for key, default in (("material_ms", PairedSpec.material_ms), ("confidence", PairedSpec.confidence)):
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(f"{where}: [paired] {key} must be a number")
        numbers[key] = float(value)
    try:
        ratio = parse_percent(section.get("material", "5%"), what="[paired] material")
        return PairedSpec(fields=tuple(fields), material_ratio=ratio, inconclusive=str(section.get("inconclusive", "warn")),
                          **numbers)
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc.message}") from exc
