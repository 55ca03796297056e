"""Inline SVG charts for the HTML report: line/step charts (CDFs, timelines), stacked bars
(waterfalls), overlaid histograms and grouped bars. Pure string building; every text is escaped.

No xmlns attribute: inline SVG in HTML5 does not need one, and the report carries no URL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

# Same phase, same colour on every path: gateway parts warm, engine parts blue, client grey.
PHASE_COLORS = {
    "dns_ms": "#9aa5b1", "connect_ms": "#7b8794", "tls_ms": "#52606d",
    "gw_auth_ms": "#f6ad55", "gw_ratelimit_ms": "#ed8936", "gw_translate_ms": "#dd6b20",
    "gw_moderation_ms": "#c05621", "gw_cache_ms": "#fbd38d", "gw_other_ms": "#e53e3e",
    "queue_ms": "#bee3f8", "prefill_ms": "#63b3ed", "decode_ms": "#3182ce", "detok_ms": "#2c5282",
    "safety_ms": "#805ad5", "engine_other_ms": "#90cdf4", "network_client_ms": "#a0aec0",
}
PATH_COLORS = ("#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795")
METRIC_COLORS = ("#4a5568", "#b83280", "#2c7a7b", "#975a16", "#553c9a", "#718096")
_EXTRA = ("#f687b3", "#9f7aea", "#4fd1c5", "#f6e05e", "#fc8181", "#68d391")


def phase_color(name: str) -> str:
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    if name.startswith("gw_"):
        return "#f6ad55"
    return _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def path_color(i: int) -> str:
    return PATH_COLORS[i % len(PATH_COLORS)]


def metric_color(i: int) -> str:
    """Series that are not paths (the metrics of one timeline) stay out of the paths' colours."""
    return METRIC_COLORS[i % len(METRIC_COLORS)]


_PATHS: dict[str, str] = {}
_ALIASES: dict[str, str] = {}


def assign_path_colors(order: Sequence[str], aliases: dict[str, str] | None = None) -> None:
    """Fix one colour per path for a whole report, in this order; an alias shares its path's."""
    _PATHS.clear()
    _ALIASES.clear()
    _ALIASES.update(aliases or {})
    for name in order:
        path_color_of(name)


def path_color_of(name: str) -> str:
    """The path's colour in every section; `<path>_stream` (k6's streaming scenario of the same
    path) is a lighter shade of it."""
    base = name.removesuffix("_stream")
    base = _ALIASES.get(base, base)
    if base not in _PATHS:
        _PATHS[base] = PATH_COLORS[len(_PATHS) % len(PATH_COLORS)]
    color = _PATHS[base]
    return _lighter(color) if name.endswith("_stream") else color


def _lighter(color: str, share: float = 0.45) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * share):02x}" for c in (r, g, b))


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if float(v).is_integer() and a < 1e6:
        return f"{int(v):,}"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}" if a >= 100 else f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0 ** e * m for e in range(lo_e, hi_e + 1) for m in (1, 2, 5) if lo <= 10.0 ** e * m <= hi] or [lo, hi]


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    style: str = "line"          # line | step | points
    dash: bool = False
    key: str = ""                # legend toggle group (defaults to the name)
    titles: Sequence[str] = field(default_factory=list)   # per-point tooltips (points style)


def _legend(items: Sequence[tuple[str, str, str]], x: float, y: float, width: float) -> str:
    out, cx, cy = [], x, y
    for name, color, key in items:
        w = 22 + 7 * len(name)
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + 16
        out.append(f'<g class="lg" data-key="{escape(key)}"><rect x="{cx:.1f}" y="{cy - 9:.1f}" width="12" '
                   f'height="10" fill="{color}"/><text x="{cx + 16:.1f}" y="{cy:.1f}">{escape(name)}</text></g>')
        cx += w
    return "".join(out)


