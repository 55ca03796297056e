"""Dotted field lookup over any zgtool result, shared by rules and the regression check.

A field is looked up, first hit wins, relative to:
  1. `data`                        e.g. failure_rate, ttft_ms.p50
  2. each group inside `data`:     data.scenarios / data.targets / data.paths / data.summary,
                                   so a k6 result's scenarios read as direct.http_req_duration.p95
  3. the whole result              e.g. data.failure_rate, environment.cpus
A segment matches a dict key exactly, or with '-' written as '_' (nginx_buffered for
"nginx-buffered"), or the "name"/"label"/"target" of an element of a list. Containers
named summary/phases/stats/values may be skipped, so a latency_split result's
data.targets[name=direct].phases[name=ttft_ms].summary.p50 reads as direct.ttft_ms.p50,
and as plain ttft_ms.p50 when exactly one target has it. In a list, `baseline` and `candidate`
name the first and second member when none is called that (baseline.ttft_ms.p50 on any run).
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from collections.abc import Iterator
from typing import Any

from zgtool.gate.expr import MissingField

GROUPS = ("scenarios", "targets", "paths", "summary")
TRANSPARENT = ("summary", "phases", "stats", "values")
_LIST_KEYS = ("name", "label", "target", "path")
# a list of named members (latency_split targets) read by position when no member has the name:
# the first target is the baseline, the second the candidate, whatever their URLs
POSITIONS = {"baseline": 0, "candidate": 1}


def roots(result: dict[str, Any]) -> list[Any]:
    """The nodes a field is looked up from, in order."""
    data = result.get("data")
    out: list[Any] = []
    if isinstance(data, dict):
        out.append(data)
        out.extend(data[g] for g in GROUPS if isinstance(data.get(g), dict | list))
    out.append(result)
    return out


def _step(node: Any, segment: str) -> tuple[bool, Any]:
    if isinstance(node, dict):
        if segment in node:
            return True, node[segment]
        for key, value in node.items():
            if str(key).replace("-", "_") == segment:
                return True, value
        for key in TRANSPARENT:
            if isinstance(node.get(key), dict | list):
                found, value = _step(node[key], segment)
                if found:
                    return True, value
        return False, None
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict):
                for k in _LIST_KEYS:
                    label = item.get(k)
                    if isinstance(label, str) and (label == segment or label.replace("-", "_") == segment):
                        return True, item
        index = POSITIONS.get(segment)
        if index is not None and index < len(node) and isinstance(node[index], dict):
            return True, node[index]
    return False, None


def _walk(node: Any, parts: list[str]) -> tuple[bool, Any]:
    for seg in parts:
        found, node = _step(node, seg)
        if not found:
            return False, None
    return True, node


def lookup(result: dict[str, Any], field: str) -> float:
    """The numeric value of `field` in `result`; MissingField says why there is none."""
    parts = field.split(".")
    for root in roots(result):
        found, value = _walk(root, parts)
        if not found:
            continue
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, int | float):
            return float(value)
        if value is None:
            raise MissingField(field, "is null in this result (not measured)")
        if isinstance(value, dict):
            keys = [k for k, v in value.items() if _is_number(v)]
            hint = f"; pick one of: {', '.join(keys[:12])}" if keys else ""
            raise MissingField(field, f"is a group, not a number{hint}")
        raise MissingField(field, f"is {type(value).__name__}, not a number")
    value_in_one = _in_one_member(result, field)
    if value_in_one is not None:
        return value_in_one
    close = difflib.get_close_matches(field, list(leaf_names(result)), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise MissingField(field, f"not found in this result{hint}")


def _in_one_member(result: dict[str, Any], field: str) -> float | None:
    """`ttft_ms.p50` when exactly one member of a group (e.g. one target) has it."""
    data = result.get("data")
    if not isinstance(data, dict):
        return None
    hits: list[tuple[str, Any]] = []
    for group in GROUPS:
        members = data.get(group)
        items = members.items() if isinstance(members, dict) else (
            (_label(m), m) for m in members) if isinstance(members, list) else ()
        for name, member in items:
            found, value = _walk(member, field.split("."))
            if found and _is_number(value):
                hits.append((f"{name}", value))
    if len(hits) == 1:
        return float(hits[0][1])
    if len(hits) > 1:
        names = ", ".join(n for n, _ in hits)
        raise MissingField(field, f"is ambiguous: present for {names}; prefix it, e.g. "
                                  f"{hits[0][0].replace('-', '_')}.{field}")
    return None


def _label(item: Any) -> str:
    if isinstance(item, dict):
        return next((item[k] for k in _LIST_KEYS if isinstance(item.get(k), str)), "?")
    return "?"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every numeric leaf under node as (dotted path, value)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, prefix if key in TRANSPARENT else f"{prefix}{key}.")
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, dict):
                label = next((item[k] for k in _LIST_KEYS if isinstance(item.get(k), str)), None)
                if label is not None:
                    yield from leaves(item, f"{prefix}{label}.")
    elif _is_number(node) and math.isfinite(node):
        yield prefix[:-1], float(node)


def leaf_names(result: dict[str, Any]) -> Iterator[str]:
    """Leaf paths as a rule would write them (group prefixes dropped)."""
    data = result.get("data")
    if not isinstance(data, dict):
        return
    for group in GROUPS:
        if isinstance(data.get(group), dict | list):
            yield from (name for name, _ in leaves(data[group]))
    for name, _ in leaves({k: v for k, v in data.items() if k not in GROUPS}):
        yield name


def matching_leaves(result: dict[str, Any], patterns: tuple[str, ...]) -> dict[str, float]:
    """Leaves (rule-style names) matching any glob pattern; '*' spans dots."""
    data = result.get("data")
    if not isinstance(data, dict):
        return {}
    out: dict[str, float] = {}
    named = list(leaves({k: v for k, v in data.items() if k not in GROUPS}))
    for group in GROUPS:
        if isinstance(data.get(group), dict | list):
            named.extend(leaves(data[group]))
    for name, value in named:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            out.setdefault(name, value)
    return out
