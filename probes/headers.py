"""`probe headers`: one minimal real request, every response header kept and fingerprinted.

Result data (kind "probe.headers"):
    url, method, path, status, http_version, connect_ms, ttfb_ms, total_ms,
    request_headers   [[name, value]]   (keys redacted)
    headers           [[name, value]]   every response header, wire order, duplicates kept
    body_excerpt      first 500 characters of the body
    analysis:
      origin          [Detection]  the answering server(s): {id, name, kind, confidence, level,
                                   evidence: [{what, weight}]}
      intermediaries  [Detection]  proxies, CDNs, load balancers, API and AI gateways
      hop_estimate    int          intermediaries with medium+ confidence, or the Via hop count if larger
      via             [{protocol, received_by, comment}]
      server_timing   [{name, dur_ms, desc}]
      request_ids     {header: value}        request_id_prefixes {header: prefix}
      load_hint       {...} | None           parsed X-GPU-Load-Hint JSON (load_hint_error if unparsable)
      rate_limits     {header: value}        *ratelimit*, retry-after
      origin_via_gateway  bool               the origin was seen only in a gateway's prefixed copies (llm_provider-*)
      verdict         identified | likely | none   (never "direct": no evidence is not proof)
      verdict_summary str                    e.g. "an intermediary is likely, unidentified"
      hop_evidence    [str]                  behavioural evidence (error probe, re-cased headers, timing)
      error_probe     {request, status, headers, body_excerpt, note} | None   who answered a malformed request
      outside_origin_ms  float | None        TTFB - origin's Server-Timing total - connect time
      caveat          str
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from zgtool.latency.wire.engine_id import EngineName, from_body, from_headers
from zgtool.probes.hopevidence import (
    HeaderAnalysis,
    assess,
    error_probe,
    outside_origin,
    upstream_headers,
)
from zgtool.probes.http1 import content_decoder
from zgtool.probes.request import build, connection_for, redacted_headers
from zgtool.probes.servertiming import parse_server_timing
from zgtool.probes.signatures import Detection, Evidence, level_for, match_signatures, sends_server_header
from zgtool.probes.via import parse_via
from zgtool.targets import Target

REQUEST_ID_HEADERS = ("request-id", "x-request-id", "x-upstream-request-id", "x-amzn-requestid", "apim-request-id", "x-ms-request-id",
                      "cf-ray", "x-kong-request-id", "x-litellm-call-id", "x-portkey-trace-id",
                      "x-akamai-request-id", "x-amz-cf-id", "x-fastly-request-id", "x-cloud-trace-context")
_RATE_LIMIT = re.compile(r"(ratelimit|rate-limit|^retry-after$)", re.IGNORECASE)
_ID_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9]*[-_])")
BODY_LIMIT = 256 * 1024
# the inference engine named by its answer (zgtool.latency.wire.engine_id) -> its origin detection's id
ENGINE_IDS = {"vLLM": "vllm", "llama.cpp": "llamacpp", "SGLang": "sglang", "TGI": "tgi", "Ollama": "ollama",
              "zgtool engine": "zgtool-engine"}
ENGINE_CONFIDENCE = 0.9


@dataclass
class HeadersResult:
    url: str
    method: str
    path: str
    status: int
    http_version: str
    connect_ms: float | None
    ttfb_ms: float | None
    total_ms: float | None
    request_headers: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    body_excerpt: str
    analysis: HeaderAnalysis
    notes: list[str] = field(default_factory=list)


def analyse_headers(headers: list[tuple[str, str]], body: str = "") -> HeaderAnalysis:
    """Everything the headers (and an error body) say about who answered and who was in between."""
    lower = [(k.lower(), v) for k, v in headers]
    via = parse_via([v for k, v in lower if k == "via"])
    timing = parse_server_timing([v for k, v in lower if k == "server-timing"])
    detections = match_signatures(headers, via, timing, body)
    origin = [d for d in detections if d.kind == "origin"]
    inter = [d for d in detections if d.kind != "origin"]
    # a gateway that passes the origin's headers on under a prefix (LiteLLM: llm_provider-server)
    # shows the origin in them; those outrank guesses from ids the gateway copied to the top level
    upstream = upstream_headers(headers)
    via_gateway = False
    if upstream:
        up_via = parse_via([v for k, v in upstream if k.lower() == "via"])
        up_timing = parse_server_timing([v for k, v in upstream if k.lower() == "server-timing"])
        up_origin = [d for d in match_signatures(upstream, up_via, up_timing) if d.kind == "origin"]
        for d in up_origin:
            d.evidence = [Evidence(f"{e.what} (the upstream's header, passed on prefixed)", e.weight)
                          for e in d.evidence]
        if up_origin:
            via_gateway = not any(d.id in {u.id for u in up_origin} for d in origin)
            up_ids = {d.id for d in up_origin}
            origin = up_origin + [d for d in origin if d.id not in up_ids and d.confidence >= 0.5
                                  and not _explained_by(d.id, up_ids)]
    engine = _engine_origin(lower, body, {d.id for d in origin})
    if engine is not None:
        origin.insert(0, engine)
    server = next((v for k, v in lower if k == "server"), None)
    if not inter and server is None and any(sends_server_header(o.id) for o in origin):
        # nginx (and others) drop the upstream Server header by default; a missing one
        # from an origin that always sends it hints at an unnamed hop.
        inter.append(Detection("unidentified", "unidentified proxy", "proxy", 0.4, "low", [
            Evidence("Server header missing although the detected origin always sends one", 0.4)]))
    strong = [d for d in inter if d.confidence >= 0.5]
    hop_estimate = max(len(strong), len(via))
    request_ids = {k: v for k, v in lower if k in REQUEST_ID_HEADERS}
    prefixes = {}
    for k, v in request_ids.items():
        m = _ID_PREFIX.match(v)
        if m and not re.fullmatch(r"[0-9a-fA-F]+[-_]", m.group(1)):
            prefixes[k] = m.group(1)
    load_hint, load_err = None, None
    raw_hint = next((v for k, v in lower if k == "x-gpu-load-hint"), None)
    if raw_hint is not None:
        try:
            parsed = json.loads(raw_hint)
            if isinstance(parsed, dict):
                load_hint = parsed
            else:
                load_err = f"not a JSON object: {raw_hint[:80]!r}"
        except json.JSONDecodeError as exc:
            load_err = f"not JSON ({exc.msg}): {raw_hint[:80]!r}"
    rate = {k: v for k, v in lower if _RATE_LIMIT.search(k)}
    return HeaderAnalysis(origin, inter, hop_estimate, via, timing, request_ids, prefixes, load_hint,
                          load_err, rate, origin_via_gateway=via_gateway)


def _engine_origin(lower: list[tuple[str, str]], body: str, known: set[str]) -> Detection | None:
    """The inference engine that wrote the answer, named by what it put in the body (vLLM's
    system_fingerprint, llama.cpp's timings: every hop that passes the body on keeps them) or by its own
    headers (llama.cpp's Server, TGI's x-compute-*); None when nothing names one or it is detected already."""
    doc = None
    if body.lstrip().startswith("{"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
    named: EngineName | None = from_body(doc)
    where = "the answer's body: "
    if named is None:
        named, where = from_headers(dict(lower)), "the answer's header "
    if named is None or ENGINE_IDS.get(named.name, named.name) in known:
        return None
    return Detection(ENGINE_IDS.get(named.name, named.name), f"{named.label()} (inference engine)", "origin",
                     ENGINE_CONFIDENCE, level_for(ENGINE_CONFIDENCE), [Evidence(where + named.evidence,
                                                                                ENGINE_CONFIDENCE)])


def add_detected_engine(analysis: HeaderAnalysis, engine: EngineName | None) -> None:
    """The engine zgtool's detection named (its requests on both APIs: vLLM's system_fingerprint comes back only
    in an OpenAI-shaped answer, so a probe on the Anthropic API through a gateway sees none) as an origin, when
    this probe's own answer named none of that id."""
    if engine is None:
        return
    ident = ENGINE_IDS.get(engine.name, engine.name)
    if any(d.id == ident for d in analysis.origin):
        return
    analysis.origin.insert(0, Detection(ident, f"{engine.label()} (inference engine)", "origin", ENGINE_CONFIDENCE,
                                        level_for(ENGINE_CONFIDENCE),
                                        [Evidence(f"zgtool's detection requests: {engine.evidence}",
                                                  ENGINE_CONFIDENCE)]))


