"""Report sections from probes, k6, the engine and the environment: stream arrival timeline, k6
phases and throughput, intermediaries, TCP/TLS, GPU/engine timeline, versions, recommendations."""

from __future__ import annotations

from html import escape
from typing import Any

from zgtool.report import svg
from zgtool.report.load import ResultSet
from zgtool.report.model import human, human_value, probes_by_path
from zgtool.report.recommend import recommendations
from zgtool.report.sections_latency import Section, _grid, missing_reason

K6_PHASES = ("http_req_blocked", "http_req_connecting", "http_req_sending", "http_req_waiting",
             "http_req_receiving")
ENGINE_SERIES = ("running", "waiting", "batch_size", "kv_util_pct")
ENV_COLUMNS = {"host": "host", "platform": "platform", "python": "python", "zgtool": "zgtool", "torch": "torch",
               "model": "engine model", "dtype": "dtype", "device": "device", "cpus": "CPUs"}
GPU_SERIES = ("gpu_util_pct", "mem_copy_util_pct", "fb_used_pct", "power_w", "sm_clock_mhz")


def _kv_table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{escape(human(k))}</th><td>{escape(_val(v))}</td></tr>" for k, v in rows if v is not None)
    return f'<table class="kv">{body}</table>'


def _val(v: Any) -> str:
    return human_value(v)


_RECOMMENDATION_KINDS = ("latency_split", "bench", "probe", "verify", "gate")


def recommendations_section(rs: ResultSet) -> Section:
    sec = Section("recommendations", "Recommendations")
    recs = recommendations(rs)
    if not recs and not any(k.startswith(_RECOMMENDATION_KINDS) for k in rs.kinds):
        # "nothing to act on" would read as a verdict on results no check reads (a sweep, a probe alone)
        sec.missing = ("no latency_split, bench.k6, probe or verify result among the inputs, which the "
                       "recommendation checks read")
        return sec
    if not recs:
        from zgtool.report.recommend import checks

        sec.body = ('<p class="note">Nothing to act on in these results. Checked: '
                    + escape("; ".join(checks())) + ".</p>")
        return sec
    items = "".join(
        f'<li class="rec {r.severity}"><span class="badge {"bad" if r.severity == "act" else "warn" if r.severity == "check" else "muted"}">'
        f'{escape(r.severity)}</span> <b>{escape(r.title)}</b><br>{escape(r.detail)}</li>' for r in recs)
    sec.body = f'<ul class="recs">{items}</ul>'
    return sec


def stream_section(rs: ResultSet) -> Section:
    sec = Section("stream", "Stream arrival timeline")
    probes = {p: v["stream"] for p, v in probes_by_path(rs).items() if v.get("stream")}
    if not probes:
        sec.missing = missing_reason(rs, "probe.stream / probe.all", "probe")
        return sec
    series, rows = [], []
    for path, s in probes.items():
        color = svg.path_color_of(path)
        content = [e for e in s.get("events") or [] if e.get("content_bytes")]
        total = sum(e["content_bytes"] for e in content) or 1
        xs, ys, acc = [0.0], [0.0], 0
        for e in content:
            acc += e["content_bytes"]
            xs.append(e["t_ms"])
            ys.append(acc / total * 100)
        if xs[-1] < (s.get("total_ms") or 0):
            xs.append(s["total_ms"])
            ys.append(ys[-1])
        b = s.get("buffering") or {}
        series.append(svg.Series(f"{path}: arrival ({b.get('verdict', '?')})", xs, ys, color, "step", key=path))
        series.append(svg.Series(f"{path} events", [e["t_ms"] for e in content], [0.0] * len(content), color,
                                 "points", key=path, titles=[f"{path} {e['event']} at {e['t_ms']:.1f} ms, "
                                                              f"{e['content_bytes']} B" for e in content]))
        em = s.get("emission") or {}
        if em.get("times_ms") and s.get("last_content_ms") is not None:
            # emission times are relative to the first token, on the server's clock. Every hop flushes
            # at the end of a response, so the last token's arrival is the one sure anchor; a buffering
            # hop then shows as emission spread out long before the one arrival burst.
            t0 = s["last_content_ms"] - max(em["times_ms"])
            n = len(em["times_ms"])
            series.append(svg.Series(f"{path}: server emission", [t0 + t for t in em["times_ms"]],
                                     [(k + 1) / n * 100 for k in range(n)], color, "step", dash=True,
                                     key=f"{path} emission"))
        rows.append((path, b, s))
    chart = svg.line_chart(series, x_label="time since the request was sent, ms",
                           y_label="% of content received", y_min=0, y_max=100, y_fmt="%", width=940, height=320)
    table = "".join(
        f"<tr><td>{escape(p)}</td><td><span class=\"badge {'bad' if b.get('verdict') == 'buffering' else 'good' if b.get('verdict') == 'streaming' else 'muted'}\">"
        f"{escape(str(b.get('verdict')))}</span></td><td class=num>{svg.fmt(s.get('headers_ms') or 0)}</td>"
        f"<td class=num>{svg.fmt(s.get('first_content_ms') or 0)}</td><td class=num>{svg.fmt(s.get('last_content_ms') or 0)}</td>"
        f"<td class=num>{s.get('num_content_events')}</td><td class=num>{s.get('num_reads')}</td>"
        f"<td>{escape(b.get('reason') or '')}</td></tr>" for p, b, s in rows)
    sec.body = ('<p class="note">Cumulative share of the answer\'s text as it arrived (solid) against when the '
                'server emitted each token (dashed, aligned so the last emitted token meets the last arrival). A buffering hop shows as a '
                'flat line followed by one vertical jump.</p>' + chart
                + '<table class="t"><thead><tr><th>path</th><th>verdict</th><th>headers ms</th><th>first content ms'
                  '</th><th>last content ms</th><th>content events</th><th>reads</th><th>why</th></tr></thead>'
                  f'<tbody>{table}</tbody></table>')
    return sec


