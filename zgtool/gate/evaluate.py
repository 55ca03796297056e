"""Evaluate a policy over result files: one GateRow per (rule, result) and per regressed field."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import replace
from typing import Any

from zgtool.errors import UsageError
from zgtool.gate.acrossruns import interval_rows, judged_by_intervals
from zgtool.gate.derived import with_derived
from zgtool.gate.expr import MissingField
from zgtool.gate.fields import lookup, matching_leaves
from zgtool.gate.paired import evaluate_paired
from zgtool.gate.policy import MEASUREMENT, Policy, PolicyError, PolicyRule, RegressionSpec
from zgtool.gate.records import FAIL, PASS, SKIP, UNRELIABLE, GateReport, GateRow, LoadedResult


def _applies(rule: PolicyRule, res: LoadedResult) -> bool:
    return fnmatch.fnmatchcase(res.kind, rule.kind)


def evaluate_rules(policy: Policy, results: list[LoadedResult]) -> list[GateRow]:
    rows: list[GateRow] = []
    for prule in policy.rules:
        applicable = [r for r in results if _applies(prule, r)]
        if not applicable:
            rows.append(GateRow(prule.name, prule.rule.text, "-", SKIP, prule.rule.sides(), prule.rule.ops,
                                detail=f"no result of kind {prule.kind!r}", category=prule.category))
            continue
        for res in applicable:
            rows.append(_evaluate_one(policy, prule, res))
    return rows


def _evaluate_one(policy: Policy, prule: PolicyRule, res: LoadedResult) -> GateRow:
    rule = prule.rule
    result = with_derived(res.result)
    try:
        holds, values = rule.evaluate(lambda name: lookup(result, name))
    except MissingField as exc:
        if prule.skip_missing:
            return GateRow(prule.name, rule.text, res.label, SKIP, rule.sides(), rule.ops,
                           detail=f"{exc.field} {exc.detail}", category=prule.category)
        where = f"{policy.source} line {prule.line}" if prule.line else policy.source
        raise PolicyError(
            f"{where}: field {exc.field!r} {exc.detail} ({res.label}, kind {res.kind!r}); "
            f"fix the rule, restrict it with kind = \"...\", or set skip_missing = true"
        ) from exc
    if any(math.isnan(v) for v in values):
        holds = False  # NaN compares false both ways; never let it pass silently
    return GateRow(prule.name, rule.text, res.label, PASS if holds else FAIL, rule.sides(), rule.ops, values,
                   category=prule.category, why=rule_why(rule.sides(), rule.ops, values, holds))


def _num(v: float) -> str:
    if math.isinf(v) or math.isnan(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.4g}"
    return f"{v:,.4f}".rstrip("0").rstrip(".")


def rule_why(sides: tuple[str, ...], ops: tuple[str, ...], values: tuple[float, ...], holds: bool) -> str:
    """'failure_rate is 0, so failure_rate < 0.01 holds' / '... is 0.05, so ... does not hold'."""
    named = [f"{side} is {_num(v)}" for side, v in zip(sides, values, strict=False)
             if not _is_literal(side)]
    chain = " ".join([_num(values[0]), *(f"{op} {_num(v)}" for op, v in zip(ops, values[1:], strict=False))])
    return f"{', '.join(named) or 'measured'}: {chain} {'holds' if holds else 'does not hold'}"


def _is_literal(side: str) -> bool:
    try:
        float(side)
    except ValueError:
        return False
    return True


def _same_workload(results: list[LoadedResult], baseline: LoadedResult) -> None:
    """A stored run of another workload (stream, prompt, output length, concurrency, a path's API or model) says
    nothing of this one: the UsageError compare gives for it (exit 2), not a verdict."""
    from pathlib import Path

    from zgtool.compare.runs import BENCH_KIND, KIND, check_same_workload, run_from

    if baseline.kind not in (KIND, BENCH_KIND):
        return
    base = run_from(Path(baseline.label), baseline.result)
    for res in results:
        check_same_workload(base, run_from(Path(res.label), res.result))


def evaluate_regression(
    spec: RegressionSpec, results: list[LoadedResult], baseline: LoadedResult
) -> list[GateRow]:
    """Each result against the baseline run: latency_split and bench.k6 results by intervals
    (zgtool/gate/acrossruns.py) unless the policy says method = "percentile" or a bench result predates its
    medians' intervals; otherwise current <= baseline * (1 + max) for every matched field
    (lower is better)."""
    rows: list[GateRow] = []
    same_kind = [r for r in results if r.kind == baseline.kind]
    _same_workload(same_kind, baseline)
    if not same_kind:
        raise PolicyError(
            f"baseline {baseline.label} is a {baseline.kind!r} result but no RESULT has that kind "
            f"({', '.join(sorted({r.kind for r in results}))})"
        )
    for res in same_kind:
        mine, theirs = measured_names(res.result), measured_names(baseline.result)
        if mine != theirs:
            raise PolicyError(
                f"baseline {baseline.label} measured {', '.join(sorted(theirs)) or 'nothing'} but {res.label} "
                f"measured {', '.join(sorted(mine)) or 'nothing'}: compare runs of the same targets"
            )
    base_fields = matching_leaves(baseline.result, spec.fields)
    if not base_fields:
        raise PolicyError(
            f"baseline {baseline.label}: no numeric field matches {', '.join(spec.fields)}; "
            "set [regression] fields in the policy"
        )
    pct = f"{spec.max_ratio:.0%}"
    for res in same_kind:
        if spec.method == "intervals" and judged_by_intervals(res.result) and judged_by_intervals(baseline.result):
            rows.extend(interval_rows(spec, res, baseline))
            continue
        current = matching_leaves(res.result, spec.fields)
        for name, base in base_fields.items():
            check = f"{name} <= baseline * (1 + {pct})"
            if name not in current:
                rows.append(GateRow(name, check, res.label, SKIP, detail="field missing in this result",
                                    group="regression"))
                continue
            value = current[name]
            limit = base * (1.0 + spec.max_ratio)
            breached = value > limit and (value - base) > spec.noise_floor
            detail = f"{(value / base - 1):+.1%} vs baseline {base:.4g} (max +{pct})" if base else ""
            if value > limit and not breached:
                detail += f", within noise floor {spec.noise_floor:g}"
            change = f"{(value / base - 1):+.1%}" if base else f"{value - base:+.4g}"
            why = (f"{_num(value)} vs baseline {_num(base)} ({change}): "
                   + ("over" if breached else "within") + f" the +{pct} allowance"
                   + (f" or the {spec.noise_floor:g} noise floor" if value > limit and not breached else ""))
            rows.append(GateRow(name, check, res.label, FAIL if breached else PASS,
                                (name, f"baseline * (1 + {pct})"), ("<=",), (value, limit), detail,
                                group="regression", why=why))
    return rows


def measured_names(result: dict[str, Any]) -> set[str]:
    """The targets (latency_split) or scenarios (bench.k6) a result measured."""
    data = result.get("data") or {}
    if isinstance(data.get("scenarios"), dict):
        return set(data["scenarios"])
    targets = data.get("targets")
    if isinstance(targets, list):
        return {str(t.get("name")) for t in targets if isinstance(t, dict)}
    return set()


def _successes(res: LoadedResult) -> list[tuple[str, int, int]]:
    """(what, successful, total) per measured unit of a result whose kind counts requests."""
    data = res.result.get("data") or {}
    if res.kind == "latency_split":
        return [(str(t.get("name")), int(t.get("num_ok") or 0), int(t.get("num_ok") or 0) + int(t.get("num_error") or 0))
                for t in data.get("targets") or [] if isinstance(t, dict)]
    if res.kind == "latency_sweep":
        per: dict[str, list[int]] = {}
        for p in data.get("points") or []:
            if isinstance(p, dict):
                ok_total = per.setdefault(str(p.get("target")), [0, 0])
                ok_total[0] += int(p.get("num_ok") or 0)
                ok_total[1] += int(p.get("num_ok") or 0) + int(p.get("num_error") or 0)
        return [(name, ok, total) for name, (ok, total) in per.items()]
    if res.kind.startswith("bench") and isinstance(data.get("requests"), int | float):
        total = int(data["requests"])
        return [("all scenarios", total - int(data.get("failures") or 0), total)]
    return []


def health_rows(results: list[LoadedResult]) -> list[GateRow]:
    """A run (or one of its targets) with no successful request measured nothing: never a pass."""
    rows = []
    for res in results:
        for what, ok, total in _successes(res):
            if ok == 0:
                said = f"every request failed on {what} (0 of {total} succeeded)" if total else \
                    f"no request was sent to {what}"
                rows.append(GateRow(said, "successful requests > 0", res.label, FAIL,
                                    ("successful requests",), (">",), (float(ok), 0.0),
                                    f"{what}: 0 of {total} requests succeeded", group="health",
                                    category=MEASUREMENT, why="nothing was measured, so nothing can be judged"))
    return rows


class NothingApplied(UsageError):
    """No rule of the policy judged any of the results (exit 2 unless --allow-empty)."""


def check_applied(report: GateReport, results: list[LoadedResult], *, allow_empty: bool) -> None:
    """A gate that evaluated nothing must not read as a pass."""
    if report.applied or allow_empty or report.verdict == UNRELIABLE:
        return
    kinds = ", ".join(sorted({f"{r.kind or 'unknown'}" for r in results})) or "none"
    raise NothingApplied(
        f"gate: no rule applied to this result (kind {kinds}; {report.policy}): every check was skipped, so "
        "nothing was judged; write a rule for this kind of result (see zgtool/default_gates.toml) or pass "
        "--allow-empty to accept it")


def unreliable_message(report: GateReport) -> str:
    """Why the run cannot be judged, in words: 'every request failed on A (0 of 40 succeeded)'."""
    return "; ".join(r.rule if r.group == "health" else f"{r.rule} failed ({r.why or r.detail or r.result})"
                     for r in report.unreliable_rows)


def evaluate(
    policy: Policy,
    results: list[LoadedResult],
    *,
    baseline: LoadedResult | None = None,
    max_regression: float | None = None,
) -> GateReport:
    rows = health_rows(results) + evaluate_rules(policy, results)
    if policy.paired is not None:
        rows.extend(evaluate_paired(policy.paired, results))
    spec = policy.regression
    if baseline is not None:
        if max_regression is not None:
            spec = replace(spec, max_ratio=max_regression)
        rows.extend(evaluate_regression(spec, results, baseline))
    counts = {s: sum(1 for r in rows if r.status == s) for s in (PASS, FAIL, SKIP)}
    return GateReport(
        policy=policy.source,
        results=tuple(r.label for r in results),
        rows=tuple(rows),
        baseline=baseline.label if baseline else None,
        max_regression=spec.max_ratio if baseline else None,
        counts=counts,
    )
