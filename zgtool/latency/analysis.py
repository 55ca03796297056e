"""Attribute each request's total to phases, summarise per target, and compute the gateway tax.

Decomposition of one request (all ms, sums to total_ms by construction):
    dns + connect + tls                            connection set-up (client)
  + gw_* leaves + gw_other                         gateway's own Server-Timing parts
  + queue + prefill + decode + detok + safety      engine Server-Timing parts
  + engine_other (= engine total - engine parts)
  + network_client (= the rest: sending, network, hops that report nothing, the client)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from zgtool.bootstrap import NOT_SIGNIFICANT, median_ci, median_difference
from zgtool.latency.model import (
    DEFINITIONS,
    PhaseDifference,
    PhaseStats,
    RequestSample,
    SplitConfig,
    SplitResult,
    TargetResult,
)
from zgtool.stats import summarize
from zgtool.targets import Target

# connection set-up ends before the request's first byte, so it never overlaps the server's time;
# sending does (a server may start its clock on the headers while the body is still being
# written), so send_ms is a metric row, and its time sits in network_client_ms
CLIENT_PHASES = ("dns_ms", "connect_ms", "tls_ms")
ENGINE_PARTS = ("queue", "prefill", "decode", "detok", "safety")
ENGINE_TOTAL = "total"
# engine spans measured from arrival (cumulative, overlapping the parts): reported, never summed
ENGINE_SPANS = (ENGINE_TOTAL, "ttft")
GW_TOTAL = "gw_total"
# gateway spans that enclose the upstream call: attributing them would count the engine twice
GW_ENCLOSING = ("gw_upstream", "gw_proxy", "gw_backend")
METRICS = ("send_ms", "ttfb_ms", "ttft_ms", "tpot_ms", "itl_ms", "total_ms", "outside_engine_ms")
STREAM_ONLY = ("ttft_ms", "tpot_ms", "itl_ms")


def attribute(server_timing: dict[str, float], *, stream: bool = False) -> tuple[dict[str, float], list[str]]:
    """Server-Timing parts -> (disjoint attributed parts in ms, names left unattributed).

    gw_other (gateway total - engine total - gateway parts: the hop and the proxying) is only
    defined for whole-body answers: on a stream the gateway's header is written when the
    upstream's headers arrive, long before the engine's total is known.
    """
    parts: dict[str, float] = {}
    engine = {k: server_timing[k] for k in ENGINE_PARTS if k in server_timing}
    parts.update(engine)
    engine_total = server_timing.get(ENGINE_TOTAL)
    if engine_total is not None:
        # the parts lie inside total by the engine's contract; a tiny overshoot is rounding
        parts["engine_other"] = max(0.0, engine_total - sum(engine.values()))
    gw_leaves = {k: v for k, v in server_timing.items()
                 if k.startswith("gw_") and k != GW_TOTAL and k not in GW_ENCLOSING}
    parts.update(gw_leaves)
    gw_total = server_timing.get(GW_TOTAL)
    if gw_total is not None and engine_total is not None and not stream:
        parts["gw_other"] = max(0.0, gw_total - engine_total - sum(gw_leaves.values()))
    known = set(parts) | {*ENGINE_SPANS, GW_TOTAL, *GW_ENCLOSING}
    unattributed = sorted(k for k in server_timing if k not in known)
    return parts, unattributed


def decompose(s: RequestSample, stream: bool = False) -> dict[str, float]:
    """One request's waterfall: phase_ms -> ms; absent phases are left out (not 0)."""
    out: dict[str, float] = {}
    for name in CLIENT_PHASES:
        v = getattr(s, name)
        if v is not None:
            out[name] = v
    server, _ = attribute(s.server_timing, stream=stream)
    out.update({f"{k}_ms": v for k, v in server.items()})
    total = s.total_ms or 0.0
    out["network_client_ms"] = total - sum(out.values())
    return out


def waterfall_order(names: set[str]) -> list[str]:
    """Client phases, gateway, engine, then the unattributed rest: the same rows for every target."""
    gw = sorted(n for n in names if n.startswith("gw_") and n != "gw_other_ms")
    engine = [f"{p}_ms" for p in ENGINE_PARTS]
    order = [*CLIENT_PHASES, *gw, "gw_other_ms", *engine, "engine_other_ms", "network_client_ms"]
    return [n for n in order if n in names]


def outside_engine_ms(s: RequestSample) -> float | None:
    """total_ms minus the engine's own total: everything the request spent outside the engine
    (client, network, every hop). The gateway tax on this figure is immune to the engine's
    compute drifting between paths, which on a busy CPU can dwarf a hop."""
    engine_total = s.server_timing.get(ENGINE_TOTAL)
    if s.total_ms is None or engine_total is None:
        return None
    return max(0.0, s.total_ms - engine_total)


