"""The `data` of a latency_split result: the analysed split (zgtool.latency.analysis.phases) with the
join of every attribution source (zgtool.latency.attribution.join), ready to write."""

from __future__ import annotations

import statistics
from typing import Any

from zgtool.latency.attribution.join import Boot, join_data
from zgtool.latency.records import SplitResult
from zgtool.results import to_jsonable


def result_data(res: SplitResult) -> dict[str, Any]:
    """The `data` of the versioned result: config, definitions, per-target stats and raw samples."""
    data = to_jsonable(res)
    data["join"] = join_data(res.targets, Boot.of(res.config))
    for t in data["targets"]:
        t["phases"] = {p.pop("name"): p for p in t["phases"]}
        ok_totals = [s["total_ms"] for s in t["samples"] if s["ok"] and s["total_ms"] is not None]
        t["mean_total_ms"] = statistics.fmean(ok_totals) if ok_totals else None
    return data
