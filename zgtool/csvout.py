"""`--csv DIR`: a versioned JSON result (zgtool.results) as CSV files, one function per result kind.

Every file has a header row; units stay in the column names (`total_ms`, `request_rps`); nested fields
are flattened with dots (`throughput.request_rps`, `engine.prefill_ms`); lists are joined with ';'.
Works from the result dict alone, so a saved result converts the same as a fresh one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError

Row = dict[str, Any]
# dicts whose keys carry no unit but whose values are ms (Server-Timing names, gateways' self-reports)
_MS_VALUED = {"server_timing": "server_timing", "hop_reports": "hop_reports", "engine.other_ms": "engine.other"}
_TREND_STATS = ("avg", "min", "p50", "p90", "p95", "p99", "max")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, tuple)):
        return ";".join(str(_cell(v)) for v in value)
    return value


def flatten(obj: Mapping[str, Any], prefix: str = "") -> Row:
    """{'a': {'b_ms': 1}} -> {'a.b_ms': 1}; unit-less ms dicts get '_ms' on each key."""
    out: Row = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if name in _MS_VALUED:
                base = _MS_VALUED[name]
                for k, v in value.items():
                    out[f"{base}.{k}" if str(k).endswith("_ms") else f"{base}.{k}_ms"] = _cell(v)
            else:
                out.update(flatten(value, f"{name}."))
        else:
            out[name] = _cell(value)
    return out


def write_table(path: Path, rows: Iterable[Row], first: tuple[str, ...] = ()) -> Path:
    """Rows (dicts) -> CSV; columns: `first`, then every other key in first-seen order."""
    rows = list(rows)
    columns: dict[str, None] = dict.fromkeys(first)
    for r in rows:
        columns.update(dict.fromkeys(r))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), restval="", extrasaction="raise")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(v) for k, v in r.items()})
    return path


def latency_split(data: Mapping[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    """samples.csv (one row per request), phases.csv (per target per phase), targets.csv (throughput,
    errors, per target) and differences.csv (each candidate vs the baseline, with the interval)."""
    targets = data.get("targets") or []
    samples = [{"target": t["name"], **flatten(s)} for t in targets for s in t.get("samples", [])]
    files = [write_table(out_dir / f"{prefix}samples.csv", samples, ("target",))]
    by_unit: dict[str, list[Row]] = {}
    for t in targets:
        for phase, st in (t.get("phases") or {}).items():
            unit = phase.rsplit("_", 1)[-1] if "_" in phase else ""
            summary = st.get("summary") or {}
            row: Row = {"target": t["name"], "phase": phase, "count": st.get("count")}
            row.update({f"{k}_{unit}": v for k, v in summary.items() if k != "count"})
            row.update({f"median_lo_{unit}": st.get("median_lo"), f"median_hi_{unit}": st.get("median_hi"),
                        f"waterfall_mean_{unit}": st.get("waterfall_mean_ms")})
            by_unit.setdefault(unit, []).append(row)
    for unit, rows in by_unit.items():
        files.append(write_table(out_dir / f"{prefix}phases{'' if unit == 'ms' else '_' + unit}.csv", rows))
    per_target = []
    for t in targets:
        scalars = {k: v for k, v in t.items() if k not in ("samples", "phases", "errors")}
        row = {"target": t["name"], **flatten(scalars)}
        row.pop("name", None)
        row["errors"] = ";".join(f"{k} x{v}" for k, v in (t.get("errors") or {}).items())
        if data.get("interrupted"):
            row["interrupted"] = True    # Ctrl-C: these figures cover the requests that finished
        per_target.append(row)
    files.append(write_table(out_dir / f"{prefix}targets.csv", per_target, ("target",)))
    diffs = [flatten(d) for d in data.get("differences") or []]
    files.append(write_table(out_dir / f"{prefix}differences.csv", diffs,
                             ("phase", "baseline", "candidate", "diff_ms", "lo_ms", "hi_ms", "verdict")))
    return files


def _trend_row(trend: Mapping[str, Any]) -> Row:
    unit = trend.get("unit") or "ms"
    return {"count": trend.get("count"), **{f"{k}_{unit}": trend.get(k) for k in _TREND_STATS}}


def bench(data: Mapping[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    """bench_scenarios.csv (one row per scenario), bench_phases.csv (each k6 trend of each scenario) and,
    when the result kept k6's raw points (a --segment run, a merge), bench_points.csv: one row per point."""
    scenarios = data.get("scenarios") or {}
    rows: list[Row] = []
    phases: list[Row] = []
    for name, sc in scenarios.items():
        trends = {k: v for k, v in sc.items() if isinstance(v, Mapping)}
        rows.append({"scenario": name, **{k: v for k, v in sc.items() if k not in trends and k != "name"}})
        phases.extend({"scenario": name, "metric": metric, **_trend_row(t)} for metric, t in trends.items())
    files = [write_table(out_dir / f"{prefix}bench_scenarios.csv", rows, ("scenario",)),
             write_table(out_dir / f"{prefix}bench_phases.csv", phases, ("scenario", "metric"))]
    points = data.get("points")
    if points:
        pts = ({"path": path, "metric": metric, "index": i, "value_ms": v}
               for path, per in points.items() for metric, values in per.items() for i, v in enumerate(values))
        files.append(write_table(out_dir / f"{prefix}bench_points.csv", pts))
    return files


