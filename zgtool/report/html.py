"""One self-contained HTML page from result files: inline CSS, inline SVG, a few lines of inline
JS (legend toggles). No external URL of any kind: it opens from disk in any browser, offline."""

from __future__ import annotations

import datetime as _dt
from html import escape
from pathlib import Path

from zgtool.report.load import ResultSet, collect
from zgtool.report.sections_cost import cost_section
from zgtool.report.sections_fromlog import from_log_section
from zgtool.report.sections_latency import (
    Section,
    cdf_section,
    percentile_section,
    throughput_section,
    tokens_section,
    waterfall_section,
)
from zgtool.report.sections_other import (
    engine_section,
    environment_section,
    intermediaries_section,
    k6_section,
    network_section,
    recommendations_section,
    stream_section,
)
from zgtool.report.sections_server import server_metrics_section
from zgtool.report.sections_sweep import sweep_section
from zgtool.report.sections_verdict import verdict_section

CSS = """
:root{--fg:#1a202c;--muted:#718096;--line:#e2e8f0;--bg:#fff;--panel:#f7fafc;--bad:#c53030;--good:#2f855a;--warn:#b7791f}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg);margin:0}header{padding:18px 28px;border-bottom:1px solid var(--line);background:var(--panel)}
header h1{margin:0 0 4px;font-size:22px}header .sub{color:var(--muted)}nav{padding:8px 28px;border-bottom:1px solid var(--line);
position:sticky;top:0;background:#fffffff0;z-index:2}nav a{margin-right:14px;color:#2b6cb0;text-decoration:none;font-size:13px}
nav a.off{color:var(--muted)}main{padding:0 28px 40px;max-width:1400px}section{border-bottom:1px solid var(--line);padding:14px 0 20px}
h2{font-size:18px;margin:8px 0 10px}h3{font-size:14px;margin:14px 0 6px;color:#2d3748}
.headline{font-size:16px;font-weight:600;margin:6px 0 12px}.note{color:var(--muted);font-size:12.5px;max-width:900px}
.missing{color:var(--warn);background:#fffaf0;border:1px solid #fbd38d;padding:6px 10px;border-radius:4px;display:inline-block}
.muted{color:var(--muted)}table.t{border-collapse:collapse;margin:8px 0;font-size:12.5px}
table.t th,table.t td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
table.t td.num{text-align:right;font-variant-numeric:tabular-nums}table.t tr.muted td{color:var(--muted)}
table.kv{border-collapse:collapse;font-size:12.5px;margin:6px 0}table.kv th{text-align:left;color:var(--muted);font-weight:normal;
padding:2px 10px 2px 0;vertical-align:top}table.kv td{padding:2px 0;word-break:break-all}
.badge{display:inline-block;padding:0 6px;border-radius:9px;font-size:11.5px;background:#edf2f7}
.badge.bad{background:#fed7d7;color:var(--bad)}.badge.good{background:#c6f6d5;color:var(--good)}
.badge.warn{background:#fefcbf;color:var(--warn)}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:8px 12px;min-width:190px;background:var(--panel)}
.card.bad{border-color:#feb2b2}.card.good{border-color:#9ae6b4}.card .k{color:var(--muted);font-size:12px}
.card .v{font-size:22px;font-weight:600}.card .s{font-size:12px;color:var(--muted)}
.card .ci{font-size:12.5px;font-variant-numeric:tabular-nums}.card .sub{font-size:13px;margin-top:4px}
.card .small{font-size:11.5px;color:var(--muted);margin-top:2px}
.warnbox{color:#744210;background:#fffaf0;border:1px solid #fbd38d;border-radius:4px;padding:4px 10px;margin:0 0 10px;
max-width:900px}.warnbox p{margin:4px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(560px,100%),1fr));gap:8px 24px}.grid>div{min-width:0}
svg.chart{display:block;width:100%;height:auto;max-width:min(960px,100%);font-size:10.5px}
.wide{overflow-x:auto;max-width:100%}table.t{display:block;overflow-x:auto;max-width:100%}
.headline,.note,header .sub,.warnbox,li,code{overflow-wrap:anywhere}.cn{display:none}
@media (max-width:600px){main,header,nav{padding-left:10px;padding-right:10px}.cw{display:none}.cn{display:block}
svg.chart .bandlabel{font-size:10px}.card{min-width:0;flex:1 1 100%}}svg .grid{stroke:#edf2f7}svg .frame{fill:none;stroke:#cbd5e0}
svg .tick{fill:#4a5568}svg .axis{fill:#2d3748;font-size:11px}svg .rowlabel{fill:#2d3748;font-size:12px}
svg .seglabel{fill:#fff;font-size:10px;pointer-events:none}svg .bandlabel{fill:#718096;font-size:9px}
svg .lg{cursor:pointer}svg .lg.off{opacity:.35}svg .s.off{display:none}ul.recs{padding-left:18px}ul.recs li{margin:6px 0}
ul.ev{margin:0;padding-left:16px}code{font-size:12px;background:#edf2f7;padding:0 3px;border-radius:3px}
details summary{cursor:pointer;color:#2b6cb0;margin:6px 0}footer{color:var(--muted);padding:10px 28px;font-size:12px}
"""

