"""The report's first section: the verdict's headline, what qualifies the measurement (client lag,
a load generator behind its schedule, the machine's load), one card per configuration leading with
what is significant (the tax outside the engine and the first token, with [lo, hi]; the total below
it, smaller), the tax per phase, the gate and the stages that ran."""

from __future__ import annotations

from html import escape

from zgtool.latency.render.split import fmt_ci
from zgtool.report import svg
from zgtool.report.health import health_lines
from zgtool.report.load import ResultSet
from zgtool.report.model import human, splits
from zgtool.report.sections_latency import Section, _grid, missing_reason
from zgtool.report.tax import engine_explains_total
from zgtool.report.verdict import (
    HIGHER,
    LOWER,
    NOT_SIGNIFICANT,
    ConfigTax,
    PhaseTax,
    describe,
    phase_label,
    verdict,
)


def _signed(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:+.2f}" if abs(v) < 100 else f"{v:+.1f}"


def _sig_badge(sig: str) -> str:
    cls = "bad" if sig == HIGHER else "good" if sig == LOWER else "muted"
    return f'<span class="badge {cls}">{escape(sig)}</span>'


def _state(p: PhaseTax | None, *, outside: bool = False, explained: bool = False) -> str:
    """A figure's standing in words: significant, not significant, negligible, within noise, engine jitter."""
    if p is None:
        return ""
    if p.significance == NOT_SIGNIFICANT:
        return "not significant"
    if p.negligible:
        return f"negligible (< {p.min_effect_ms:.2f} ms)" if p.min_effect_ms is not None else "negligible"
    if outside and p.significance == LOWER:
        return "a difference within noise"
    if explained:
        return "significant: engine jitter, not the path"
    if p.significant_adj is False:
        return "significant alone, not after the family adjustment"
    return "significant"


def _line(name: str, p: PhaseTax | None, state: str, cls: str) -> str:
    if p is None:
        return ""
    ci = "" if p.lo_ms is None or p.hi_ms is None else f' <span class="ci">{escape(fmt_ci(p.lo_ms, p.hi_ms))}</span>'
    return f'<div class="{cls}">{escape(name)} <b>{_signed(p.diff_ms)} ms</b>{ci} · {escape(state)}</div>'


def card(row: ConfigTax) -> str:
    """One configuration: the outside-engine tax large (the total when the engine's time is unknown),
    the first token on a stream, the total below, smaller."""
    oe = row.outside_engine
    explained = engine_explains_total(row)
    lead: PhaseTax | None
    if oe is not None and not row.attribution_missing:
        lead, what, state = oe, "outside the engine", _state(oe, outside=True)
        bad = oe.significance == HIGHER and not oe.negligible
    else:
        what = "total (outside-engine time not attributed)" if row.attribution_missing else "total"
        lead, state = row.total, _state(row.total, explained=explained)
        bad = row.significance == HIGHER and not explained and not (row.total and row.total.negligible)
    big = (f'<div class="v">{_signed(lead.diff_ms)} ms</div><div class="ci">'
           f'{escape(fmt_ci(lead.lo_ms, lead.hi_ms)) + " ms" if lead.lo_ms is not None else "no interval"} · '
           f'{escape(state)}</div>') if lead is not None else '<div class="v">–</div>'
    parts = [f'<div class="k">{escape(row.label)} · {escape(row.candidate)} − {escape(row.baseline)}</div>', big,
             f'<div class="s">{escape(what)}</div>']
    if row.stream and row.first_token_missing:
        parts.append(f'<div class="sub">{escape(row.first_token_missing)}</div>')
    if row.stream:
        parts.append(_line("first token (TTFT)", row.ttft, _state(row.ttft), "sub"))
        if row.ttft is None or row.ttft.significance == NOT_SIGNIFICANT:
            parts.append(_line("first byte (TTFB)", row.ttfb, _state(row.ttfb), "sub"))
    if lead is not row.total:
        parts.append(_line("total", row.total, _state(row.total, explained=explained), "small"))
    parts.append(f'<div class="small">{escape(row.baseline)} {svg.fmt(row.baseline_total_ms) if row.baseline_total_ms is not None else "–"} ms'
                 f' → {escape(row.candidate)} {svg.fmt(row.candidate_total_ms) if row.candidate_total_ms is not None else "–"} ms '
                 '(median totals)</div>')
    return f'<div class="card{" bad" if bad else ""}">{"".join(parts)}</div>'


def verdict_section(rs: ResultSet) -> Section:
    sec = Section("verdict", "Verdict and key numbers")
    found = splits(rs)
    v = verdict(found)
    parts: list[str] = []
    if v is None:
        sec.missing = missing_reason(rs, "latency_split with two paths", "latency")
    else:
        parts.append(f'<p class="headline">{escape(v.headline)}</p>')
        warn = health_lines(found)
        if warn:
            parts.append('<div class="warnbox" id="measurement-health">' +
                         "".join(f"<p>{escape(w)}</p>" for w in warn) + "</div>")
        parts.append(f'<div class="cards">{"".join(card(r) for r in v.rows)}</div>')
        adj = (" Significance in the headline uses the family-adjusted interval (Bonferroni over the "
               f"{len(v.rows)} configurations compared)." if v.family_adjusted else "")
        parts.append('<p class="note">Each card: gateway − direct medians with the 95% bootstrap interval [lo, hi]; '
                     "an interval containing 0 is not significant. Outside the engine = total minus the engine's own "
                     f"time, the path's own cost.{adj}</p>")
        parts.append(_grid([f"<h3>{escape(row.label)}</h3>" + svg.diverging_bars(_tax_rows(row)) for row in v.rows]))
        parts.append(_phase_table(v.rows))
        parts.append("<ul>" + "".join(f"<li>{escape(describe(r))}</li>" for r in v.rows) + "</ul>")
    parts.append(_gate_table(rs))
    parts.append(_stages_table(rs))
    sec.body = "".join(p for p in parts if p)
    if sec.body and sec.missing:
        sec.body = f'<p class="missing">Verdict: {escape(sec.missing)}</p>' + sec.body
        sec.missing = None
    return sec


