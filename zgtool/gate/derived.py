"""Figures a gate rule reads that a result does not store itself, derived from what it does store.

    latency_split   data.failure_rate               failed / sent, over every target
    latency_sweep   data.failure_rate_lowest_load   failed / sent at each path's lowest load point (higher
                                                    points may fail by design: the sweep looks for the knee)

A figure the result already carries is never replaced; the input is not modified.
"""

from __future__ import annotations

import copy
from typing import Any


def _rate(failed: int, sent: int) -> float | None:
    return failed / sent if sent else None


def _split_failure_rate(data: dict[str, Any]) -> float | None:
    targets = [t for t in data.get("targets") or [] if isinstance(t, dict)]
    ok = sum(int(t.get("num_ok") or 0) for t in targets)
    failed = sum(int(t.get("num_error") or 0) for t in targets)
    return _rate(failed, ok + failed)


def _sweep_lowest_failure_rate(data: dict[str, Any]) -> float | None:
    lowest: dict[str, dict[str, Any]] = {}
    for p in data.get("points") or []:
        if not isinstance(p, dict) or not isinstance(p.get("load"), int | float):
            continue
        name = str(p.get("target"))
        if name not in lowest or p["load"] < lowest[name]["load"]:
            lowest[name] = p
    ok = sum(int(p.get("num_ok") or 0) for p in lowest.values())
    failed = sum(int(p.get("num_error") or 0) for p in lowest.values())
    return _rate(failed, ok + failed)


_DERIVED = {
    "latency_split": (("failure_rate", _split_failure_rate),),
    "latency_sweep": (("failure_rate_lowest_load", _sweep_lowest_failure_rate),),
}


def with_derived(result: dict[str, Any]) -> dict[str, Any]:
    """The result with its derived figures added to `data` (a copy when anything is added)."""
    data = result.get("data")
    derivers = _DERIVED.get(str(result.get("kind", "")), ())
    if not isinstance(data, dict) or not derivers:
        return result
    added = {name: fn(data) for name, fn in derivers if name not in data}
    added = {k: v for k, v in added.items() if v is not None}
    if not added:
        return result
    out = copy.copy(result)
    out["data"] = {**data, **added}
    return out
