"""`probe --target` in a screen: who answered, how many hops and why we think so, what the network and TLS
cost, whether the stream arrives as it is emitted; in words, about 30 lines. `--verbose` prints every probe's
full tables (zgtool.probes.render.render_all), `--json` the whole result."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

EVIDENCE_LINES = 3


def _ms(v: Any) -> str:
    return "–" if not isinstance(v, int | float) else f"{v:.2f} ms"


def _who(d: dict[str, Any]) -> list[tuple[str, str]]:
    s = d.get("summary") or {}
    rows = [("verdict", str(s.get("verdict_summary") or s.get("verdict") or "no verdict")),
            ("origin", ", ".join(s.get("origin") or []) or "not identified"),
            ("in between", ", ".join(s.get("intermediaries") or []) or "nothing identified")]
    for e in s.get("published_engines") or []:
        rows.append(("behind it", f"{e.get('base')} serves {e.get('model')!r} (published: {e.get('via')}); "
                                  f"`{e.get('tax_command')}` measures the gateway's tax, paired"))
    hops = s.get("hop_estimate")
    by_ttl = s.get("server_hops_by_ttl")
    hop_text = "unknown" if hops is None else f"{hops} (from the evidence below)"
    if by_ttl is not None:
        hop_text += f"; network hops by TTL: {by_ttl}"
    rows.append(("hops", hop_text))
    evidence = list(s.get("evidence") or [])
    rows += [("evidence", e) for e in evidence[:EVIDENCE_LINES]]
    if len(evidence) > EVIDENCE_LINES:
        rows.append(("", f"... and {len(evidence) - EVIDENCE_LINES} more (--verbose)"))
    return rows


def _network(d: dict[str, Any]) -> list[tuple[str, str]]:
    tcp, headers, s = d.get("tcp") or {}, d.get("headers") or {}, d.get("summary") or {}
    connect = f"{_ms(tcp.get('connect_ms') or s.get('connect_ms'))}"
    if s.get("syn_synack_ms") is not None:
        connect += f" (SYN to SYN-ACK {_ms(s['syn_synack_ms'])}, from a packet capture)"
    elif tcp and not tcp.get("captured"):
        connect += f" (no packet capture: {tcp.get('capture_note') or 'not permitted'})"
    rows = [("connect", connect)]
    tls = d.get("tls")
    skipped = d.get("skipped") or {}
    if isinstance(tls, dict):
        rows.append(("TLS", f"{tls.get('version') or tls.get('tls_version') or 'handshake'} in "
                            f"{_ms(tls.get('handshake_ms'))}"))
    elif "tls" in skipped:
        rows.append(("TLS", f"not probed: {skipped['tls']}"))
    if headers:
        rows.append(("first byte", f"{_ms(headers.get('ttfb_ms'))} (HTTP {headers.get('status')}, "
                                   f"HTTP/{headers.get('http_version')})"))
    return rows


def _stream(d: dict[str, Any]) -> list[tuple[str, str]]:
    st = d.get("stream") or {}
    if not st:
        return [("stream", "not probed")]
    buf = st.get("buffering") or {}
    verdict = str(buf.get("verdict") or "unknown")
    rows = [("fidelity", f"{verdict}: {buf.get('reason') or ''}".rstrip(": "))]
    rows.append(("timing", f"first content {_ms(st.get('first_content_ms'))}, last {_ms(st.get('last_content_ms'))}"
                           f"; {st.get('num_content_events')} content events in {st.get('num_reads')} reads"))
    return rows


def render_summary(data: Any, console: Console) -> None:
    from zgtool.results import to_jsonable

    d: dict[str, Any] = data if isinstance(data, dict) else to_jsonable(data)
    sections = (("Who answered", _who(d)), ("Network", _network(d)), ("Streaming", _stream(d)))
    console.print(Text(f"probe --target {d.get('target_url')}", style="bold"))
    width = max(len(k) for _, rows in sections for k, _ in rows)
    for title, rows in sections:
        console.print(Text(title, style="bold"))
        for key, value in rows:
            line = Text(f"  {key:<{width}}  ")
            line.append(value)
            console.print(line, highlight=False)
    problems = [f"{k}: {v}" for k, v in (d.get("errors") or {}).items()]
    if problems:
        console.print(Text("Errors", style="bold red"))
        for p in problems:
            console.print(f"  {p}", highlight=False)
    console.print(Text("every probe's full tables: --verbose; the whole result: --json or -o FILE", style="dim"))
