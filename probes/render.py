"""Rich rendering of probe results (measurement lives in the probe modules; this only draws)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.table import Table


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}{unit}"
    return f"{v}{unit}"


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    # the names wrap between words within 26 columns, so a value (a URL, a verdict) keeps the rest of the width
    # and folds only when it is longer than that
    t.add_column("field", style="bold", max_width=26)
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v if isinstance(v, str) else _fmt(v))
    return t


def _notes(console: Console, notes: list[str]) -> None:
    for n in notes:
        console.print(f"[dim]- {n}[/dim]")


def render_stream_summary(s: Any) -> list[tuple[str, Any]]:
    return [
        ("client -> server", f"{s.client} -> {s.server}"),
        ("SYN -> SYN/ACK", _fmt(s.syn_synack_ms, " ms") + (
            f" (SYN sent {s.syn_count}x; first SYN -> SYN/ACK {_fmt(s.first_syn_synack_ms, ' ms')})"
            if getattr(s, "syn_count", 0) > 1 else "")),
        ("SYN/ACK -> ACK", _fmt(s.synack_ack_ms, " ms")),
        ("handshake", _fmt(s.handshake_ms, " ms")), ("first request -> first response byte", _fmt(s.ttfb_ms, " ms")),
        ("server TTL / initial guess / hops", f"{_fmt(s.server_ttl)} / {_fmt(s.server_initial_ttl)} / {_fmt(s.server_hops)}"),
        ("server window / MSS / wscale", f"{_fmt(s.server_window)} / {_fmt(s.server_mss)} / {_fmt(s.server_wscale)}"),
        ("server option order", _fmt(s.server_options)), ("server signature (p0f raw_sig)", _fmt(s.server_signature)),
        ("client signature (p0f raw_sig)", _fmt(s.client_signature)),
        ("packets (client / server)", f"{s.packets} ({s.packets_client} / {s.packets_server})"),
        ("retransmissions (client / server)", f"{s.retransmissions_client} / {s.retransmissions_server}"),
        ("out-of-order (client / server)", f"{getattr(s, 'out_of_order_client', 0)} / {getattr(s, 'out_of_order_server', 0)}"),
        ("first request", _fmt(s.first_request_line)),
        ("response", f"HTTP {s.http_status}, Server: {s.server_header or '-'}" if s.http_status else
         (f"TLS {s.tls_server_hello.version} {s.tls_server_hello.cipher}, JA4S {s.ja4s}" if s.tls_server_hello else "-")),
        ("closed by", _fmt(s.closed_by)),
    ]


def render_tcp(r: Any, console: Console) -> None:
    rows = [("target", f"{r.url} ({r.ip}:{r.port})"), ("capture", "yes, on " + str(r.iface) if r.captured else "no"),
            ("connect()", _fmt(r.connect_ms, " ms")), ("TCP_INFO rtt / rttvar",
                                                      f"{_fmt(r.tcp_info_rtt_ms, ' ms')} / {_fmt(r.tcp_info_rttvar_ms, ' ms')}"),
            ("request -> first byte", _fmt(r.ttfb_ms, " ms")),
            ("HTTP status / Server", f"{_fmt(r.http_status)} / {r.server_header or '-'}")]
    if r.stream is not None:
        rows += render_stream_summary(r.stream)
    if r.pcap:
        rows.append(("pcap", r.pcap))
    console.print(_kv("probe tcp", rows))
    _notes(console, r.notes)


def render_pcap(a: Any, console: Console) -> None:
    console.print(f"[bold]probe tcp --read {a.source}[/bold]: {a.packets_total} packets, {a.tcp_packets} TCP, "
                  f"{len(a.streams)} stream(s)")
    for s in a.streams:
        console.print(_kv(f"stream {s.index}", render_stream_summary(s)))
    _notes(console, a.notes)


def render_tls(r: Any, console: Console) -> None:
    c = r.certificate
    rows = [("target", f"{r.url} (SNI {r.sni or '-'})"), ("connect / handshake",
                                                          f"{_fmt(r.connect_ms, ' ms')} / {_fmt(r.handshake_ms, ' ms')}"),
            ("protocol / cipher", f"{r.version} / {r.cipher} ({r.cipher_bits} bits)"),
            ("ALPN offered -> chosen", f"{', '.join(r.alpn_offered)} -> {r.alpn or 'none'}"),
            ("JA4S", _fmt(r.ja4s)), ("chain length", _fmt(r.chain_length)),
            ("verifies with system CAs", "yes" if r.verified else f"no ({r.verify_error})")]
    if c is not None:
        rows += [("subject CN", _fmt(c.subject_cn)), ("SANs", ", ".join(c.sans_dns + c.sans_ip) or "-"),
                 ("issuer", c.issuer), ("expires", f"{c.not_after} ({c.days_left:.0f} days)"),
                 ("key", f"{c.key_type} {c.key_bits or ''}".strip())]
    console.print(_kv("probe tls", rows))
    _notes(console, r.notes)


def _detections(a: Any, console: Console) -> None:
    """Who answered, who is in between, and the verdict with its behavioural evidence."""
    dt = Table(title="who answered, who is in between", title_justify="left")
    for col in ("role", "system", "confidence", "evidence"):
        dt.add_column(col, overflow="fold")
    for d in a.origin:
        dt.add_row("origin", d.name, f"{d.level} ({d.confidence:.2f})", "; ".join(e.what for e in d.evidence))
    for d in a.intermediaries:
        dt.add_row(d.kind, d.name, f"{d.level} ({d.confidence:.2f})", "; ".join(e.what for e in d.evidence))
    console.print(dt)
    summary = getattr(a, "verdict_summary", None) or (
        "intermediary detected" if a.intermediaries else "no intermediary detected")
    console.print(f"[bold]{summary}[/bold] (estimated hops: {a.hop_estimate})")
    for e in getattr(a, "hop_evidence", []):
        console.print(f"  - {e}")


def render_headers_read(r: Any, console: Console) -> None:
    console.print(f"[bold]probe headers --read {r.source}[/bold] ({r.format}): {len(r.responses)} response(s)")
    for resp in r.responses:
        console.print(f"\n[bold]{resp.label}[/bold] -> HTTP {resp.status if resp.status is not None else '?'}"
                      f"{' ' + resp.http_version if resp.http_version else ''}, {len(resp.headers)} header(s)")
        _detections(resp.analysis, console)
    _notes(console, r.notes + [r.responses[0].analysis.caveat] if r.responses else r.notes)


def _requested(url: str, path: str) -> str:
    """The URL a probe asked: the target's origin and the request's path (which already holds the target's
    own path, /v1 not doubled)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{path}"