def k6_section(rs: ResultSet) -> Section:
    sec = Section("k6", "k6 load: phases and throughput")
    found = rs.of("bench.k6")
    if not found:
        sec.missing = missing_reason(rs, "bench.k6", "k6")
        return sec
    parts = []
    for r in found:
        d = r.get("data") or {}
        sc = d.get("scenarios") or {}
        names = list(sc)
        groups = [(human(n), [(sc[n].get(ph) or {}).get("p50") for ph in K6_PHASES], svg.path_color_of(n))
                  for n in names]
        cats = [ph.replace("http_req_", "") for ph in K6_PHASES]
        pct = [(human(n), [(sc[n].get("http_req_duration") or {}).get(k) for k in ("p50", "p90", "p95", "p99")],
                svg.path_color_of(n)) for n in names]
        tput = [(human(n), [sc[n].get("rate_rps"), sc[n].get("achieved_rps")], svg.path_color_of(n))
                for n in names]
        parts.append(_grid([
            "<h3>request phases, p50</h3>" + svg.grouped_bars(cats, groups, unit="ms"),
            "<h3>request duration percentiles</h3>" + svg.grouped_bars(["p50", "p90", "p95", "p99"], pct, unit="ms"),
            "<h3>throughput: asked vs achieved</h3>" + svg.grouped_bars(["asked", "achieved"], tput, unit="req/s"),
        ]))
        rows = "".join(f"<tr><td>{escape(n)}</td><td class=num>{s.get('requests')}</td><td class=num>{s.get('failures')}</td>"
                       f"<td class=num>{svg.fmt(s.get('achieved_rps') or 0)}</td><td class=num>{s.get('dropped_iterations')}</td>"
                       + "".join(f"<td class=num>{svg.fmt((s.get('http_req_duration') or {}).get(k) or 0)}</td>"
                                 for k in ("p50", "p95", "p99", "max"))
                       + f"<td class=num>{escape(_vs_direct((d.get('differences') or {}).get(n)))}</td></tr>"
                       for n, s in sc.items())
        parts.append('<table class="t"><thead><tr><th>scenario</th><th>requests</th><th>failed</th><th>req/s</th>'
                     '<th>dropped</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th>'
                     '<th>p50 vs direct, ms [95% interval over requests]</th></tr></thead>'
                     f'<tbody>{rows}</tbody></table>')
        cfg = d.get("config") or {}
        parts.append(f'<p class="note">k6 {escape(str(d.get("k6_version")))}, {escape(str(d.get("script")))}: '
                     f'{cfg.get("rate_rps")} req/s for {cfg.get("duration_s")} s per scenario (open model). '
                     + " ".join(escape(n) for n in d.get("notes") or []) + "</p>")
    sec.body = "".join(parts)
    return sec


def _vs_direct(d: dict[str, Any] | None) -> str:
    """'+1.20 [+0.40, +1.90]' ('n.s.' when the interval holds 0); '-' for direct and older results."""
    if not d or d.get("p50_ms") is None:
        return "-"
    lo, hi = d.get("lo_ms"), d.get("hi_ms")
    if lo is None or hi is None:
        return f"{d['p50_ms']:+.2f} (no interval)"
    return f"{d['p50_ms']:+.2f} [{lo:+.2f}, {hi:+.2f}]" + (" n.s." if lo <= 0 <= hi else "")


