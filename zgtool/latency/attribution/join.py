"""The join: per request, the client's phases, each hop's self-report, the engine's phases from whichever
adapter applied, and the unexplained remainder; per path, their medians with intervals, and each hop's
self-report beside the tax of that hop measured from outside.

remainder_ms = total_ms - connection set-up (dns + connect + tls) - Σ hops' own reported time - engine total
- the engine front (API server) where the engine's clock starts after it (latency.analysis.phases).
It is the client, sending, the network, and whatever the hops do not see of themselves (a proxy's accept
queue, LiteLLM's wait before its handler runs). It is never hidden; a request is flagged when the parts
reported claim more time than it took (clocks or a wrong report): the remainder before the engine front is
taken off below -CLOCK_TOLERANCE_MS. The front is the direct path's median, an estimate, so about half of the
direct path's requests lie below it by construction: that is not a claim of too much time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zgtool.bootstrap import LINEAR, LOG, median_ci, median_difference
from zgtool.latency.analysis.phases import engine_source, engine_total_ms, outside_engine_ms
from zgtool.latency.attribution.adapters.base import CLOCK_TOLERANCE_MS
from zgtool.latency.records import FROM_ARRIVAL, FROM_SCHEDULING, RequestSample, TargetResult
from zgtool.stats import percentile


def _get(r: dict[str, float], k: str) -> float | None:
    return r.get(k)


def _diff(r: dict[str, float], a: str, b: str) -> float | None:
    return r[a] - r[b] if a in r and b in r else None


def _sum(r: dict[str, float], *keys: str) -> float | None:
    vals = [r[k] for k in keys if k in r]
    return sum(vals) if vals else None


# hop -> how its own time (not the upstream's) follows from what it reports, in ms. Reports written with
# the response headers (nginx, Caddy, HAProxy) cover the hop up to the upstream's first byte.
HOP_SELF_TIME: dict[str, Callable[[dict[str, float]], float | None]] = {
    "litellm": lambda r: _get(r, "x-litellm-overhead-duration-ms"),
    "kong": lambda r: _get(r, "x-kong-proxy-latency"),
    "mlflow": lambda r: _get(r, "x-mlflow-gateway-overhead-duration-ms"),
    "nginx": lambda r: _diff(r, "nginx", "nginx-upstream-header"),
    "caddy": lambda r: _diff(r, "caddy", "caddy-upstream-header"),
    "haproxy": lambda r: _sum(r, "haproxy-request", "haproxy-queue", "haproxy-connect"),
    "pygw": lambda r: _diff(r, "gw_total", "gw_upstream"),
}
HOP_RAW_NAMES = {"litellm": "x-litellm-overhead-duration-ms", "kong": "x-kong-proxy-latency",
                 "mlflow": "x-mlflow-gateway-overhead-duration-ms", "nginx": "nginx - nginx-upstream-header",
                 "caddy": "caddy - caddy-upstream-header", "haproxy": "haproxy-request + -queue + -connect (%TR+%Tw+%Tc)",
                 "pygw": "gw_total - gw_upstream"}
TTFT_MEANING = {FROM_ARRIVAL: "from the request's arrival at the engine (vLLM's Prometheus TTFT)",
                FROM_SCHEDULING: "from the scheduler first running it (vLLM's per-request metrics TTFT)"}


def hop_self_times(reports: dict[str, float]) -> dict[str, float]:
    out = {}
    for hop, f in HOP_SELF_TIME.items():
        v = f(reports)
        if v is not None:
            out[hop] = max(0.0, v)
    return out


@dataclass(frozen=True)
class JoinedRequest:
    index: int
    round: int
    client: dict[str, float | None]     # connect, tls, send, first byte, first token, last byte (ms)
    hops_self_ms: dict[str, float]      # each hop's own time, from its self-report
    hop_reports: dict[str, float]       # raw, as reported
    engine_source: str | None
    engine: dict[str, float]            # queue/prefill/decode/... from engine_source
    engine_total_ms: float | None
    engine_ttft_ms: float | None
    engine_ttft_start: str | None
    outside_engine_ms: float | None
    remainder_ms: float | None          # unexplained; None without the engine's total
    flagged: bool                       # the reported parts exceed the total by > CLOCK_TOLERANCE_MS


def join_request(s: RequestSample) -> JoinedRequest:
    client = {"dns_ms": s.dns_ms, "connect_ms": s.connect_ms, "tls_ms": s.tls_ms, "send_ms": s.send_ms,
              "first_byte_ms": s.ttfb_ms, "first_token_ms": s.ttft_ms, "last_byte_ms": s.total_ms}
    hops = hop_self_times(s.hop_reports)
    total_e = engine_total_ms(s)
    remainder = rest_before_front = None
    if s.total_ms is not None and total_e is not None:
        setup = sum(v for v in (s.dns_ms, s.connect_ms, s.tls_ms) if v is not None)
        rest_before_front = s.total_ms - setup - sum(hops.values()) - total_e
        # the engine's own front (API server), where its clock starts after it: the same on every path
        remainder = rest_before_front - (s.engine_front_ms or 0.0)
    e = s.engine
    return JoinedRequest(
        index=s.index, round=s.round, client=client, hops_self_ms=hops, hop_reports=dict(s.hop_reports),
        engine_source=engine_source(s), engine=e.phases() if e is not None else {}, engine_total_ms=total_e,
        engine_ttft_ms=e.ttft_ms if e is not None else None, engine_ttft_start=e.ttft_start if e is not None else None,
        outside_engine_ms=outside_engine_ms(s), remainder_ms=remainder,
        flagged=rest_before_front is not None and rest_before_front < -CLOCK_TOLERANCE_MS)


@dataclass(frozen=True)
class Boot:
    """How the intervals are drawn (latency-split's --confidence/--resamples/seed)."""

    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0

    @classmethod
    def of(cls, config: dict[str, Any]) -> Boot:
        return cls(config.get("confidence", 0.95), config.get("resamples", 2000), config.get("seed", 0))


def _stat(values: list[float], groups: list[int], cfg: Boot) -> dict[str, Any] | None:
    """Median and interval; a latency (every value > 0) on log scale so no bound is clipped to 0. No interval
    (and `note` says why) from too few distinct values, from a self-report whose whole spread lies within
    its resolution (nginx's 1 ms: always 0), or where a latency's widened bound went below 0."""
    if not values:
        return None
    res = resolution_ms(values)
    if res is not None and max(values) - min(values) < res:
        return {"median_ms": percentile(values, 50), "lo_ms": None, "hi_ms": None, "n": len(values),
                "note": WITHIN_RESOLUTION, "resolution_ms": res}
    scale = LOG if min(values) > 0 else LINEAR
    iv = median_ci(values, groups=groups, confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed,
                   scale=scale)
    out: dict[str, Any] = {"median_ms": iv.estimate, "lo_ms": iv.lo, "hi_ms": iv.hi, "n": len(values)}
    if iv.note is not None:
        out["note"] = iv.note
    elif min(values) >= 0 and iv.lo is not None and iv.lo < 0:
        out.update(lo_ms=None, hi_ms=None, note=f"no interval (widened below 0; "
                   f"{sum(1 for v in values if v == 0)} of {len(values)} are 0)")
    return out


def _col(rows: Sequence[JoinedRequest], f: Callable[[JoinedRequest], float | None]) -> tuple[list[float], list[int]]:
    pairs = [(v, r.round) for r in rows if (v := f(r)) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _engine_part(k: str) -> Callable[[JoinedRequest], float | None]:
    return lambda r: r.engine.get(k)


def _hop_self(hop: str) -> Callable[[JoinedRequest], float | None]:
    return lambda r: r.hops_self_ms.get(hop)


def _unreported(hop: str) -> Callable[[JoinedRequest], float | None]:
    """Time outside the engine this hop's self-report does not cover."""
    return lambda r: (None if r.outside_engine_ms is None or hop not in r.hops_self_ms
                      else r.outside_engine_ms - r.hops_self_ms[hop])


def path_join(t: TargetResult, cfg: Boot) -> dict[str, Any]:
    """One path: medians (with intervals) of the client's total, the engine's total and phases, each hop's
    own time, the time outside the engine and the remainder; the engine's sources and TTFT start points."""
    rows = [join_request(s) for s in t.samples if s.ok]
    out: dict[str, Any] = {"requests": len(rows)}
    sources: dict[str, int] = {}
    for r in rows:
        if r.engine_source:
            sources[r.engine_source] = sources.get(r.engine_source, 0) + 1
    out["engine_sources"] = sources
    out["engine_ttft_start"] = sorted({TTFT_MEANING.get(r.engine_ttft_start, r.engine_ttft_start)
                                       for r in rows if r.engine_ttft_ms is not None and r.engine_ttft_start})
    out["total_ms"] = _stat(*_col(rows, lambda r: r.client["last_byte_ms"]), cfg)
    out["engine_total_ms"] = _stat(*_col(rows, lambda r: r.engine_total_ms), cfg)
    phases = sorted({k for r in rows for k in r.engine})
    out["engine_phases_ms"] = {k: _stat(*_col(rows, _engine_part(k)), cfg) for k in phases}
    hops = sorted({h for r in rows for h in r.hops_self_ms})
    out["hops_self_ms"] = {h: _stat(*_col(rows, _hop_self(h)), cfg) for h in hops}
    out["hop_self_report_of"] = {h: HOP_RAW_NAMES[h] for h in hops}
    out["outside_engine_ms"] = _stat(*_col(rows, lambda r: r.outside_engine_ms), cfg)
    out["remainder_ms"] = _stat(*_col(rows, lambda r: r.remainder_ms), cfg)
    out["flagged"] = sum(1 for r in rows if r.flagged)
    out["clock_tolerance_ms"] = CLOCK_TOLERANCE_MS
    return out


WITHIN_RESOLUTION = "within its resolution"


def resolution_ms(values: Sequence[float]) -> float | None:
    """The step a self-report comes in, when it is a coarse one: every value a whole number of ms (nginx's
    $upstream_response_time-derived headers, Kong's latency headers); None for a finer or unknown one."""
    if not values or any(v != v for v in values):
        return None
    return 1.0 if all(abs(v - round(v)) < 1e-9 for v in values) else None


def hop_audit(targets: Sequence[TargetResult], cfg: Boot) -> list[dict[str, Any]]:
    """Each hop's self-report beside its tax measured from outside: the candidate's time outside the
    engine minus the baseline's (paths paired by round), and the gap = measured tax - self-report, with a
    bootstrap interval (the self-report's median is taken per resample together with the baseline's
    outside-engine time, so gap = median(cand outside - hop self) - median(base outside))."""
    if len(targets) < 2:
        return []
    base = targets[0]
    base_rows = [join_request(s) for s in base.samples if s.ok]
    a, ga = _col(base_rows, lambda r: r.outside_engine_ms)
    out = []
    for cand in targets[1:]:
        rows = [join_request(s) for s in cand.samples if s.ok]
        for hop in sorted({h for r in rows for h in r.hops_self_ms}):
            tax_b, gb = _col(rows, lambda r: r.outside_engine_ms)
            self_v, gs = _col(rows, _hop_self(hop))
            unseen, gu = _col(rows, _unreported(hop))
            entry: dict[str, Any] = {"baseline": base.name, "path": cand.name, "hop": hop,
                                     "self_report": HOP_RAW_NAMES[hop], "self_ms": _stat(self_v, gs, cfg)}
            if a and tax_b:
                tax = median_difference(a, tax_b, baseline_groups=ga, candidate_groups=gb,
                                        confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed)
                gap = median_difference(a, unseen, baseline_groups=ga, candidate_groups=gu,
                                        confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed)
                entry["measured_tax_ms"] = {"diff_ms": tax.interval.estimate, "lo_ms": tax.interval.lo,
                                            "hi_ms": tax.interval.hi}
                entry["unreported_ms"] = {"diff_ms": gap.interval.estimate, "lo_ms": gap.interval.lo,
                                          "hi_ms": gap.interval.hi, "verdict": gap.verdict}
                res = resolution_ms(self_v)
                if res is not None and tax.interval.hi is not None and tax.interval.hi <= res:
                    # a report in whole ms cannot show a tax under 1 ms: its 0 is not a lie, nor the gap a finding
                    entry["resolution_ms"] = res
                    entry["unreported_ms"]["verdict"] = WITHIN_RESOLUTION
            else:
                entry["measured_tax_ms"] = entry["unreported_ms"] = None
            out.append(entry)
    return out


def join_data(targets: Sequence[TargetResult], cfg: Boot) -> dict[str, Any]:
    """The `join` section of latency-split's result: per path, the hop audit, and every request's row."""
    return {
        "definition": __doc__.split("\n\n")[1] if __doc__ else "",
        "paths": {t.name: path_join(t, cfg) for t in targets},
        "hop_audit": hop_audit(targets, cfg),
        "requests": {t.name: [join_request(s).__dict__ for s in t.samples if s.ok] for t in targets},
    }