def _items(row: ConfigTax) -> list[PhaseTax]:
    return [p for p in (row.total, row.ttft, row.ttfb, row.outside_engine) if p is not None] + row.phases


def _phase_table(rows: list[ConfigTax]) -> str:
    head = ("<tr><th>config</th><th>phase</th><th>tax ms (median diff)</th><th>95% CI</th>"
            "<th>% of direct total</th><th>significance</th></tr>")
    body = []
    for row in rows:
        for i, p in enumerate(_items(row)):
            dim = ' class="muted"' if p.significance == NOT_SIGNIFICANT else ""
            pct = "–" if p.pct_of_total is None else f"{p.pct_of_total:+.1f}%"
            body.append(f"<tr{dim}><td>{escape(row.label) if i == 0 else ''}</td>"
                        f"<td>{escape(phase_label(p.phase, row.engine_unknown))}</td>"
                        f"<td class=num>{_signed(p.diff_ms)}</td><td class=num>{escape(fmt_ci(p.lo_ms, p.hi_ms))}</td>"
                        f"<td class=num>{pct}</td><td>{_sig_badge(p.significance)}</td></tr>")
    return ('<details><summary>Tax per phase as a table (candidate − baseline medians, bootstrap 95% CI [lo, hi]; '
            'an interval containing 0 is not significant)</summary>'
            f'<div class="wide"><table class="t"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
            '</details>')


def _tax_rows(row: ConfigTax) -> list[tuple[str, float, float | None, float | None, str, bool]]:
    rows: list[tuple[str, float, float | None, float | None, str, bool]] = []
    for p, colour in ((row.outside_engine, "#9b2c2c"), (row.ttft, "#4a5568"), (row.total, "#1a202c")):
        if p is not None:
            rows.append((human(p.phase), p.diff_ms, p.lo_ms, p.hi_ms, colour, p.significance == NOT_SIGNIFICANT))
    # sub-0.01 ms phases are noise at this scale; the table keeps them
    rows += [(phase_label(p.phase, row.engine_unknown), p.diff_ms, p.lo_ms, p.hi_ms, svg.phase_color(p.phase),
              p.significance == NOT_SIGNIFICANT) for p in row.phases if abs(p.diff_ms) >= 0.01]
    return rows


def _gate_badge(row: dict) -> str:
    """A pass whose interval reaches above the allowance is no clean green."""
    if row["status"] == "pass":
        return "warn" if row.get("inconclusive") else "good"
    return "bad" if row["status"] == "fail" else "muted"


def _gate_table(rs: ResultSet) -> str:
    out = []
    for r in rs.of("gate"):
        d = r.get("data") or {}
        rows = "".join(
            f'<tr><td><span class="badge {_gate_badge(x)}">'
            f'{escape(x["status"])}{" (inconclusive)" if x.get("inconclusive") and x["status"] == "pass" else ""}'
            f'</span></td><td>{escape(x.get("rule") or "")}</td><td><code>{escape(x.get("check") or "")}'
            f'</code></td><td>{escape(str(x.get("result")))}</td><td class=num>'
            f'{escape(" vs ".join(svg.fmt(v) for v in x.get("values") or []) or x.get("detail") or "")}'
            f'{"<br>" + escape(x["why"]) if x.get("inconclusive") and x.get("why") else ""}</td></tr>'
            for x in d.get("rows") or [])
        counts = d.get("counts") or {}
        marked = sum(1 for x in d.get("rows") or [] if x.get("inconclusive") and x["status"] == "pass")
        blind = f" ({marked} inconclusive)" if marked else ""     # verify's gate result carries the rows alone
        out.append(f'<h3>Gate: {escape(str(d.get("policy", "")).rsplit("/", 1)[-1])} — {counts.get("pass", 0)} pass'
                   f'{blind}, {counts.get("fail", 0)} fail, {counts.get("skip", 0)} skip</h3><div class="wide"><table class="t">'
                   '<thead><tr><th>status</th><th>rule</th><th>check</th><th>result</th><th>measured</th></tr></thead>'
                   f'<tbody>{rows}</tbody></table></div>')
    return "".join(out)


def _stages_table(rs: ResultSet) -> str:
    v = rs.first("verify")
    if v is None:
        return ""
    stages = (v.get("data") or {}).get("stages") or []
    bad = ("failed", "breached", "unreliable", "interrupted")  # a finding, never green or grey
    rows = "".join(f'<tr><td><span class="badge {"good" if s["status"] == "ok" else "bad" if s["status"] in bad else "muted"}">'
                   f'{escape(s["status"])}</span></td><td>{escape(s["title"])}</td><td class=num>{s["seconds"]:.1f}</td>'
                   f'<td>{escape(s.get("reason") or "")}</td></tr>' for s in stages)
    return (f'<details><summary>What ran ({len(stages)} stages, '
            f'{(v.get("data") or {}).get("wall_s", 0):.0f} s)</summary><div class="wide"><table class="t"><thead><tr>'
            f'<th>status</th><th>stage</th><th>s</th><th>note</th></tr></thead><tbody>{rows}</tbody></table></div>'
            '</details>')

