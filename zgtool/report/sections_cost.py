"""The report's cost section (`latency-split --core-hour-price/--gpu-hour-price`): per path, each local process
group's CPU per request and its dollars per million output tokens, the gateway's net of the baseline, and the
engine's GPU time where priced; "not measured" where the client could not read the processes."""

from __future__ import annotations

from html import escape
from typing import Any

from zgtool.latency.analysis.cost import cost_lines, usd
from zgtool.report.load import ResultSet
from zgtool.report.model import splits
from zgtool.report.sections_latency import Section, missing_reason
from zgtool.report.verdict import config_label


def _money(v: float | None) -> str:
    return "–" if v is None else usd(v)


def _rows(cost: dict[str, Any]) -> str:
    rows = []
    for t in cost["targets"]:
        name = escape(t["name"])
        if t.get("not_measured"):
            rows.append(f"<tr><td>{name}</td><td colspan=3 class=muted>{escape(t['not_measured'])}</td></tr>")
        for proc, p in (t.get("processes") or {}).items():
            rows.append(f"<tr><td>{name}</td><td>{escape(proc)}</td><td>{p['cpu_s_per_request'] * 1e3:.3f}</td>"
                        f"<td>{_money(p['usd_per_million_output_tokens'])}</td></tr>")
        if (gw := t.get("gateway")) is not None:
            rows.append(f"<tr><td>{name}</td><td><b>gateway</b> ({escape(', '.join(gw['processes']))}, less the "
                        f"baseline's idle use)</td><td>{gw['cpu_s_per_request'] * 1e3:.3f}</td>"
                        f"<td><b>{_money(gw['usd_per_million_output_tokens'])}</b></td></tr>")
        if (g := t.get("engine_gpu")) is not None:
            rows.append(f"<tr><td>{name}</td><td>engine GPU (held)</td><td>{g['gpu_s_per_request'] * 1e3:.1f} GPU ms"
                        f"</td><td>{_money(g['usd_per_million_output_tokens'])}</td></tr>")
    return ("<table><tr><th>path</th><th>process</th><th>CPU ms / request</th><th>$ / million output tokens</th>"
            "</tr>" + "".join(rows) + "</table>")


def cost_section(rs: ResultSet) -> Section:
    sec = Section("cost", "What each path costs in money")
    found = [r for r in splits(rs) if (r.get("data") or {}).get("cost")]
    if not found:
        sec.missing = (missing_reason(rs, "latency_split", "latency") if not splits(rs)
                       else "no latency_split result was run with --core-hour-price")
        return sec
    parts = []
    for r in found:
        data = r["data"]
        c = data["cost"]
        prices = [f"${c['core_hour_price_usd']:g} per core-hour" if c.get("core_hour_price_usd") is not None else "",
                  f"${c['gpu_hour_price_usd']:g} per GPU-hour" if c.get("gpu_hour_price_usd") is not None else ""]
        parts.append(f"<h3>{escape(config_label(data.get('config') or {}))}: at "
                     f"{escape(' and '.join(p for p in prices if p))}</h3>")
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in cost_lines(c)) + "</ul>")
        parts.append(_rows(c))
    sec.body = "".join(parts)
    return sec
