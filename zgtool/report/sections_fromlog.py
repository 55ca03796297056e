"""The report's third-witness section (`latency-split --from-log`): what the gateway's own access log says
each joined request took, and its upstream, beside zgtool's measured hop."""

from __future__ import annotations

from html import escape
from typing import Any

from zgtool.latency.attribution.fromlog import lines
from zgtool.report.load import ResultSet
from zgtool.report.model import splits
from zgtool.report.sections_latency import Section, missing_reason
from zgtool.report.verdict import config_label

COLUMNS = (("matched", "requests joined", "{:d}"), ("log_total_ms_p50", "logged total, ms", "{:.3f}"),
           ("log_upstream_ms_p50", "logged upstream, ms", "{:.3f}"),
           ("log_gateway_ms_p50", "gateway by its log, ms", "{:.3f}"),
           ("client_total_ms_p50", "zgtool total, ms", "{:.3f}"),
           ("client_minus_log_upstream_ms_p50", "zgtool total − logged upstream, ms", "{:.3f}"))


def _table(fl: dict[str, Any]) -> str:
    head = "<tr><th>path</th>" + "".join(f"<th>{escape(label)}</th>" for _, label, _ in COLUMNS) + \
        "<th>zgtool's measured hop, ms</th></tr>"
    rows = []
    for name, t in (fl.get("targets") or {}).items():
        cells = "".join(f"<td>{'–' if t.get(k) is None else fmt.format(t[k])}</td>" for k, _, fmt in COLUMNS)
        hop = (fl.get("zgtool_hop_ms") or {}).get(name)
        hop_cell = "–" if hop is None else f"{hop['diff_ms']:+.3f}"
        rows.append(f"<tr><td>{escape(name)}</td>{cells}<td>{hop_cell}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def from_log_section(rs: ResultSet) -> Section:
    sec = Section("fromlog", "The gateway's own access log (--from-log): medians of the joined requests")
    found = [r for r in splits(rs) if (r.get("data") or {}).get("from_log")]
    if not found:
        sec.missing = (missing_reason(rs, "latency_split", "latency") if not splits(rs)
                       else "no latency_split result was run with --from-log")
        return sec
    parts = []
    for r in found:
        fl = r["data"]["from_log"]
        parts.append(f"<h3>{escape(config_label(r['data'].get('config') or {}))}: {escape(fl['format'])} log "
                     f"{escape(fl['path'])}</h3>")
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines(fl)) + "</ul>")
        if fl.get("matched"):
            parts.append(_table(fl))
    sec.body = "".join(parts)
    return sec
