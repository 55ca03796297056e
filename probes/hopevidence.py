"""Evidence of a hop when the headers are silent: who answers a malformed request, re-cased headers,
an origin seen only through a gateway's prefixed copies, time outside the origin's own work.

The error probe sends one request with a header line that has no colon (RFC 9112 §5 makes it
invalid). Every proxy measured here answers such a request itself, before any upstream sees it,
each with its own shape (HAProxy's "Your browser sent an invalid request.", nginx's
<center>nginx</center> page, Squid's X-Squid-Error, Go's plain "400 Bad Request" from Caddy,
Varnish's bare 400 without headers, uvicorn's "Invalid HTTP request received." from LiteLLM),
while the zgtool engine answers with its JSON error and its own ids. So when the origin is
known and the malformed request is answered in a different shape, something in between
answered it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zgtool.errors import TargetUnreachable
from zgtool.probes.servertiming import Metric
from zgtool.probes.signatures import Detection, Evidence, level_for, load_database
from zgtool.probes.via import ViaHop

if TYPE_CHECKING:
    from zgtool.targets import Target

CAVEAT = ("No evidence is not proof of no gateway: a reverse proxy MAY leave Via off its responses "
          "(RFC 9110 §7.6.3) and can strip or rewrite every header; TCP fingerprints cannot separate "
          "a proxy from the origin on one host.")
UPSTREAM_PREFIXES = ("llm_provider-",)   # LiteLLM passes the provider's headers on under this prefix
ERROR_PROBE_LINE = "This header line has no colon"
OUTSIDE_ORIGIN_MS = 10.0


@dataclass
class ErrorProbe:
    request: str                       # what was sent, e.g. "GET /v1/messages with a header line without a colon"
    status: int | None
    headers: list[tuple[str, str]]
    body_excerpt: str
    note: str | None = None            # "closed the connection without an answer", ...


@dataclass
class HopEvidence:
    verdict: str                       # identified | likely | none
    summary: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class HeaderAnalysis:
    origin: list[Detection]
    intermediaries: list[Detection]
    hop_estimate: int
    via: list[ViaHop]
    server_timing: list[Metric]
    request_ids: dict[str, str]
    request_id_prefixes: dict[str, str]
    load_hint: dict[str, Any] | None
    load_hint_error: str | None
    rate_limits: dict[str, str]
    origin_via_gateway: bool = False
    verdict: str = "none"
    verdict_summary: str = "no intermediary evident (not proof there is none: see the caveat)"
    hop_evidence: list[str] = field(default_factory=list)
    error_probe: ErrorProbe | None = None
    outside_origin_ms: float | None = None
    caveat: str = CAVEAT


def upstream_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The origin's own headers that a gateway passed on under a prefix (LiteLLM: llm_provider-)."""
    out = []
    for k, v in headers:
        for p in UPSTREAM_PREFIXES:
            if k.lower().startswith(p):
                out.append((k[len(p):], v))
    return out


def error_probe(target: Target, path: str, *, timeout_s: float, insecure: bool) -> ErrorProbe:
    """One request the HTTP layer must reject; whoever parses it first answers."""
    from zgtool.probes.http1 import content_decoder
    from zgtool.probes.request import USER_AGENT, connection_for

    conn = connection_for(target, timeout_s=min(timeout_s, 5.0), insecure=insecure)
    desc = f"GET {path} with a header line without a colon"
    host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    raw = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n{ERROR_PROBE_LINE}\r\n"
           "Connection: close\r\n\r\n").encode("latin-1")
    try:
        with conn:
            conn.connect()
            assert conn.sock is not None
            conn.sock.sendall(raw)
            head = conn.read_head()
            body = bytearray()
            decode = content_decoder(head)
            for piece in conn.iter_body(head, method="GET"):
                body += decode(piece.data)
                if len(body) > 16384:
                    break
    except TargetUnreachable as exc:
        return ErrorProbe(desc, None, [], "", note=exc.message)
    return ErrorProbe(desc, head.status, head.headers, bytes(body[:2000]).decode("utf-8", "replace"))


def _lowercase_origin(ids: set[str]) -> str | None:
    for sig in load_database()["signatures"]:
        if sig["id"] in ids and sig.get("lowercase_headers"):
            return str(sig["name"])
    return None