def render_headers(r: Any, console: Console) -> None:
    a = r.analysis
    console.print(f"[bold]probe headers[/bold] {r.method} {_requested(r.url, r.path)} -> HTTP {r.status} "
                  f"(first byte {_fmt(r.ttfb_ms, ' ms')})")
    ht = Table(title="response headers", title_justify="left")
    ht.add_column("name")
    ht.add_column("value", overflow="fold")
    for k, v in r.headers:
        ht.add_row(k, v)
    console.print(ht)
    _detections(a, console)
    if a.via:
        console.print("Via: " + " -> ".join(f"{h.protocol} {h.received_by}".strip() for h in a.via))
    if a.server_timing:
        console.print("Server-Timing: " + ", ".join(
            f"{m.name}={_fmt(m.dur_ms, 'ms')}" for m in a.server_timing))
    for label, val in (("request ids", a.request_ids), ("rate limits", a.rate_limits), ("load hint", a.load_hint)):
        if val:
            text = ", ".join(f"{k}={v}" for k, v in val.items()) if isinstance(val, dict) else str(val)
            console.print(f"{label}: {text}", highlight=False)     # not a Python repr
    _notes(console, r.notes + [a.caveat])


def render_stream(r: Any, console: Console) -> None:
    b = r.buffering
    color = {"buffering": "red", "streaming": "green"}.get(b.verdict, "yellow")
    rows = [("target", f"{_requested(r.url, r.path)} -> HTTP {r.status} {r.content_type}"),
            ("headers / first body / first content / last content",
             " / ".join(_fmt(x, " ms") for x in (r.headers_ms, r.first_body_ms, r.first_content_ms, r.last_content_ms))),
            ("reads / events / content events / content bytes",
             f"{r.num_reads} / {r.num_events} / {r.num_content_events} / {r.content_bytes}"),
            ("emission span (server)", _fmt(r.emission.span_ms, " ms") if r.emission else "not sent"),
            ("arrival span", _fmt(b.arrival_span_ms, " ms")), ("final burst share", _fmt(b.burst_fraction)),
            ("silence before burst", _fmt(b.silence_before_burst_ms, " ms")),
            ("verdict", f"[{color}]{b.verdict}[/{color}]: {b.reason}")]
    console.print(_kv("probe stream", rows))
    _notes(console, r.notes)


def render_all(r: Any, console: Console) -> None:
    for name, fn in (("tcp", render_tcp), ("tls", render_tls), ("headers", render_headers), ("stream", render_stream)):
        part = getattr(r, name)
        if part is not None:
            fn(part, console)
        elif name in r.errors:
            console.print(f"[red]probe {name} failed: {r.errors[name]}[/red]")
        elif name in r.skipped:
            console.print(f"[dim]probe {name} skipped: {r.skipped[name]}[/dim]")
    console.print(_kv("summary", [(k, ", ".join(v) if isinstance(v, list) else _fmt(v)) for k, v in r.summary.items()]))