def intermediaries_section(rs: ResultSet) -> Section:
    sec = Section("intermediaries", "Detected intermediaries (with evidence)")
    probes = {p: v["headers"] for p, v in probes_by_path(rs).items() if v.get("headers")}
    if not probes:
        sec.missing = missing_reason(rs, "probe.headers / probe.all", "probe")
        return sec
    parts = []
    for path, h in probes.items():
        a = h.get("analysis") or {}
        dets = [("origin", d) for d in a.get("origin") or []] + [("intermediary", d) for d in a.get("intermediaries") or []]
        rows = "".join(
            f"<tr><td>{escape(role)}</td><td><b>{escape(d.get('name', ''))}</b><br><span class=muted>{escape(d.get('kind', ''))}"
            f"</span></td><td class=num>{d.get('confidence', 0):.2f} ({escape(d.get('level', ''))})</td><td><ul class=ev>"
            + "".join(f"<li><code>{escape(e.get('what', ''))}</code> <span class=muted>w={e.get('weight')}</span></li>"
                      for e in d.get("evidence") or []) + "</ul></td></tr>" for role, d in dets)
        st = ", ".join(f"{m['name']}={svg.fmt(m['dur_ms'])}" + (f" ({m['desc']})" if m.get("desc") else "")
                       for m in a.get("server_timing") or [] if m.get("dur_ms") is not None)
        parts.append(f"<h3>{escape(path)} — {escape(str(h.get('url')))}: hop estimate {a.get('hop_estimate')}</h3>"
                     '<table class="t"><thead><tr><th>role</th><th>who</th><th>confidence</th><th>evidence</th></tr>'
                     f'</thead><tbody>{rows}</tbody></table>'
                     + _kv_table([("status", h.get("status")), ("request ids", ", ".join(f"{k}: {v}" for k, v in (a.get("request_ids") or {}).items())),
                                  ("Server-Timing", st or None), ("load hint", a.get("load_hint")),
                                  ("rate limits", ", ".join(f"{k}: {v}" for k, v in (a.get("rate_limits") or {}).items()) or None)]))
    caveat = next((h.get("analysis", {}).get("caveat") for h in probes.values() if h.get("analysis")), None)
    if caveat:
        parts.append(f'<p class="note">{escape(caveat)}</p>')
    sec.body = "".join(parts)
    return sec


def network_section(rs: ResultSet) -> Section:
    sec = Section("network", "TCP and TLS details")
    bundle = probes_by_path(rs)
    if not any(v.get("tcp") or v.get("tls") or (v.get("skipped") or {}).get("tls") for v in bundle.values()):
        sec.missing = missing_reason(rs, "probe.tcp / probe.tls / probe.all", "probe")
        return sec
    cols = []
    for path, v in bundle.items():
        tcp, tls = v.get("tcp") or {}, v.get("tls")
        st = tcp.get("stream") or {}
        rows = [("connect() ms", tcp.get("connect_ms")), ("SYN→SYN/ACK ms (wire RTT)", st.get("syn_synack_ms")),
                ("kernel RTT ms", tcp.get("tcp_info_rtt_ms")), ("TTFB ms", tcp.get("ttfb_ms")),
                ("captured", tcp.get("captured")), ("capture note", tcp.get("capture_note")),
                ("server TTL / hops", f"{st.get('server_ttl')} / {st.get('server_hops')}" if st else None),
                ("window / MSS / wscale", f"{st.get('server_window')} / {st.get('server_mss')} / {st.get('server_wscale')}" if st else None),
                ("TCP options", st.get("server_options")), ("p0f-style signature", st.get("server_signature")),
                ("retransmissions c/s", f"{st.get('retransmissions_client')} / {st.get('retransmissions_server')}" if st else None),
                ("server header", tcp.get("server_header"))]
        if tls:
            cert = tls.get("certificate") or {}
            rows += [("TLS", f"{tls.get('version')} {tls.get('cipher')}"), ("ALPN", tls.get("alpn")),
                     ("handshake ms", tls.get("handshake_ms")), ("JA4S", tls.get("ja4s")),
                     ("certificate", f"{cert.get('subject_cn')} issued by {cert.get('issuer_cn')}"),
                     ("days left", cert.get("days_left")), ("verified", tls.get("verified")),
                     ("verify error", tls.get("verify_error"))]
        else:
            why = (v.get("skipped") or {}).get("tls") or (v.get("errors") or {}).get("tls") or "no probe.tls result"
            rows.append(("TLS", why))
        for k, msg in (v.get("errors") or {}).items():
            rows.append((f"{k} probe error", msg))
        cols.append(f"<h3>{escape(path)}</h3>" + _kv_table(rows))
    sec.body = _grid(cols)
    return sec