def _line_chart(series: Sequence[Series], *, x_label: str, y_label: str, width: int = 620, height: int = 260,
                ticks: int = 5, x_log: bool = False, y_min: float | None = None, y_max: float | None = None,
               bands: Sequence[tuple[float, float, str]] = (), y_fmt: str = "",
               x_ticks: Sequence[float] = (), x_range: tuple[float, float] | None = None) -> str:
    """Lines, steps or points on shared axes; bands are shaded x-ranges (stages) with labels. `x_ticks`
    labels exactly those x values (a sweep's load points) instead of round numbers; `x_range` widens the x
    axis to at least that span (charts stacked on one time axis)."""
    pts = [(x, y) for s in series for x, y in zip(s.xs, s.ys, strict=False)
           if x is not None and y is not None and (not x_log or x > 0)]
    if not pts:
        return '<p class="muted">no data points to draw</p>'
    left, right, top = 56, 14, 12
    legend_rows = 1 + sum(7 * len(s.name) + 22 for s in series) // max(width - left - right, 1)
    bottom = 38 + 16 * legend_rows
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for p in pts] + [b[0] for b in bands] + [b[1] for b in bands] + list(x_range or ())
    ys = [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    if x_log:
        x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
        x1 = x1 if x1 > x0 else x0 * 10
        xt = log_ticks(x0, x1)
    else:
        xt = nice_ticks(x0, x1, ticks)
        x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    if x_ticks:
        xt = sorted({x for x in x_ticks if x0 <= x <= x1})
    ylo = min(ys) if y_min is None else y_min
    yhi = max(ys) if y_max is None else y_max
    yt = nice_ticks(min(ylo, 0.0) if y_min is None else ylo, yhi, ticks)
    y0, y1 = yt[0], max(yt[-1], yhi)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1

    def sx(x: float) -> float:
        if x_log:
            return left + (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * pw
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img">']
    for i, (b0, b1, label) in enumerate(bands):
        fill = "#edf2f7" if i % 2 == 0 else "#e2e8f0"
        out.append(f'<g class="band"><rect x="{sx(b0):.1f}" y="{top}" width="{max(sx(b1) - sx(b0), 0.5):.1f}" '
                   f'height="{ph}" fill="{fill}"><title>{escape(label)}: {fmt(b0)}–{fmt(b1)}</title></rect>'
                   f'<text class="bandlabel" x="{sx(b0) + 2:.1f}" y="{top + 9 + (i % 3) * 9}">{escape(label)}</text></g>')
    for t in yt:
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{sy(t) + 3:.1f}" text-anchor="end">{fmt(t)}{y_fmt}</text>')
    for t in xt:
        if x0 <= t <= x1:
            out.append(f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + ph}"/>'
                       f'<text class="tick" x="{sx(t):.1f}" y="{top + ph + 12}" text-anchor="middle">{fmt(t)}</text>')
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>')
    for s in series:
        key = escape(s.key or s.name)
        p = [(sx(x), sy(y)) for x, y in zip(s.xs, s.ys, strict=False)
             if x is not None and y is not None and (not x_log or x > 0)]
        if not p:
            continue
        if s.style == "points":
            titles = list(s.titles) or [""] * len(p)
            dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6"><title>{escape(t)}</title></circle>'
                           if t else f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6"/>'
                           for (x, y), t in zip(p, titles + [""] * (len(p) - len(titles)), strict=False))
            out.append(f'<g class="s" data-key="{key}" fill="{s.color}">{dots}</g>')
            continue
        if s.style == "step":
            d = [f"M{p[0][0]:.1f},{p[0][1]:.1f}"]
            for xb, yb in p[1:]:
                d.append(f"H{xb:.1f}V{yb:.1f}")
            path = "".join(d)
        else:
            path = "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in p)
        dash = ' stroke-dasharray="5 3"' if s.dash else ""
        out.append(f'<path class="s" data-key="{key}" d="{path}" fill="none" stroke="{s.color}" '
                   f'stroke-width="1.8"{dash}><title>{escape(s.name)}</title></path>')
    out.append(f'<text class="axis" x="{left + pw / 2:.1f}" y="{top + ph + 26}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text class="axis" transform="translate(12,{top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    seen: dict[str, tuple[str, str, str]] = {}
    for s in series:
        seen.setdefault(s.key or s.name, (s.key or s.name, s.color, s.key or s.name))
    out.append(_legend(list(seen.values()), left, top + ph + 42, pw))
    out.append("</svg>")
    return "".join(out)


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    return xs, [(i + 1) / n * 100.0 for i in range(n)]


def histogram_series(values: Sequence[float], edges: Sequence[float]) -> tuple[list[float], list[float]]:
    """Share of values (%) per bin, as step-chart points (left edges + the last right edge)."""
    counts = [0] * (len(edges) - 1)
    for v in values:
        for i in range(len(edges) - 1):
            if edges[i] <= v < edges[i + 1] or (i == len(edges) - 2 and v == edges[-1]):
                counts[i] += 1
                break
    n = max(len(values), 1)
    ys = [c / n * 100.0 for c in counts]
    return list(edges), ys + [ys[-1] if ys else 0.0]


def bin_edges(all_values: Sequence[float], bins: int = 24) -> list[float]:
    lo, hi = min(all_values), max(all_values)
    if hi <= lo:
        hi = lo + max(abs(lo) * 0.1, 1e-3)
    step = (hi - lo) / bins
    return [lo + i * step for i in range(bins + 1)]


LABEL_CHAR_PX = 7.2    # a .rowlabel character (12 px sans) is at most this wide on average


def _stacked_bars(rows: Sequence[tuple[str, Sequence[tuple[str, float, str]]]], *, unit: str = "ms",
                  width: int = 940, bar_h: int = 26, label_w: int = 120) -> str:
    """One horizontal bar per row, segments left to right; the shared scale is the longest row."""
    totals = [sum(max(v, 0.0) for _, v, _ in segs) for _, segs in rows]
    scale_max = max(totals) if totals and max(totals) > 0 else 1.0
    # a label (a whole URL) wider than its column goes on its own line above the bar: never cut
    above = any(len(label) * LABEL_CHAR_PX > label_w - 6 for label, _ in rows)
    legend_w = label_w
    if above:
        label_w = 0
    pw = width - label_w - 70
    legend_items: dict[str, tuple[str, str, str]] = {}
    row_h = bar_h + 10 + (16 if above else 0)
    height = 14 + len(rows) * row_h
    out = [f'<svg class="chart" viewBox="0 0 {width} {{H}}" role="img">']
    for i, ((label, segs), total) in enumerate(zip(rows, totals, strict=True)):
        y = 8 + i * row_h
        if above:
            out.append(f'<text class="rowlabel" x="0" y="{y + 11}">{escape(label)}</text>')
            y += 16
        else:
            out.append(f'<text class="rowlabel" x="{label_w - 6}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="end">'
                       f'{escape(label)}</text>')
        x = float(label_w)
        for name, v, color in segs:
            if v <= 0:
                continue
            w = v / scale_max * pw
            legend_items.setdefault(name, (name, color, name))
            text = (f'<text class="seglabel" x="{x + w / 2:.1f}" y="{y + bar_h / 2 + 4:.1f}" '
                    f'text-anchor="middle">{fmt(v)}</text>') if w > 34 else ""
            out.append(f'<g class="s" data-key="{escape(name)}"><rect x="{x:.1f}" y="{y}" width="{w:.2f}" '
                       f'height="{bar_h}" fill="{color}"><title>{escape(label)} · {escape(name)}: {fmt(v)} {unit}'
                       f'</title></rect>{text}</g>')
            x += w
        out.append(f'<text class="tick" x="{x + 4:.1f}" y="{y + bar_h / 2 + 4:.1f}">{fmt(total)} {unit}</text>')
    legend_y = height + 10
    items = list(legend_items.values())
    legend_x = 0 if above else legend_w
    legend_rows = 1 + sum(22 + 7 * len(n) for n, _, _ in items) // max(width - legend_x, 1)
    out.append(_legend(items, legend_x, legend_y, width - legend_x))
    out.append("</svg>")
    total_h = legend_y + 16 * legend_rows
    return "".join(out).replace("{H}", str(total_h), 1)


def _grouped_bars(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float | None], str]], *,
                  unit: str, width: int = 620, height: int = 240, ticks: int = 5) -> str:
    """Vertical bars: one cluster per category, one bar per group (e.g. per path)."""
    vals = [v for _, vs, _ in groups for v in vs if v is not None]
    if not vals:
        return '<p class="muted">no data points to draw</p>'
    left, right, top, bottom = 56, 10, 10, 56
    pw, ph = width - left - right, height - top - bottom
    yt = nice_ticks(0.0, max(vals), ticks)
    y1 = max(yt[-1], max(vals)) or 1.0
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img">']
    for t in yt:
        y = top + ph - t / y1 * ph
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">{fmt(t)}</text>')
    cw = pw / max(len(categories), 1)
    bw = cw * 0.8 / max(len(groups), 1)
    for ci, cat in enumerate(categories):
        cx = left + ci * cw + cw * 0.1
        for gi, (gname, vs, color) in enumerate(groups):
            v = vs[ci] if ci < len(vs) else None
            if v is None:
                continue
            h = v / y1 * ph
            out.append(f'<g class="s" data-key="{escape(gname)}"><rect x="{cx + gi * bw:.1f}" y="{top + ph - h:.1f}" '
                       f'width="{bw * 0.92:.1f}" height="{h:.1f}" fill="{color}"><title>{escape(cat)} · '
                       f'{escape(gname)}: {fmt(v)} {escape(unit)}</title></rect></g>')
        out.append(f'<text class="tick" x="{cx + cw * 0.4:.1f}" y="{top + ph + 12}" text-anchor="middle">'
                   f'{escape(cat)}</text>')
    out.append(f'<text class="axis" transform="translate(12,{top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(unit)}</text>')
    out.append(_legend([(g, c, g) for g, _, c in groups], left, top + ph + 36, pw))
    out.append("</svg>")
    return "".join(out)