# Click a legend entry to hide/show that series in its chart. Sets data-ready so a test can
# check the script ran to the end without an error.
JS = """
(function(){
  document.querySelectorAll('svg.chart').forEach(function(svg){
    svg.querySelectorAll('.lg').forEach(function(lg){
      lg.addEventListener('click', function(){
        var key = lg.getAttribute('data-key'), off = !lg.classList.contains('off');
        lg.classList.toggle('off', off);
        svg.querySelectorAll('.s').forEach(function(s){
          if (s.getAttribute('data-key') === key) { s.classList.toggle('off', off); }
        });
      });
    });
  });
  document.body.setAttribute('data-ready', String(document.querySelectorAll('section').length));
})();
"""


def build_sections(rs: ResultSet, files: list[str]) -> list[Section]:
    return [
        verdict_section(rs),
        waterfall_section(rs),
        recommendations_section(rs),
        cdf_section(rs),
        server_metrics_section(rs),
        throughput_section(rs),
        cost_section(rs),
        from_log_section(rs),
        sweep_section(rs),
        tokens_section(rs),
        stream_section(rs),
        k6_section(rs),
        intermediaries_section(rs),
        network_section(rs),
        engine_section(rs),
        percentile_section(rs),
        environment_section(rs, files),
    ]


def render(rs: ResultSet, *, title: str = "zgtool report") -> str:
    from zgtool.report import svg
    from zgtool.report.model import path_order

    files = [p for p, _ in rs.results]
    svg.assign_path_colors(*path_order(rs))
    sections = build_sections(rs, files)
    shown = [s for s in sections if not s.missing]
    absent = [s for s in sections if s.missing]   # one line each at the end, not an empty section each
    nav = "".join(f'<a href="#{s.id}">{escape(s.title.split(":")[0])}</a>' for s in shown)
    body = [f'<section id="{s.id}"><h2>{escape(s.title)}</h2>{s.body}</section>' for s in shown]
    if absent:
        nav += '<a href="#absent" class=off>Not in this report</a>'
        items = "".join(f'<li id="absent-{s.id}"><b>{escape(s.title.split(":")[0])}</b>: {escape(s.missing or "")}</li>'
                        for s in absent)
        body.append(f'<section id="absent"><h2>Not in this report</h2><ul class="missing">{items}</ul></section>')
    created = sorted(str(r.get("created")) for _, r in rs.results)
    span = f"{created[0]} – {created[-1]}" if created else ""
    generated = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    kinds = ", ".join(rs.kinds)
    ignored = (f" · {len(rs.ignored)} non-result JSON file(s) ignored" if rs.ignored else "")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{escape(title)}</h1><div class=\"sub\">{len(rs.results)} result file(s): {escape(kinds)} · "
        f"measured {escape(span)} · generated {escape(generated)}{escape(ignored)}</div></header>"
        f"<nav>{nav}</nav><main>{''.join(body)}</main>"
        "<footer>zgtool report — self-contained: no external resources; regenerate with "
        "<code>zgtool report html DIR -o FILE</code>.</footer>"
        f"<script>{JS}</script></body></html>\n"
    )


def render_files(paths: list[Path], *, title: str = "zgtool report") -> str:
    return render(collect(paths), title=title)
