"""`latency-split --from-log FORMAT:PATH`: the gateway's own access log as a third witness of the hop, beside the
engine's timing and zgtool's (issue 39 item 5). Each log line is joined to the request zgtool sent by id: the
W3C traceparent zgtool sends (its trace id), or the request id the answer carried (x-request-id/request-id).

Per joined request: the gateway's logged time for it (nginx $request_time, Envoy %DURATION%), its logged
upstream time (nginx $upstream_response_time, Envoy's upstream service time, LiteLLM endTime - startTime),
the gateway's own share by its log (the difference of the two), and zgtool's client total less the logged
upstream time (what the client saw outside the upstream: the gateway and the network to it). Medians are set
beside zgtool's measured difference between the paths. nginx logs milliseconds: a sub-millisecond hop reads
as 0 or 1 ms on single requests; the median over many is still coarse and said so.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from zgtool.errors import UsageError
from zgtool.latency.records import SplitResult
from zgtool.workload.accesslog import FORMATS, read

MAX_ROWS = 1000          # per-request rows kept in the result


def parse_from_log(spec: str) -> tuple[str, Path]:
    """'FORMAT:PATH' checked before anything is sent (the file itself may be written during the run)."""
    fmt, sep, path = spec.partition(":")
    if not sep or fmt not in FORMATS or not path:
        raise UsageError(f"--from-log {spec}: give FORMAT:PATH with FORMAT one of {', '.join(FORMATS)}")
    return fmt, Path(path).expanduser()


def _p50(vals: list[float]) -> float | None:
    return round(median(vals), 3) if vals else None


def compare(spec: str, res: SplitResult) -> dict[str, Any]:
    """The result's `from_log`: the log read after the run and joined to the samples by id."""
    fmt, path = parse_from_log(spec)
    try:
        log = read(fmt, path)
    except UsageError as exc:
        return {"format": fmt, "path": str(path), "error": str(exc), "matched": 0}
    ids: dict[str, tuple[str, Any]] = {}
    for tr in res.targets:
        for s in tr.samples:
            for key in (s.trace_id, s.request_id):
                if s.ok and key:
                    ids[key] = (tr.name, s)
    rows: list[dict[str, Any]] = []
    for e in log.entries:
        hit = ids.get(e.request_id or "")
        if hit is None:
            continue
        name, s = hit
        row = {"target": name, "index": s.index, "line": e.line, "client_total_ms": s.total_ms,
               "log_total_ms": e.total_ms, "log_upstream_ms": e.upstream_ms}
        if e.total_ms is not None and e.upstream_ms is not None:
            row["log_gateway_ms"] = round(e.total_ms - e.upstream_ms, 3)
        if e.upstream_ms is not None and s.total_ms is not None:
            row["client_minus_log_upstream_ms"] = round(s.total_ms - e.upstream_ms, 3)
        rows.append(row)
    per: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == name]
        per[name] = {"matched": len(mine), **{f"{k}_p50": _p50([r[k] for r in mine if r.get(k) is not None])
                                             for k in ("log_total_ms", "log_upstream_ms", "log_gateway_ms",
                                                       "client_total_ms", "client_minus_log_upstream_ms")}}
    return {"format": fmt, "path": str(path), "lines_used": len(log.entries), "skipped": log.skipped,
            "first_bad_line": log.first_bad_line, "not_llm": log.not_llm, "matched": len(rows),
            "unmatched": len(log.entries) - len(rows), "targets": per, "requests": rows[:MAX_ROWS],
            "zgtool_hop_ms": _hops(res)}


def _hops(res: SplitResult) -> dict[str, dict[str, Any]]:
    """zgtool's own difference per candidate (outside the engine where measured, else in total)."""
    out = {}
    for tr in res.targets[1:]:
        diffs = {d.phase: d for d in res.differences if d.candidate == tr.name}
        for phase in ("outside_engine_ms", "total_ms"):
            d = diffs.get(phase)
            if d is not None and d.diff_ms is not None:
                out[tr.name] = {"phase": phase, "diff_ms": d.diff_ms, "lo_ms": d.lo_ms, "hi_ms": d.hi_ms}
                break
    return out


def lines(data: dict[str, Any]) -> list[str]:
    """What the log says beside zgtool's figure, one line per path it covers (or why it says nothing)."""
    who = f"the {data['format']} log {Path(data['path']).name}"
    if data.get("error"):
        return [f"--from-log: {data['error']}"]
    if not data["matched"]:
        return [f"--from-log: none of the {data['lines_used']} requests in {who} carries an id of this run's "
                "requests (log the traceparent header or the answer's request id)"]
    out = []
    for name, t in data["targets"].items():
        parts = [f"{name}: {who} joins {t['matched']} request(s)"]
        if t["log_gateway_ms_p50"] is not None:
            parts.append(f"its own time less its upstream time, median {t['log_gateway_ms_p50']:.3f} ms"
                         + (" (nginx logs whole ms, each rounded apart: one request can read -1 ms)"
                            if data["format"] == "nginx" else ""))
        if t["client_minus_log_upstream_ms_p50"] is not None:
            parts.append(f"zgtool's total less the logged upstream time, median "
                         f"{t['client_minus_log_upstream_ms_p50']:.3f} ms")
        hop = data["zgtool_hop_ms"].get(name)
        if hop is not None:
            where = "outside the engine" if hop["phase"] == "outside_engine_ms" else "in total"
            parts.append(f"zgtool measured {hop['diff_ms']:+.3f} ms {where} over the first path")
        out.append("; ".join(parts))
    if data["skipped"]:
        out.append(f"--from-log: {data['skipped']} malformed line(s) skipped (first: line {data['first_bad_line']})")
    return out
