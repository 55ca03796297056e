"""Report sections drawn from latency_split (and gate/verify) results: verdict and key numbers,
waterfall per path, percentile table, latency CDF, TTFT and inter-token distributions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Any

from zgtool.report import svg
from zgtool.report.load import ResultSet
from zgtool.report.model import human, ok_samples, splits, stage_reasons
from zgtool.report.tax import engine_known
from zgtool.report.verdict import config_label, phase_label

PCT_PHASES = ("total_ms", "ttft_ms", "ttft_any_ms", "ttfb_ms", "ttfb_headers_ms", "ttfb_body_ms", "tpot_ms", "itl_ms")


@dataclass
class Section:
    id: str
    title: str
    body: str = ""
    missing: str | None = None        # why the section has no data (it is still listed)


def missing_reason(rs: ResultSet, kind: str, *stages: str) -> str:
    reasons = stage_reasons(rs)
    for st in stages:
        for name, why in reasons.items():
            if name == st or name.startswith(st):
                return f"{name} {why}"
    return f"no {kind} result among the inputs"


def _ms(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.2f}" if signed else svg.fmt(v)


def waterfall_section(rs: ResultSet) -> Section:
    sec = Section("waterfall", "Where the time goes: latency waterfall per path")
    found = splits(rs)
    if not found:
        sec.missing = missing_reason(rs, "latency_split", "latency")
        return sec
    parts = ['<p class="note">Mean contribution of each phase per request; the rows of one bar sum to the mean '
             'total. Client set-up is grey, gateway parts warm colours, engine parts blue — the same phase has the '
             'same colour on every path.</p>']
    for r in found:
        d = r.get("data") or {}
        phases = d.get("waterfall_phases") or []
        rows = []
        for t in d.get("targets") or []:
            unknown = not engine_known(t)   # the rest then holds the engine's time: unattributed, not network
            segs = [(phase_label(p, unknown), (t["phases"].get(p) or {}).get("waterfall_mean_ms") or 0.0,
                     svg.phase_color(p)) for p in phases if p in t.get("phases", {})]
            rows.append((t["name"], segs))
        parts.append(f'<h3>{escape(config_label(d.get("config") or {}))}</h3>' + svg.stacked_bars(rows))
        if d.get("join"):
            parts.append(join_table(d["join"]))
        traced = [f"{escape(t['name'])}: {escape(tc['verdict'])} ({tc['came_back']} of {tc['sent']})"
                  for t in d.get("targets") or [] if (tc := t.get("trace_context"))]
        if traced:
            parts.append('<p class="note">Trace context per path (the engine\'s spans under each request\'s fresh '
                         "traceparent): " + "; ".join(traced) + "</p>")
        echoed = [f"{escape(t['name'])}: {escape(te['verdict'])} (of {te['sent']}: {te['survived']} survived, "
                  f"{te['rewritten']} rewritten, {te['dropped']} dropped)"
                  for t in d.get("targets") or [] if (te := t.get("trace_echo"))]
        if echoed:
            parts.append('<p class="note">Trace context per path (the trace id the engine echoed against the '
                         "one sent): " + "; ".join(echoed) + "</p>")
        parts.extend(f'<p class="note">{escape(line)}</p>' for t in d.get("targets") or []
                     if (line := hop_account_line(t)))
    sec.body = "".join(parts)
    return sec


def hop_account_line(t: dict[str, Any]) -> str | None:
    """A path's gateway's own account from its spans (zgtool.latency.analysis.hopspans), in one line."""
    acc = t.get("hop_account")
    if not isinstance(acc, dict) or not isinstance(acc.get("p50_call_ms"), int | float):
        return None
    parts = []
    if isinstance(acc.get("p50_before_call_ms"), int | float):
        parts.append(f"{acc['p50_before_call_ms']:.2f} ms before its call to the engine")
    call = f"its call {acc['p50_call_ms']:.2f} ms"
    if isinstance(acc.get("p50_call_beyond_engine_ms"), int | float):
        call += f", {acc['p50_call_beyond_engine_ms']:.2f} ms of it beyond the engine's own time"
    parts.append(call)
    if isinstance(acc.get("p50_after_call_ms"), int | float):
        parts.append(f"{acc['p50_after_call_ms']:.2f} ms after it (to its server span's end)")
    return (f"{t.get('name', '?')}: the gateway's own account ({acc.get('source', 'its spans')}, "
            f"{acc.get('requests', '?')} of {acc.get('of', '?')} requests, medians): " + "; ".join(parts))


def _stat(s: dict[str, Any] | None, key: str = "median_ms", clip: bool = False) -> str:
    """A figure and its interval; `clip` for a latency, whose bounds are never below 0."""
    if not s or s.get(key) is None:
        return "–"
    lo, hi = s.get("lo_ms"), s.get("hi_ms")
    if clip and lo is not None and hi is not None:
        lo, hi = max(lo, 0.0), max(hi, 0.0)
    ci = f" <span class=muted>[{lo:.2f}, {hi:.2f}]</span>" if lo is not None and hi is not None else ""
    if not ci and s.get("note"):            # "within its resolution", "no interval (k distinct values)"
        ci = f" <span class=muted>({escape(str(s['note']))})</span>"
    return f"{s[key]:.2f}{ci}"


def join_table(join: dict[str, Any]) -> str:
    """The join of one latency_split: per path the engine's source and total, each hop's self-report, the time
    outside the engine and the unexplained remainder; then each hop's report beside its measured tax."""
    head = ("<tr><th>path</th><th>engine time from</th><th>total</th><th>engine total</th><th>hops (self-reported)"
            "</th><th>outside engine</th><th>unexplained</th></tr>")
    rows = []
    for name, p in (join.get("paths") or {}).items():
        src = ", ".join(f"{escape(s)} ({n})" for s, n in (p.get("engine_sources") or {}).items()) or "none"
        hops = "; ".join(f"{escape(h)} {_stat(v, clip=True)}" for h, v in (p.get("hops_self_ms") or {}).items()) or "–"
        flag = (f" <b>{p['flagged']} below −{p.get('clock_tolerance_ms', 1):g} ms</b>" if p.get("flagged") else "")
        rows.append(f"<tr><td>{escape(name)}</td><td>{src}</td><td class=num>{_stat(p.get('total_ms'), clip=True)}</td>"
                    f"<td class=num>{_stat(p.get('engine_total_ms'), clip=True)}</td><td>{hops}</td>"
                    f"<td class=num>{_stat(p.get('outside_engine_ms'), clip=True)}</td>"
                    f"<td class=num>{_stat(p.get('remainder_ms'))}{flag}</td></tr>")
    html = ('<p class="note">Joined per request: unexplained = total − DNS/connect/TLS − each hop\'s own reported '
            "time − the engine's total (− the engine front, where shown): client, sending, network and what no hop "
            "reports of itself. Medians, "
            "95% bootstrap CI.</p>" + f'<table class="t"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')
    audit = join.get("hop_audit") or []
    if audit:
        arows = "".join(
            f"<tr><td>{escape(a['path'])}</td><td>{escape(a['hop'])} ({escape(a['self_report'])})</td>"
            f"<td class=num>{_stat(a.get('self_ms'), clip=True)}</td><td class=num>{_stat(a.get('measured_tax_ms'), 'diff_ms')}</td>"
            f"<td class=num>{_unreported(a)}</td></tr>" for a in audit)
        html += ('<table class="t"><thead><tr><th>path</th><th>hop</th><th>self-reported</th><th>measured tax</th>'
                 f"<th>not in its report</th></tr></thead><tbody>{arows}</tbody></table>")
    return html


