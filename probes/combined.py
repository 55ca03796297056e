"""`zgtool probe --target NAME`: every probe on one target, one result.

Data (kind "probe.all"): {target_url, tcp, tls, headers, stream, errors, skipped, summary}
where tcp/tls/headers/stream hold each probe's data (or None), errors {probe: message}
for probes that failed, skipped {probe: reason} (tls on a plain-http target), and summary
{intermediaries [names], origin [names], hop_estimate, buffering verdict, handshake/rtt figures,
verdict (identified | likely | none: never "direct"), verdict_summary, evidence [str]}: the headers'
verdict, raised to "likely" when the stream probe finds the events held back and no header named a hop;
published_engines [{base, model, via, tax_command}] where the target is a gateway that publishes the engine
behind the model (LiteLLM's GET /model/info).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zgtool.errors import TargetUnreachable, ZgError
from zgtool.latency.wire.engine_id import EngineName
from zgtool.targets import Target


@dataclass
class AllResult:
    target_url: str
    tcp: Any = None
    tls: Any = None
    headers: Any = None
    stream: Any = None
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def probe_all(target: Target, *, timeout_s: float = 10.0, insecure: bool = False,
              max_tokens: int = 64, engine: EngineName | None = None) -> AllResult:
    """Every probe; `engine`: the engine zgtool's detection named, an origin where the headers probe saw none."""
    from zgtool.probes.headers import add_detected_engine, probe_headers
    from zgtool.probes.stream import probe_stream
    from zgtool.probes.tcp import probe_tcp
    from zgtool.probes.tls import probe_tls

    res = AllResult(target.url)
    # tcp first: an unreachable target fails here once (exit 3) instead of four times.
    try:
        res.tcp = probe_tcp(target, timeout_s=timeout_s, insecure=True)
    except TargetUnreachable:
        raise
    except ZgError as exc:
        res.errors["tcp"] = exc.message
    if target.scheme == "https":
        _run(res, "tls", lambda: probe_tls(target, timeout_s=timeout_s))
    else:
        res.skipped["tls"] = "plain http target: no TLS to probe"
    _run(res, "headers", lambda: probe_headers(target, timeout_s=timeout_s, insecure=insecure))
    if res.headers is not None:
        add_detected_engine(res.headers.analysis, engine)
    _run(res, "stream", lambda: probe_stream(target, timeout_s=max(timeout_s, 30.0), insecure=insecure,
                                             max_tokens=max_tokens))
    res.summary = summarise(res)
    engines = published_engines(target, timeout_s=timeout_s, insecure=insecure)
    if engines:
        res.summary["published_engines"] = engines
    return res


def published_engines(target: Target, *, timeout_s: float, insecure: bool) -> list[dict[str, str]]:
    """The engines a gateway publishes behind the target's model (LiteLLM's GET /model/info:
    zgtool.workload.upstream), each {base, model, via, tax_command}; [] when it publishes none."""
    import httpx

    from zgtool.workload.upstream import published_upstreams, strip_v1

    base = strip_v1(target.base_url)
    try:
        with httpx.Client(timeout=timeout_s, verify=not insecure, trust_env=False) as client:
            ups = published_upstreams(client, base, target.model, target.auth_headers())
    except httpx.HTTPError:
        return []
    return [{"base": u.base, "model": u.model, "via": u.via,
             "tax_command": f"zgtool latency-split {u.base}/v1 {base}/v1"} for u in ups]


def _run(res: AllResult, name: str, fn: Any) -> None:
    try:
        setattr(res, name, fn())
    except ZgError as exc:
        res.errors[name] = exc.message


def summarise(res: AllResult) -> dict[str, Any]:
    s: dict[str, Any] = {}
    if res.headers is not None:
        a = res.headers.analysis
        s["origin"] = [d.name for d in a.origin]
        s["intermediaries"] = [f"{d.name} ({d.level})" for d in a.intermediaries]
        s["hop_estimate"] = a.hop_estimate
    if res.stream is not None:
        s["buffering"] = res.stream.buffering.verdict
    if res.tcp is not None:
        st = res.tcp.stream
        s["connect_ms"] = res.tcp.connect_ms
        s["syn_synack_ms"] = st.syn_synack_ms if st else None
        s["server_hops_by_ttl"] = st.server_hops if st else None
        s["captured"] = res.tcp.captured
    if res.tls is not None:
        s["tls"] = f"{res.tls.version} {res.tls.cipher} alpn={res.tls.alpn}"
        s["ja4s"] = res.tls.ja4s
    s.update(overall_verdict(res))
    return s


def overall_verdict(res: AllResult) -> dict[str, Any]:
    """Headers' verdict plus what the other probes add (a held-back stream, h2 from an HTTP/1.1-only origin)."""
    verdict, summary, evidence = "none", "no intermediary evident (not proof there is none)", []
    if res.headers is not None:
        a = res.headers.analysis
        verdict, summary, evidence = a.verdict, a.verdict_summary, list(a.hop_evidence)
    origin_ids = {d.id for d in res.headers.analysis.origin} if res.headers is not None else set()
    if res.stream is not None and res.stream.buffering.verdict == "buffering":
        evidence.append(f"probe stream: {res.stream.buffering.reason}")
        if verdict == "none":
            verdict, summary = "likely", "an intermediary is likely, unidentified"
    if res.tls is not None and res.tls.alpn == "h2" and origin_ids & {"zgtool-engine", "uvicorn"}:
        evidence.append("TLS chose ALPN h2 although the origin speaks only HTTP/1.1: something else terminated TLS")
        if verdict == "none":
            verdict, summary = "likely", "an intermediary is likely, unidentified"
    return {"verdict": verdict, "verdict_summary": summary, "evidence": evidence}