def _metric_values(ok: Sequence[RequestSample], metric: str) -> list[float]:
    if metric == "itl_ms":
        return [g for s in ok for g in s.itl_ms]
    if metric == "outside_engine_ms":
        return [v for v in (outside_engine_ms(s) for s in ok) if v is not None]
    vals = (getattr(s, metric) for s in ok)
    return [v for v in vals if v is not None]


def _phase_values(ok: Sequence[RequestSample], rows: Sequence[dict[str, float]], phase: str) -> list[float]:
    if phase in METRICS:
        return _metric_values(ok, phase)
    return [r[phase] for r in rows if phase in r]


def _phase_stats(name: str, values: list[float], n_ok: int, waterfall_sum: float | None,
                 cfg: SplitConfig) -> PhaseStats:
    ci = median_ci(values, confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed)
    mean_contrib = None if waterfall_sum is None or not n_ok else waterfall_sum / n_ok
    return PhaseStats(name, len(values), summarize(values), ci.lo, ci.hi, mean_contrib)


def summarize_target(target: Target, samples: list[RequestSample], cfg: SplitConfig,
                     phases: Sequence[str]) -> TargetResult:
    ok = [s for s in samples if s.ok]
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            key = s.error or "unknown"
            errors[key] = errors.get(key, 0) + 1
    rows = [decompose(s, cfg.stream) for s in ok]
    stats: list[PhaseStats] = []
    for name in phases:
        vals = _phase_values(ok, rows, name)
        if not vals:
            continue
        wsum = None if name in METRICS else sum(r.get(name, 0.0) for r in rows)
        stats.append(_phase_stats(name, vals, len(ok), wsum, cfg))
    return TargetResult(target.name, target.url, target.api, target.scheme, samples, errors,
                        len(ok), len(samples) - len(ok), stats)


def differences(results: Sequence[TargetResult], cfg: SplitConfig) -> list[PhaseDifference]:
    """Every non-baseline target against the first one, per phase (median difference + interval).

    A phase the baseline does not have (e.g. gw_* on a direct path) costs it 0 ms, so the
    gateway's own parts count fully toward its tax.
    """
    if len(results) < 2:
        return []
    base = results[0]
    base_ok = [s for s in base.samples if s.ok]
    base_rows = [decompose(s, cfg.stream) for s in base_ok]
    out: list[PhaseDifference] = []
    for cand in results[1:]:
        cand_ok = [s for s in cand.samples if s.ok]
        cand_rows = [decompose(s, cfg.stream) for s in cand_ok]
        names = [p.name for p in base.phases] + [p.name for p in cand.phases]
        for phase in dict.fromkeys(names):
            a = _phase_values(base_ok, base_rows, phase) or ([0.0] * len(base_ok) if base_ok else [])
            b = _phase_values(cand_ok, cand_rows, phase) or ([0.0] * len(cand_ok) if cand_ok else [])
            if not a or not b:
                out.append(PhaseDifference(phase, base.name, cand.name, None, None, None, NOT_SIGNIFICANT))
                continue
            d = median_difference(a, b, confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed)
            iv = d.interval
            out.append(PhaseDifference(phase, base.name, cand.name, iv.estimate, iv.lo, iv.hi, d.verdict))
    return out


def analyse(targets: Sequence[Target], samples: Sequence[list[RequestSample]], cfg: SplitConfig) -> SplitResult:
    names: set[str] = set()
    unattributed: dict[str, list[str]] = {}
    for t, per_target in zip(targets, samples, strict=True):
        left: set[str] = set()
        for s in per_target:
            if s.ok:
                names.update(decompose(s, cfg.stream))
                left.update(attribute(s.server_timing)[1])
        if left:
            unattributed[t.name] = sorted(left)
    order = waterfall_order(names)
    stream_metrics = [m for m in METRICS if cfg.stream or m not in STREAM_ONLY]
    results = [summarize_target(t, s, cfg, [*order, *stream_metrics])
               for t, s in zip(targets, samples, strict=True)]
    return SplitResult(config=cfg.public(), definitions=dict(DEFINITIONS), targets=results,
                       differences=differences(results, cfg), waterfall_phases=order,
                       metric_phases=stream_metrics, unattributed_parts=unattributed)


def phase(result: TargetResult, name: str) -> PhaseStats | None:
    return next((p for p in result.phases if p.name == name), None)


def result_data(res: SplitResult) -> dict[str, Any]:
    """The `data` of the versioned result: config, definitions, per-target stats and raw samples."""
    from zgtool.results import to_jsonable

    data = to_jsonable(res)
    for t in data["targets"]:
        t["phases"] = {p.pop("name"): p for p in t["phases"]}
        ok_totals = [s["total_ms"] for s in t["samples"] if s["ok"] and s["total_ms"] is not None]
        t["mean_total_ms"] = statistics.fmean(ok_totals) if ok_totals else None
    return data