def percentile_section(rs: ResultSet) -> Section:
    sec = Section("percentiles", "Percentiles")
    found = splits(rs)
    if not found:
        sec.missing = missing_reason(rs, "latency_split", "latency")
        return sec
    head = ("<tr><th>config</th><th>path</th><th>metric</th><th>n</th><th>p50</th><th>p90</th><th>p95</th>"
            "<th>p99</th><th>mean</th><th>median 95% CI</th><th>CI drawn on</th></tr>")
    body = []
    for r in found:
        d = r.get("data") or {}
        label = config_label(d.get("config") or {})
        for t in d.get("targets") or []:
            for m in PCT_PHASES:
                p = (t.get("phases") or {}).get(m)
                if not p:
                    continue
                s = p.get("summary") or {}
                ci, method = median_ci_cell(p)
                body.append(f"<tr><td>{escape(label)}</td><td>{escape(t['name'])}</td><td>{escape(human(m))}</td>"
                            f"<td class=num>{p.get('count', 0)}</td>"
                            + "".join(f"<td class=num>{_ms(s.get(k))}</td>" for k in ("p50", "p90", "p95", "p99", "mean"))
                            + f"<td class=num>{ci}</td><td>{escape(method)}</td></tr>")
    sec.body = ('<p class="note">Median 95% CI: bootstrap over rounds. A latency cannot be negative: its interval '
                "is drawn on log latency where the result says so (never below 0); one whose linear interval went below "
                "0 has none (a bound clipped to 0 would be an artefact); a remainder's can be below 0.</p>"
                f'<div class="wide"><table class="t"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
                + _definitions(found))
    return sec


