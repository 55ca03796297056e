"""The report's server-metrics section (`latency-split --scrape`): each request on the run's time axis (the
request timeline: when it started, how long it took, per path), and under it, on the same axis, the series
the servers' own /metrics gave (queue and running requests, KV and prefix-cache use, GPU, tokens/s)."""

from __future__ import annotations

from html import escape
from typing import Any

from zgtool.latency.render.servermetrics import verdict_lines
from zgtool.latency.schedule.scrapeloop import warnings
from zgtool.report import svg
from zgtool.report.load import ResultSet
from zgtool.report.model import ok_samples, splits
from zgtool.report.sections_latency import Section, missing_reason
from zgtool.report.verdict import config_label

# (title, series, y label, scale to the drawn unit)
GROUPS = (
    ("Requests queued and running in the engine", ("waiting", "running"), "requests", 1.0),
    ("KV cache in use, prefix-cache hit rate, GPU utilisation", ("kv_usage", "prefix_hit_rate", "gpu_util"), "%", 100.0),
    ("Tokens per second", ("output_tokens_s", "prefix_hit_tokens_s"), "tokens/s", 1.0),
    ("Requests answered per second (gateway)", ("requests_s",), "requests/s", 1.0),
)
LABELS = {"waiting": "waiting", "running": "running", "kv_usage": "KV in use", "prefix_hit_rate": "prefix-cache hit rate",
          "gpu_util": "GPU util", "output_tokens_s": "output tokens/s", "prefix_hit_tokens_s": "prefix-cache hit tokens/s",
          "requests_s": "requests/s"}


def _span(r: dict[str, Any]) -> tuple[float, float]:
    data = r.get("data") or {}
    ts = [t for src in data.get("server_metrics") or [] for t in src.get("t_s") or []]
    ts += [s["start_s"] + (s.get("total_ms") or 0.0) / 1e3 for t in data.get("targets") or [] for s in ok_samples(t)
           if s.get("start_s") is not None]
    return (0.0, max(ts)) if ts else (0.0, 1.0)


def _timeline(r: dict[str, Any], span: tuple[float, float]) -> str:
    series = []
    for t in (r.get("data") or {}).get("targets") or []:
        ok = [s for s in ok_samples(t) if s.get("start_s") is not None and s.get("total_ms") is not None]
        series.append(svg.Series(t["name"], [s["start_s"] for s in ok], [s["total_ms"] for s in ok],
                                 svg.path_color_of(t["name"]), "points",
                                 titles=[f"{t['name']} #{s.get('index', '')}: {s['total_ms']:.1f} ms" for s in ok]))
    return "<h3>Request timeline: each request's total latency at its start</h3>" + svg.line_chart(
        series, x_label="seconds since the run started", y_label="total latency, ms", y_min=0, x_range=span)


def _group_chart(sources: list[dict[str, Any]], group: tuple[str, tuple[str, ...], str, float],
                 span: tuple[float, float]) -> str | None:
    title, keys, unit, scale = group
    series: list[svg.Series] = []
    for src in sources:
        who = src.get("engine") or src["url"]
        for key in keys:
            pts = [(t, y * scale) for t, y in zip(src["t_s"], (src.get("series") or {}).get(key) or [], strict=False)
                   if y is not None]
            if not pts:
                continue
            series.append(svg.Series(f"{who} {LABELS[key]}", [t for t, _ in pts], [y for _, y in pts],
                                     svg.metric_color(len(series)), "step" if key in ("waiting", "running") else "line"))
    if not series:
        return None
    return f"<h3>{escape(title)}</h3>" + svg.line_chart(series, x_label="seconds since the run started",
                                                        y_label=unit if unit != "%" else "% ", y_min=0,
                                                        y_fmt="%" if unit == "%" else "", x_range=span)


def server_metrics_section(rs: ResultSet) -> Section:
    sec = Section("server", "The servers' own metrics over the run (--scrape)")
    found = [r for r in splits(rs) if (r.get("data") or {}).get("server_metrics")]
    if not found:
        sec.missing = (missing_reason(rs, "latency_split", "latency") if not splits(rs)
                       else "no latency_split result was run with --scrape")
        return sec
    parts = []
    for r in found:
        data = r["data"]
        sources = data["server_metrics"]
        span = _span(r)
        parts.append(f"<h3>{escape(config_label(data.get('config') or {}))}</h3>")
        said = verdict_lines(sources) + warnings(sources)
        if said:
            parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in said) + "</ul>")
        parts.append(_timeline(r, span))
        parts.extend(c for g in GROUPS if (c := _group_chart(sources, g, span)) is not None)
        parts.append('<p class="muted">' + escape("; ".join(
            f"{s['url']}: {s['scrapes']} scrapes every {s['interval_s']:g} s"
            + (f" (one point kept per {s['stride']})" if s.get("stride", 1) > 1 else "") for s in sources)) + "</p>")
    sec.body = "".join(parts)
    return sec