def assess(a: HeaderAnalysis, headers: list[tuple[str, str]], err: ErrorProbe | None,
           outside_origin_ms: float | None, err_analysis: HeaderAnalysis | None = None) -> HopEvidence:
    """Add behavioural evidence to `a` (in place: intermediaries, hop_estimate) and give the verdict.
    `err_analysis`: zgtool.probes.headers.analyse_headers of the error probe's answer (when it had one)."""
    ev: list[str] = []
    strong = False
    origin_ids = {d.id for d in a.origin}
    if origin_ids and a.origin_via_gateway:
        ev.append(f"the origin ({', '.join(d.name for d in a.origin)}) is visible only through headers a gateway "
                  "passed on under a prefix (llm_provider-*)")
    lower_origin = _lowercase_origin(origin_ids)
    recased = sorted({k for k, _ in headers if k != k.lower() and not k.lower().startswith(UPSTREAM_PREFIXES)})
    if lower_origin and recased:
        ev.append(f"header names arrive re-cased or added ({', '.join(recased[:5])}) although {lower_origin} "
                  "writes every header name in lower case: a hop re-serialised the response")
        strong = True
    if err is not None:
        err_a = err_analysis if err.status is not None else None
        err_ids = {d.id for d in (err_a.origin + err_a.intermediaries)} if err_a else set()
        shape = _shape(err)
        if err_a is not None:
            known_ids = {x.id for x in a.intermediaries}
            for d in err_a.intermediaries:
                if d.id == "unidentified" or _unless(d.id) & known_ids:
                    continue
                d.evidence = [Evidence("answered the malformed request itself: " + ", ".join(e.what for e in d.evidence),
                                       max(e.weight for e in d.evidence))] if d.evidence else []
                known = next((x for x in a.intermediaries if x.id == d.id), None)
                if known is None:
                    a.intermediaries.append(d)
                else:
                    known.evidence += d.evidence
                    known.confidence = round(1 - (1 - known.confidence) * (1 - d.confidence), 3)
                    known.level = level_for(known.confidence)
        if origin_ids and not (origin_ids & err_ids):
            answered = (err_a.intermediaries + err_a.origin) if err_a else []
            who = ", ".join(d.name for d in answered if d.id != "unidentified") or "an unidentified server"
            ev.append(f"a malformed request was answered by {who} ({shape}), not by "
                      f"{', '.join(d.name for d in a.origin)}, which answered the API request: "
                      "a hop in between parses requests itself")
            strong = True
        elif origin_ids and origin_ids & err_ids:
            ev.append(f"a malformed request was answered by the origin itself ({shape})")
    if outside_origin_ms is not None and outside_origin_ms > OUTSIDE_ORIGIN_MS:
        ev.append(f"{outside_origin_ms:.1f} ms of the time to first byte lies outside the origin's own "
                  "Server-Timing total and one connect round trip (a weak sign: a hop or a slow network)")
    identified = [d for d in a.intermediaries if d.confidence >= 0.5 and d.id != "unidentified"]
    if not identified and strong:
        a.intermediaries.append(Detection("unidentified", "unidentified intermediary", "proxy", 0.6, "medium",
                                          [Evidence(e, 0.6) for e in ev]))
    a.intermediaries.sort(key=lambda d: (-d.confidence, d.id))
    a.hop_estimate = max(a.hop_estimate, len([d for d in a.intermediaries if d.confidence >= 0.5]))
    if identified:
        names = ", ".join(d.name for d in identified)
        return HopEvidence("identified", f"intermediary identified: {names}", ev)
    if strong:
        return HopEvidence("likely", "an intermediary is likely, unidentified", ev)
    return HopEvidence("none", "no intermediary evident (not proof there is none: see the caveat)", ev)


def _unless(sig_id: str) -> set[str]:
    return next((set(s.get("unless", ())) for s in load_database()["signatures"] if s["id"] == sig_id), set())


def _shape(err: ErrorProbe) -> str:
    if err.status is None:
        return err.note or "no answer"
    ctype = next((v for k, v in err.headers if k.lower() == "content-type"), None)
    body = " ".join(err.body_excerpt.split())[:60]
    parts = [f"HTTP {err.status}", f"{len(err.headers)} header(s)" if err.headers else "no headers at all"]
    if ctype:
        parts.append(ctype)
    if body:
        parts.append(repr(body))
    return ", ".join(parts)


def outside_origin(ttfb_ms: float | None, connect_ms: float | None, timing: list[Any]) -> float | None:
    total = next((m.dur_ms for m in timing if m.name == "total" and m.dur_ms is not None), None)
    if ttfb_ms is None or total is None:
        return None
    return round(ttfb_ms - total - (connect_ms or 0.0), 3)