def _explained_by(sig_id: str, ids: set[str]) -> bool:
    from zgtool.probes.signatures import load_database

    return any(s["id"] == sig_id and set(s.get("unless", ())) & ids for s in load_database()["signatures"])


def probe_headers(target: Target, *, method: str | None = None, path: str | None = None,
                  timeout_s: float = 10.0, insecure: bool = False, probe_errors: bool = True) -> HeadersResult:
    """One API request, analysed; with probe_errors also one malformed request (see hopevidence)."""
    req = build(target, stream=False, max_tokens=1, method=method, path=path)
    conn = connection_for(target, timeout_s=timeout_s, insecure=insecure)
    with conn:
        conn.connect()
        conn.send_request(req.method, req.path, req.headers, req.body)
        head = conn.read_head()
        body = bytearray()
        decode = content_decoder(head)
        for piece in conn.iter_body(head, method=req.method):
            body += decode(piece.data)
            if len(body) >= BODY_LIMIT:
                break
        end_s = time.perf_counter()
    t = conn.timings
    text = bytes(body).decode("utf-8", "replace")
    notes = []
    if head.status >= 400:
        notes.append(f"the request was answered with HTTP {head.status}; headers of error answers still "
                     "identify the hops, but an intermediary may have answered on its own")
    analysis = analyse_headers(head.headers, text)
    err = error_probe(target, req.path, timeout_s=timeout_s, insecure=insecure) if probe_errors else None
    ttfb = t.ms(t.request_out_s, t.first_byte_s)
    analysis.error_probe = err
    analysis.outside_origin_ms = outside_origin(ttfb, t.ms(t.start_s, t.connected_s), analysis.server_timing)
    answered = err is not None and err.status is not None
    err_analysis = analyse_headers(err.headers, err.body_excerpt) if err is not None and answered else None
    hop = assess(analysis, head.headers, err, analysis.outside_origin_ms, err_analysis)
    analysis.verdict, analysis.verdict_summary, analysis.hop_evidence = hop.verdict, hop.summary, hop.evidence
    return HeadersResult(
        url=target.url, method=req.method, path=req.path, status=head.status, http_version=head.http_version,
        connect_ms=t.ms(t.start_s, t.connected_s), ttfb_ms=t.ms(t.request_out_s, t.first_byte_s),
        total_ms=t.ms(t.start_s, end_s), request_headers=redacted_headers(req, target),
        headers=head.headers, body_excerpt=text[:500], analysis=analysis, notes=notes)