def engine_section(rs: ResultSet) -> Section:
    sec = Section("engine", "GPU and engine timeline")
    watches, snaps, defrags = rs.of("dcgm.watch"), rs.of("engine.metrics"), rs.of("defrag")
    if not (watches or snaps or defrags):
        sec.missing = missing_reason(rs, "dcgm.watch / engine.metrics / defrag", "sampler", "engine-metrics")
        return sec
    parts = []
    for w in watches:
        d = w.get("data") or {}
        bands = [(s["start_s"], s["end_s"], s["name"]) for s in d.get("stages") or [] if s["end_s"] > s["start_s"]]
        for g in d.get("gpus") or []:
            charts = []
            for names in (ENGINE_SERIES, GPU_SERIES):
                present = [n for n in names if any(v is not None for v in (g.get("series") or {}).get(n, []))]
                if not present:
                    continue
                series = [svg.Series(human(n), g["t_s"], g["series"][n], svg.metric_color(i))
                          for i, n in enumerate(present)]
                charts.append(svg.line_chart(series, x_label="seconds since the run started", y_label="value",
                                             width=940, height=280, bands=bands))
            title = f"{g.get('model') or 'GPU'} {g.get('gpu') or ''} @ {g.get('host')}"
            parts.append(f"<h3>{escape(title)} ({escape(str((d.get('source') or {}).get('kind')))}, "
                         f"{d.get('samples')} samples every {d.get('interval_s')} s)</h3>" + "".join(charts))
        for n in d.get("notes") or []:
            parts.append(f'<p class="missing">{escape(n)}</p>')
        if not d.get("gpus"):
            parts.append('<p class="missing">the watch recorded no reading</p>')
    for s in snaps:
        d = s.get("data") or {}
        der = d.get("derived") or {}
        hist = d.get("histograms") or {}
        rows = [(k, v) for k, v in der.items() if v is not None]
        rows += [(f"{human(k)}: mean ms (n={h['count']:.0f})", h["mean_ms"]) for k, h in hist.items()
                 if h.get("mean_ms")]
        kv = d.get("kv") or {}
        rows += [(k if k.startswith("kv") else f"kv_{k}", v) for k, v in kv.items()]
        if d.get("kv_error"):
            rows.append(("kv", d["kv_error"]))
        parts.append(f"<h3>engine metrics snapshot — {escape(str(d.get('url')))}</h3>" + _kv_table(rows))
    for f in defrags:
        d = f.get("data") or {}
        before, after = d.get("before") or {}, d.get("after") or {}
        keys = [k for k in before if not isinstance(before[k], dict | list)]
        trs = "".join(f"<tr><td>{escape(human(k))}</td><td class=num>{escape(_val(before.get(k)))}</td>"
                      f"<td class=num>{escape(_val(after.get(k)))}</td></tr>" for k in keys)
        acts = "".join(f"<li>{escape(_val(a))}</li>" for a in d.get("actions") or [])
        parts.append("<h3>defrag: KV pool before / after</h3><table class=\"t\"><thead><tr><th>figure</th>"
                     f"<th>before</th><th>after</th></tr></thead><tbody>{trs}</tbody></table>"
                     + (f"<ul>{acts}</ul>" if acts else ""))
    sec.body = "".join(parts)
    return sec


def environment_section(rs: ResultSet, files: list[str]) -> Section:
    sec = Section("environment", "Environment and versions")
    envs: dict[str, dict[str, Any]] = {}
    for _, r in rs.results:
        env = {k: v for k, v in (r.get("environment") or {}).items() if k != "loadavg"}  # per result: verdict area
        envs.setdefault(str(sorted(env.items())), env)
    # the engine's model, dtype and device where the result recorded them (engine-side commands)
    cols = [k for k in ENV_COLUMNS if k in ("host", "zgtool") or any(env.get(k) is not None for env in envs.values())]
    rows = []
    for env in envs.values():
        rows.append("<tr>" + "".join(f"<td>{escape(_val(env.get(k)))}</td>" for k in cols) + "</tr>")
    extra = []
    for r in rs.of("bench.k6"):
        extra.append(("k6", (r.get("data") or {}).get("k6_version")))
    for path, v in probes_by_path(rs).items():
        server = (v.get("tcp") or {}).get("server_header")
        if server:
            extra.append((f"server on {path}", server))
    cmds = "".join(f"<tr><td>{escape(str(r.get('kind')))}</td><td><code>{escape(str(r.get('command')))}</code></td>"
                   f"<td>{escape(str(r.get('created')))}</td><td>{escape(p.rsplit('/', 1)[-1])}</td></tr>"
                   for p, r in rs.results)
    head = "".join(f"<th>{escape(ENV_COLUMNS[k])}</th>" for k in cols)
    sec.body = (f'<div class="wide"><table class="t"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
                '</table></div>'
                + _kv_table(extra)
                + '<details><summary>Result files and the commands that produced them</summary><table class="t">'
                  '<thead><tr><th>kind</th><th>command</th><th>created</th><th>file</th></tr></thead>'
                  f'<tbody>{cmds}</tbody></table></details>')
    return sec