def _definitions(found: list[dict[str, Any]]) -> str:
    """Which point in time each first-byte / first-token figure is, in the result's own words."""
    defs: dict[str, str] = {}
    for r in found:
        d = r.get("data") or {}
        shown = {m for t in d.get("targets") or [] for m in (t.get("phases") or {}) if m in PCT_PHASES}
        for m in PCT_PHASES:
            if m in shown and m not in defs and (d.get("definitions") or {}).get(m):
                defs[m] = d["definitions"][m]
    if not defs:
        return ""
    def words(txt: str) -> str:
        txt = re.sub(r"\b[a-z]+(?:_[a-z0-9]+)+\b", lambda m: human(m.group(0)), txt)
        return re.sub(r"\bNone\b", "no value", txt)

    items = "".join(f"<li><b>{escape(human(m))}</b>: {escape(words(txt))}</li>" for m, txt in defs.items())
    return f'<details><summary>What each figure measures</summary><ul class="ev">{items}</ul></details>'


CI_METHODS = {"log": "log latency", "linear, clipped at 0": "linear, clipped at 0", "linear": "linear"}


def median_ci_cell(p: dict[str, Any]) -> tuple[str, str]:
    """('[lo, hi]', how it was drawn): a latency's interval never shows a negative bound."""
    lo, hi = p.get("median_lo"), p.get("median_hi")
    count, of = p.get("count"), p.get("of")
    if lo is None or hi is None:
        if isinstance(count, int) and count < 8:       # no interval from so few (latency-split's MIN_FIGURES)
            return f"too few: {count} of {of if isinstance(of, int) else count} kept", ""
        return str(p.get("ci_note") or "–"), ""      # "no interval (k distinct values)": never a 0.00 artefact
    method = str(p.get("ci_method") or "linear")
    kept = f" ({count}/{of})" if isinstance(count, int) and isinstance(of, int) and count < of else ""
    if lo < 0 and p.get("ci_method") != "linear":
        # a latency's bound below 0 (an older result, drawn linear and widened for few rounds): clipped it would
        # read 0, the widening's artefact (issue 38)
        return f"no interval (widened below 0){kept}", ""
    # a latency's bound is drawn above 0 (log scale, or no interval); a remainder's below 0 is its own
    return f"[{svg.fmt(lo)}, {svg.fmt(hi)}]{kept}", CI_METHODS.get(method, method)


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def throughput_section(rs: ResultSet) -> Section:
    """The field's load figures per path (vLLM's request/output throughput and goodput at an SLO),
    and the CPU each local process group spent per request."""
    sec = Section("throughput", "Throughput, goodput and CPU per request")
    found = splits(rs)
    if not found:
        sec.missing = missing_reason(rs, "latency_split", "latency")
        return sec
    hits_read = any((r.get("data") or {}).get("prefix_cache") for r in found)
    head = ("<tr><th>config</th><th>path</th><th>req/s</th><th>output tok/s</th><th>tokens in / out</th>"
            "<th>goodput req/s</th>" + ("<th>prefix-cache hits</th>" if hits_read else "")
            + "<th>CPU ms per request</th></tr>")
    body, slos = [], set()
    for r in found:
        d = r.get("data") or {}
        label = config_label(d.get("config") or {})
        for t in d.get("targets") or []:
            tp = t.get("throughput") or {}
            slo = tp.get("slo")
            if slo:
                slos.add(", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in sorted(slo.items()) if isinstance(v, (int, float))))
            good = ("–" if tp.get("goodput_rps") is None else
                    f'{tp["goodput_rps"]:.2f} ({tp.get("good_requests")}/{tp.get("requests_ok")})')
            cpu = "; ".join(f"{escape(str(k))} {v:.2f}" for k, v in (t.get("cpu_ms_per_request") or {}).items()) or "–"
            body.append(f"<tr><td>{escape(label)}</td><td>{escape(t['name'])}</td>"
                        f"<td class=num>{_num(tp.get('request_rps'), '{:.2f}')}</td>"
                        f"<td class=num>{_num(tp.get('output_tok_s'))}</td>"
                        f"<td class=num>{_num(tp.get('input_tokens'), '{:d}')} / {_num(tp.get('output_tokens'), '{:d}')}</td>"
                        f"<td class=num>{good}</td>"
                        + (f"<td class=num>{prefix_hits(d, t['name'])}</td>" if hits_read else "")
                        + f"<td>{cpu}</td></tr>")
    note = ('<p class="note">req/s and output tok/s: ok requests and their output tokens over the wall time of each '
            "path's measured blocks (closed loop, so they reflect the configured concurrency, not a capacity). "
            "Goodput: requests per second that met every SLO target"
            + (f" ({escape('; '.join(sorted(slos)))})" if slos else " (none set: pass --slo ttft:MS tpot:MS e2e:MS)")
            + (". Prefix-cache hits: the engine's own counters (zgtool's zg_prefix_cache_*, vLLM's "
               "prefix_cache_hits/queries) read around each path's blocks: prompt tokens served from the cache"
               if hits_read else "")
            + ". CPU: the CPU time of each local process group while the path was measured, per request "
            "(on one host a gateway's CPU is taken from the engine).</p>")
    sec.body = note + f'<table class="t"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    return sec


def prefix_hits(data: dict[str, Any], name: str) -> str:
    """`77.1% (1,184 of 1,536 tokens)`: a path's prefix-cache hit rate summed over the engines read."""
    hits = queries = 0.0
    for engine in data.get("prefix_cache") or []:
        per = (engine.get("targets") or {}).get(name) or {}
        hits += float(per.get("hit_tokens") or 0.0)
        queries += float(per.get("query_tokens") or 0.0)
    if queries <= 0:
        return "–"
    return f"{hits / queries:.1%} ({hits:,.0f} of {queries:,.0f} tokens)"


def _per_target_values(r: dict[str, Any], metric: str) -> list[tuple[str, list[float]]]:
    out = []
    for t in (r.get("data") or {}).get("targets") or []:
        ok = ok_samples(t)
        if metric == "itl_ms":
            vals = [g for s in ok for g in s.get("itl_ms") or []]
        else:
            vals = [s[metric] for s in ok if s.get(metric) is not None]
        out.append((t["name"], vals))
    return out


def _grid(charts: list[str]) -> str:
    return '<div class="grid">' + "".join(f"<div>{c}</div>" for c in charts) + "</div>"


def _cdf_chart(r: dict[str, Any], metric: str, title: str, x_label: str) -> str:
    """One CDF per target of a latency_split result, on shared axes."""
    series = []
    for name, vals in _per_target_values(r, metric):
        xs, ys = svg.cdf_points(vals)
        series.append(svg.Series(name, xs, ys, svg.path_color_of(name), "step"))
    return f"<h3>{escape(title)}</h3>" + svg.line_chart(series, x_label=x_label, y_label="% of requests ≤ x",
                                                         y_min=0, y_max=100, y_fmt="%")


def cdf_section(rs: ResultSet) -> Section:
    sec = Section("cdf", "Latency CDF per path")
    found = splits(rs)
    if not found:
        sec.missing = missing_reason(rs, "latency_split", "latency")
        return sec
    charts = []
    for r in found:
        label = config_label((r.get("data") or {}).get("config") or {})
        charts.append(_cdf_chart(r, "total_ms", f"{label}: total latency CDF", "total latency, ms"))
    sec.body = _grid(charts)
    return sec


def tokens_section(rs: ResultSet) -> Section:
    sec = Section("tokens", "Time to first token and inter-token gaps")
    streams = [r for r in splits(rs) if ((r.get("data") or {}).get("config") or {}).get("stream")]
    if not streams:
        sec.missing = missing_reason(rs, "streaming latency_split", "latency-stream")
        return sec
    charts = []
    for r in streams:
        label = config_label((r.get("data") or {}).get("config") or {})
        charts.append(_cdf_chart(r, "ttft_ms", f"{label}: TTFT CDF", "time to first token, ms"))
        per = _per_target_values(r, "itl_ms")
        pooled = [v for _, vals in per for v in vals]
        if pooled:
            edges = svg.bin_edges(pooled)
            hist = []
            for name, vals in per:
                xs, ys = svg.histogram_series(vals, edges)
                hist.append(svg.Series(f"{name} (n={len(vals)})", xs, ys, svg.path_color_of(name), "step", key=name))
            charts.append(f"<h3>{escape(label)}: inter-token gap distribution</h3>"
                          + svg.line_chart(hist, x_label="gap between content events, ms", y_label="% of gaps",
                                           y_min=0, y_fmt="%"))
    sec.body = _grid(charts)
    return sec


def _unreported(a: dict[str, Any]) -> str:
    """The hop audit's gap, or "within its resolution" where the report is coarser than the tax (issue 38)."""
    u = a.get("unreported_ms") or {}
    if u.get("verdict") == "within its resolution":
        return f"within its resolution ({a.get('resolution_ms', 1):g} ms)"
    return _stat(u or None, "diff_ms")