def _diverging_bars(rows: Sequence[tuple[str, float, float | None, float | None, str, bool]], *, unit: str = "ms",
                    width: int = 940, bar_h: int = 16, label_w: int = 170) -> str:
    """Signed bars around a zero line with interval whiskers: (label, value, lo, hi, colour, muted)."""
    if not rows:
        return '<p class="muted">no data points to draw</p>'
    ext = [abs(x) for _, v, lo, hi, _, _ in rows for x in (v, lo, hi) if x is not None] or [1.0]
    m = max(ext) or 1.0
    pw = width - label_w - 80
    zero = label_w + pw / 2
    height = 24 + len(rows) * (bar_h + 6)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img">',
           f'<line class="frame" x1="{zero:.1f}" x2="{zero:.1f}" y1="4" y2="{height - 16}"/>',
           f'<text class="tick" x="{zero:.1f}" y="{height - 4}" text-anchor="middle">0 {escape(unit)}</text>',
           f'<text class="tick" x="{label_w}" y="{height - 4}">−{fmt(m)}</text>',
           f'<text class="tick" x="{label_w + pw}" y="{height - 4}" text-anchor="end">+{fmt(m)}</text>']
    for i, (label, v, lo, hi, color, muted) in enumerate(rows):
        y = 6 + i * (bar_h + 6)
        x = zero + min(v, 0) / m * pw / 2
        w = abs(v) / m * pw / 2
        op = ' opacity="0.35"' if muted else ""
        ci = f" [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else ""
        out.append(f'<text class="rowlabel" x="{label_w - 6}" y="{y + bar_h - 4}" text-anchor="end">{escape(label)}</text>'
                   f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.8):.1f}" height="{bar_h}" fill="{color}"{op}>'
                   f'<title>{escape(label)}: {v:+.3f} {escape(unit)}{ci}</title></rect>')
        if lo is not None and hi is not None:
            x0, x1 = zero + lo / m * pw / 2, zero + hi / m * pw / 2
            cy = y + bar_h / 2
            out.append(f'<path d="M{x0:.1f},{cy:.1f}H{x1:.1f}M{x0:.1f},{cy - 4:.1f}V{cy + 4:.1f}M{x1:.1f},{cy - 4:.1f}'
                       f'V{cy + 4:.1f}" stroke="#1a202c" stroke-width="1" fill="none"/>')
        tx = zero + (max(hi if hi is not None else v, v, 0) / m * pw / 2) + 4
        out.append(f'<text class="tick" x="{tx:.1f}" y="{y + bar_h - 4}">{v:+.2f}</text>')
    out.append("</svg>")
    return "".join(out)


