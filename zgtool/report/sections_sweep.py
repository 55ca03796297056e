"""Report section of latency_sweep results (latency-split -c 1,4,16 / --rate 1,2,4 / --rate sweep):
TTFT/ITL/E2E p50/p99 and achieved/goodput rate against the offered load per path, the knee per
path and each gateway's capacity tax."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from zgtool.report import svg
from zgtool.report.load import ResultSet
from zgtool.report.sections_latency import Section, _grid

KIND = "latency_sweep"


def _keys(data: dict[str, Any]) -> tuple[str, str]:
    """TTFT and E2E as the knee rule read them: open loop from each request's due time."""
    if data.get("load_kind") == "rate":
        return "ttft_from_due_ms", "e2e_from_due_ms"
    return "ttft_ms", "e2e_ms"


def _x_label(data: dict[str, Any]) -> str:
    return "offered load, req/s" if data.get("load_kind") == "rate" else "concurrency, streams"


def _loads(data: dict[str, Any]) -> list[float]:
    """Every load point of the sweep: each gets its label on the x axis."""
    return sorted({float(p["load"]) for p in data.get("points") or [] if isinstance(p.get("load"), int | float)})


def _log_x(points: list[dict[str, Any]]) -> bool:
    loads = [p["load"] for p in points if p.get("load")]
    return bool(loads) and max(loads) >= 4 * min(loads)


def _by_path(data: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(name, sorted((p for p in data.get("points", []) if p.get("target") == name), key=lambda p: p["load"]))
            for name in data.get("targets", [])]


def _xy(pts: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> tuple[list[float], list[float]]:
    """(loads, values) of the points that have a value: a missing figure is a gap, never a 0."""
    pairs = [(float(p["load"]), float(v)) for p in pts if (v := get(p)) is not None]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _latency_chart(data: dict[str, Any], metric: str, label: str) -> str:
    series: list[svg.Series] = []
    for name, pts in _by_path(data):
        color = svg.path_color_of(name)
        for stat, dash in (("p50", False), ("p99", True)):
            xs, ys = _xy(pts, lambda p, s=stat: (p.get(metric) or {}).get(s))  # type: ignore[misc]
            series.append(svg.Series(f"{name} {stat}", xs, ys, color, dash=dash, key=name))  # one legend entry
        knee = (data.get("saturation", {}).get(name) or {}).get("knee")
        kx, ky = _xy([p for p in pts if p["load"] == knee], lambda p: (p.get(metric) or {}).get("p99"))
        if kx:
            series.append(svg.Series(f"{name} knee", kx, ky, color, style="points", key=name,
                                     titles=[f"{name}: knee at {kx[0]:g}"]))
    due = ", from each request's due time" if metric.endswith("_from_due_ms") else ""
    return (f"<h3>{escape(label)} p50 (solid) and p99 (dashed){due}</h3>"
            + svg.line_chart(series, x_label=_x_label(data), y_label=f"{label}, ms",
                             x_log=_log_x(data.get("points", [])), x_ticks=_loads(data)))


def _rate_chart(data: dict[str, Any]) -> str:
    series: list[svg.Series] = []
    loads: list[float] = []
    for name, pts in _by_path(data):
        color = svg.path_color_of(name)
        loads += [float(p["load"]) for p in pts]
        series.append(svg.Series(f"{name} achieved", *_xy(pts, lambda p: p.get("achieved_rps")), color, key=name))
        gx, gy = _xy(pts, lambda p: p.get("goodput_rps"))
        if gx:
            series.append(svg.Series(f"{name} goodput", gx, gy, color, dash=True, key=name))
    if data.get("load_kind") == "rate" and loads:
        lo, hi = min(loads), max(loads)
        series.append(svg.Series("offered (keeping up)", [lo, hi], [lo, hi], "#a0aec0", dash=True))
    return ("<h3>Achieved (solid) and goodput (dashed) req/s</h3>"
            + svg.line_chart(series, x_label=_x_label(data), y_label="req/s", x_log=_log_x(data.get("points", [])), x_ticks=_loads(data)))


def _num(v: Any, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _table(data: dict[str, Any]) -> str:
    stream = any(p.get("ttft_ms") for p in data.get("points", []))
    ttft, e2e = _keys(data)
    metrics = [("TTFT", ttft), ("ITL", "itl_ms"), ("E2E", e2e)] if stream else [("E2E", e2e)]
    head = ("<tr><th>path</th><th>load</th><th>achieved req/s</th><th>goodput req/s</th>"
            + "".join(f"<th>{m} p50</th><th>{m} p99</th>" for m, _ in metrics) + "<th>errors</th><th></th></tr>")
    rows = []
    for name, pts in _by_path(data):
        sat = data.get("saturation", {}).get(name) or {}
        for p in pts:
            mark = "knee" if p["load"] == sat.get("knee") else "saturated" if p["load"] == sat.get("saturated_at") \
                else ""
            if p.get("rate_short"):
                mark = f"{mark} client behind".strip()
            cells = "".join(f"<td class=num>{_num((p.get(key) or {}).get(s))}</td>"
                            for _, key in metrics for s in ("p50", "p99"))
            rows.append(f"<tr><td>{escape(name)}</td><td class=num>{p['load']:g}</td>"
                        f"<td class=num>{_num(p.get('achieved_rps'))}</td><td class=num>{_num(p.get('goodput_rps'))}"
                        f"</td>{cells}<td class=num>{p.get('num_error', 0)}</td><td>{escape(mark)}</td></tr>")
    return f'<div class="wide"><table class="t">{head}{"".join(rows)}</table></div>'


def _one(data: dict[str, Any]) -> str:
    parts = []
    taxes = data.get("capacity_tax") or []
    if taxes:
        parts.append("".join(f'<p class="headline">{escape(t["text"])}</p>' for t in taxes))
    sats = data.get("saturation") or {}
    thin = data.get("indicative") or {}
    need = data.get("min_point_requests")
    parts.append("<ul>" + "".join(f"<li>{escape(name)}: {escape(s.get('text', ''))}"
                                  + (f" (indicative: fewer than {need} answers at a load point)" if thin.get(name)
                                     else "") + "</li>"
                                  for name, s in sats.items()) + "</ul>")
    stream = any(p.get("ttft_ms") for p in data.get("points", []))
    ttft, e2e = _keys(data)
    charts = [_latency_chart(data, ttft, "TTFT")] if stream else []
    charts.append(_latency_chart(data, e2e, "E2E"))
    if stream:
        charts.append(_latency_chart(data, "itl_ms", "ITL"))
    charts.append(_rate_chart(data))
    parts.append(_grid(charts))
    parts.append(_table(data))
    rule = (data.get("rule") or {}).get("text")
    notes = [f"Knee rule: {rule}."] if rule else []
    if data.get("stopped"):
        notes.append(f"Sweep stopped: {data['stopped']}.")
    parts.append("".join(f'<p class="note">{escape(n)}</p>' for n in notes))
    return "".join(parts)


def sweep_section(rs: ResultSet) -> Section:
    sec = Section("sweep", "Load sweep: latency and goodput against offered load")
    found = rs.labelled(KIND)
    if not found:
        sec.missing = ("no latency_sweep result among the inputs (zgtool latency-split -c 1,4,16, --rate 1,2,4 "
                       "or --rate sweep)")
        return sec
    bodies = []
    for path, result in found:
        title = f"<h3>{escape(path)}</h3>" if len(found) > 1 else ""
        bodies.append(title + _one(result.get("data") or {}))
    sec.body = "".join(bodies)
    return sec