def bench_ramp(data: Mapping[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    """bench_ramp_paths.csv (knee per path), bench_ramp_steps.csv (one row per path per rate step) and
    bench_ramp_ttft.csv (zgtool's streaming TTFT at the knee, when measured)."""
    paths = data.get("paths") or []
    files = [write_table(out_dir / f"{prefix}bench_ramp_paths.csv",
                         [{"path": p["name"], **flatten({k: v for k, v in p.items() if k not in ("name", "steps")})}
                          for p in paths], ("path",)),
             write_table(out_dir / f"{prefix}bench_ramp_steps.csv",
                         [{"path": p["name"], "step": i, **flatten(st)} for p in paths
                          for i, st in enumerate(p.get("steps") or [])], ("path", "step"))]
    ttft = data.get("ttft_at_knee") or []
    if ttft:
        files.append(write_table(out_dir / f"{prefix}bench_ramp_ttft.csv", [flatten(t) for t in ttft], ("path",)))
    return files


def generic(data: Any, out_dir: Path, prefix: str = "", name: str = "result") -> list[Path]:
    """Any other kind: its scalar fields as one row, and each list of records as its own table."""
    if not isinstance(data, Mapping):
        return [write_table(out_dir / f"{prefix}{name}.csv", [{"value": data}])]
    files = []
    scalars = {k: v for k, v in data.items()
               if not (isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v))}
    files.append(write_table(out_dir / f"{prefix}{name}.csv", [flatten(scalars)]))
    for key, value in data.items():
        if key not in scalars:
            files.append(write_table(out_dir / f"{prefix}{name}_{key}.csv", [flatten(x) for x in value]))
    return files


WRITERS: dict[str, Callable[[Mapping[str, Any], Path, str], list[Path]]] = {
    "latency_split": latency_split,
    "bench.k6": bench,
    "bench.k6.ramp": bench_ramp,
}


def write_csv(result: Mapping[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    """The CSV files of one result into out_dir; returns their paths."""
    kind, data = result.get("kind"), result.get("data")
    if not isinstance(kind, str) or data is None:
        raise UsageError("--csv: not a zgtool result (no kind/data)")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--csv {out_dir} exists and is not a folder")
    writer = WRITERS.get(kind)
    if writer is not None:
        return writer(data, out_dir, prefix)
    return generic(data, out_dir, prefix, name=kind.replace(".", "_"))