# --- one chart per screen: a wide drawing, and a 420-unit one (fewer ticks, text at 1:1) for phones ---

NARROW_WIDTH = 420       # the narrow drawing's viewBox width: at a 420 px screen its text is ~its nominal size


def _dual(make: Callable[[int, int], str], wide: int) -> str:
    """Both drawings; CSS shows the wide one above 600 px and the narrow one below (html.CSS)."""
    w = make(wide, 5)
    if not w.startswith("<svg"):
        return w
    return f'<div class="cw">{w}</div><div class="cn">{make(NARROW_WIDTH, 3)}</div>'


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, width: int = 620, height: int = 260,
               **kw: Any) -> str:
    """Lines, steps or points on shared axes (see _line_chart), drawn for wide and narrow screens."""
    return _dual(lambda w, n: _line_chart(series, x_label=x_label, y_label=y_label, width=w, height=height,
                                          ticks=n, **kw), width)


def stacked_bars(rows: Sequence[tuple[str, Sequence[tuple[str, float, str]]]], *, unit: str = "ms",
                 width: int = 940, bar_h: int = 26, label_w: int = 120) -> str:
    return _dual(lambda w, n: _stacked_bars(rows, unit=unit, width=w, bar_h=bar_h,
                                            label_w=label_w if w >= 560 else min(label_w, 100)), width)


def grouped_bars(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float | None], str]], *,
                 unit: str, width: int = 620, height: int = 240) -> str:
    return _dual(lambda w, n: _grouped_bars(categories, groups, unit=unit, width=w, height=height, ticks=n), width)


def diverging_bars(rows: Sequence[tuple[str, float, float | None, float | None, str, bool]], *, unit: str = "ms",
                   width: int = 620, bar_h: int = 16, label_w: int = 150) -> str:
    return _dual(lambda w, n: _diverging_bars(rows, unit=unit, width=w, bar_h=bar_h,
                                              label_w=label_w if w >= 560 else min(label_w, 130)), width)
