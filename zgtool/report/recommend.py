"""Recommendations computed from the data: each rule has its threshold here and quotes the figures
that triggered it; a rule whose data is absent says nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zgtool.latency.render.split import fmt_ci
from zgtool.loadtest.summary import started_enough
from zgtool.report.load import ResultSet
from zgtool.report.model import ok_samples, path_name, phase_p, probes_by_path, splits
from zgtool.report.tax import engine_explains_total, family_rows
from zgtool.report.verdict import HIGHER, NOT_SIGNIFICANT, ConfigTax, PhaseTax, gateway_phases, taxes

CACHE_HIT_RATE_MIN = 0.20        # below this a response cache costs more than it saves
TAX_PCT_MAX = 10.0               # a significant tax above this share of the direct total is worth acting on
ACT_MIN_MS = 1.0                 # ... and above this many ms per request: a sub-millisecond cost is no action
TAX_GROWTH_FACTOR = 2.0          # tax at the highest concurrency vs at c=1: the gateway queues
ITL_JITTER_RATIO = 3.0           # p99 / p50 inter-token gap: a stream that stutters
K6_FAILURE_RATE_MAX = 0.01
K6_RATE_SHORTFALL = 0.9          # achieved below 90% of the asked rate
KV_UTIL_PCT_MAX = 90.0
PREFIX_HIT_RATE_MIN = 0.10
CERT_DAYS_MIN = 14.0
INTERMEDIARY_CONFIDENCE = 0.5
ENGINE_DRIFT_PCT = 5.0           # the engine's own work should not differ by path; more than this = noise
ENGINE_WORK = ("prefill_ms", "decode_ms", "detok_ms")


@dataclass(frozen=True)
class Recommendation:
    severity: str                # act | check | info
    title: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


Rule = Callable[[ResultSet], list[Recommendation]]


def _buffering(rs: ResultSet) -> list[Recommendation]:
    out = []
    for path, probes in probes_by_path(rs).items():
        b = (probes.get("stream") or {}).get("buffering") or {}
        if b.get("verdict") == "buffering":
            frac, silence = b.get("burst_fraction"), b.get("silence_before_burst_ms")
            out.append(Recommendation(
                "act", f"A hop on the {path} path buffers the stream",
                f"{(frac or 0):.0%} of the streamed content arrived in one burst after {silence or 0:.0f} ms of "
                "silence, so users see no token until the answer is done. Turn response buffering off for SSE "
                "(nginx: proxy_buffering off, or send X-Accel-Buffering: no).",
                {"burst_fraction": frac, "silence_before_burst_ms": silence, "reason": b.get("reason")}))
    return out


def _cache(rs: ResultSet) -> list[Recommendation]:
    v = rs.first("verify")
    cache = ((v or {}).get("data") or {}).get("cache") or {}
    hits, n = cache.get("hits"), cache.get("answers_with_x_cache")
    if not n:  # no verify observation: fall back to the x-cache answers the probes saw
        seen = [val for probes in probes_by_path(rs).values() for p in ("headers", "stream")
                for name, val in (probes.get(p) or {}).get("headers") or [] if name.lower() == "x-cache"]
        hits, n = sum(1 for s in seen if s.upper().startswith("HIT")), len(seen)
    if not n:
        return []
    assert hits is not None, "verify's cache data records hits alongside answers_with_x_cache"
    rate = hits / n
    lookups = [phase_p(t, "gw_cache_ms") for r in splits(rs) for t in (r.get("data") or {}).get("targets") or []]
    known = [x for x in lookups if x is not None]
    cost = max(known) if known else None
    if rate >= CACHE_HIT_RATE_MIN:
        return [Recommendation("info", f"The gateway cache answers {rate:.0%} of requests",
                               f"{hits} of {n} answers were cache hits (threshold {CACHE_HIT_RATE_MIN:.0%}).",
                               {"hits": hits, "answers": n})]
    cost_txt = f" while its lookup costs {cost:.3f} ms per request (median gw_cache_ms)" if cost is not None else ""
    # materiality: a lookup that costs microseconds is not worth an action, however useless the cache
    severity = "act" if cost is not None and cost >= ACT_MIN_MS else "check" if cost is None else "info"
    return [Recommendation(
        severity, f"The gateway cache is a pure cost here: hit rate {rate:.0%}",
        f"{hits} of {n} answers were cache hits, below {CACHE_HIT_RATE_MIN:.0%}{cost_txt}. Switch the cache off "
        "for this workload, or cache only repeatable (temperature 0) requests.",
        {"hits": hits, "answers": n, "hit_rate": rate, "gw_cache_ms_p50": cost})]


def _figure(t: ConfigTax) -> tuple[str, PhaseTax | None]:
    """(where, figure): the outside-engine tax when attributed, else the total (None when the engine's
    own time explains the total: engine jitter is not the path's cost)."""
    oe = t.outside_engine
    if oe is not None and not t.attribution_missing:
        return "outside the engine", oe
    if engine_explains_total(t):
        return "in total", None
    return "in total", t.total


def _material(p: PhaseTax | None, family: bool) -> bool:
    """A cost worth acting on follows the verdict's rules: significant (family-adjusted when several
    configurations are compared and the result carries it), higher, not negligible, and at least
    ACT_MIN_MS per request."""
    return (p is not None and p.is_finding(family) and p.sig(family) == HIGHER and p.diff_ms >= ACT_MIN_MS)


def _ci(p: PhaseTax) -> str:
    return f"95% CI {fmt_ci(p.lo_ms, p.hi_ms)} ms"


def _tax(rs: ResultSet) -> list[Recommendation]:
    rows, family = family_rows([t for r in splits(rs) for t in taxes(r)])
    out = []
    big = []
    for t in rows:
        where, p = _figure(t)
        if p is None or not p.is_finding(family) or p.sig(family) != HIGHER or (p.pct_of_total or 0.0) <= TAX_PCT_MAX:
            continue
        big.append(t)
        pct = p.pct_of_total or 0.0
        if not _material(p, family):
            out.append(Recommendation(
                "info", f"{t.candidate} adds {p.diff_ms:.2f} ms ({pct:.1f}%) {where} at {t.label}",
                f"A large share of a fast request, but under {ACT_MIN_MS:g} ms per request ({_ci(p)}): nothing a "
                "user would notice; no action needed.",
                {"tax_ms": p.diff_ms, "tax_pct": pct}))
            continue
        top = gateway_phases(t)[:3]
        parts = ", ".join(f"{q.phase} {q.diff_ms:+.2f} ms" for q in top) or "no single gateway phase stands out"
        out.append(Recommendation(
            "act", f"{t.candidate} adds {p.diff_ms:.2f} ms ({pct:.1f}%) {where} at {t.label}",
            f"Above the {TAX_PCT_MAX:.0f}% threshold and significant ({_ci(p)}). Where it goes: {parts}. Remove "
            "the steps the gateway does not need for this route, or move them into the serving process.",
            {"tax_ms": p.diff_ms, "tax_pct": pct, "direct_ms": t.baseline_total_ms, "where": where}))
    out += _growth(rows, family)
    if rows and not big:
        figs = [(t, *_figure(t)) for t in rows]
        worst_t, where, worst = max(figs, key=lambda x: (x[2].pct_of_total or 0.0) if x[2] is not None else -1e9)
        if worst is not None:
            state = "significant" if worst.sig(family) != NOT_SIGNIFICANT else "no significant difference"
            out.append(Recommendation(
                "info", "The gateway tax stays under the threshold",
                f"No configuration has a significant tax above {TAX_PCT_MAX:.0f}% of the direct total (largest: "
                f"{worst.diff_ms:+.2f} ms, {worst.pct_of_total or 0:+.1f}% {where} at {worst_t.label}, {state}).",
                {"tax_ms": worst.diff_ms, "tax_pct": worst.pct_of_total}))
    return out


def _growth(rows: list[ConfigTax], family: bool) -> list[Recommendation]:
    """A tax that grows with concurrency: only from figures that are themselves material at both ends,
    and whose intervals do not overlap (so the growth is not noise either)."""
    out = []
    by_cand: dict[tuple[str, bool], list[ConfigTax]] = {}
    for t in rows:
        by_cand.setdefault((t.candidate, t.stream), []).append(t)
    for (cand, stream), ts in by_cand.items():
        ts.sort(key=lambda t: t.concurrency)
        lo_t, hi_t = ts[0], ts[-1]
        (_, lo), (where, hi) = _figure(lo_t), _figure(hi_t)
        if (len(ts) < 2 or lo is None or hi is None or not _material(lo, family) or not _material(hi, family)
                or hi.diff_ms <= TAX_GROWTH_FACTOR * lo.diff_ms or lo.hi_ms is None or hi.lo_ms is None
                or hi.lo_ms <= lo.hi_ms):
            continue
        out.append(Recommendation(
            "check", f"The {cand} tax grows with concurrency ({'stream' if stream else 'non-stream'})",
            f"{lo.diff_ms:.2f} ms {fmt_ci(lo.lo_ms, lo.hi_ms)} at c={lo_t.concurrency} becomes {hi.diff_ms:.2f} ms "
            f"{fmt_ci(hi.lo_ms, hi.hi_ms)} at c={hi_t.concurrency} {where} (more than {TAX_GROWTH_FACTOR:g}x, both "
            "significant, intervals apart): the gateway serialises work under load (one worker, a small "
            "connection pool or a GIL-bound step). Give it more workers or keep-alive connections upstream.",
            {"low_c": lo_t.concurrency, "low_ms": lo.diff_ms, "high_c": hi_t.concurrency, "high_ms": hi.diff_ms}))
    return out


def _noise(rs: ResultSet) -> list[Recommendation]:
    """The same engine serves both paths, so its compute phases should match. When they differ
    significantly, either the gateway's processes took CPU from the engine on this host
    (co-location: named with the gateway's CPU ms per request) or the machine was busy."""
    out = []
    for t in (t for r in splits(rs) for t in taxes(r)):
        drift = [p for p in t.phases if p.phase in ENGINE_WORK and p.significance != NOT_SIGNIFICANT
                 and p.pct_of_total is not None and abs(p.pct_of_total) > ENGINE_DRIFT_PCT]
        if not drift:
            continue
        what = ", ".join(f"{p.phase} {p.diff_ms:+.2f} ms ({p.pct_of_total:+.1f}%)" for p in drift)
        if t.gateway_cpu_ms and any(p.diff_ms > 0 for p in drift):
            out.append(Recommendation(
                "check", f"The gateway competes with the engine for CPU at {t.label}",
                f"{what} on the {t.candidate} path although one engine serves both: the gateway stole "
                f"{t.gateway_cpu_ms:.2f} ms of CPU per request from a CPU-bound engine on this host. That is "
                "co-location, not gateway latency: give the gateway its own cores (cpuset, taskset) or host.",
                {"phases": {p.phase: p.diff_ms for p in drift}, "gateway_cpu_ms": t.gateway_cpu_ms}))
            continue
        out.append(Recommendation(
            "check", f"Engine compute differs between the paths at {t.label}: the run was noisy",
            f"{what} between {t.baseline} and {t.candidate}, above {ENGINE_DRIFT_PCT:g}% of the direct total, "
            "although one engine serves both paths. Other load on the machine moved the figures; rerun on a "
            "quiet machine or with more requests before trusting this configuration's tax.",
            {"phases": {p.phase: p.diff_ms for p in drift}}))
    return out


def _jitter(rs: ResultSet) -> list[Recommendation]:
    out = []
    for r in splits(rs):
        cfg = (r.get("data") or {}).get("config") or {}
        for t in (r.get("data") or {}).get("targets") or []:
            p50, p99 = phase_p(t, "itl_ms", "p50"), phase_p(t, "itl_ms", "p99")
            if p50 and p99 and p99 / p50 > ITL_JITTER_RATIO:
                out.append(Recommendation(
                    "check", f"Stream stutters on {t['name']} at c={cfg.get('concurrency')}",
                    f"Inter-token gap p99 {p99:.1f} ms is {p99 / p50:.1f}x its p50 {p50:.1f} ms (threshold "
                    f"{ITL_JITTER_RATIO:g}x): steps are stalled by prefills of other requests or by the host. "
                    "Chunked prefill or a lower batch cap smooth it.",
                    {"itl_p50_ms": p50, "itl_p99_ms": p99, "requests": len(ok_samples(t))}))
    return out


def _k6(rs: ResultSet) -> list[Recommendation]:
    out = []
    for r in rs.of("bench.k6"):
        for name, s in ((r.get("data") or {}).get("scenarios") or {}).items():
            fr, rate, got = s.get("failure_rate"), s.get("rate_rps"), s.get("achieved_rps")
            if fr is not None and fr > K6_FAILURE_RATE_MAX:
                out.append(Recommendation("act", f"k6 {name}: {fr:.1%} of requests failed",
                                          f"{s.get('failures')} of {s.get('requests')} failed (threshold "
                                          f"{K6_FAILURE_RATE_MAX:.0%}); see the k6 log for the status codes.",
                                          {"failure_rate": fr}))
            poisson = s.get("arrivals") == "poisson"   # counts vary by sqrt(expected): not a shortfall
            duration = ((r.get("data") or {}).get("config") or {}).get("duration_s")
            short = (not started_enough(int(s.get("requests") or 0), rate, duration, poisson) if rate and duration
                     else rate and got is not None and got < K6_RATE_SHORTFALL * rate)
            if rate and got is not None and short:
                out.append(Recommendation(
                    "check", f"k6 {name}: the path did not keep the asked rate",
                    f"{got:.2f} req/s achieved of {rate} asked ({got / rate:.0%}, threshold "
                    f"{K6_RATE_SHORTFALL:.0%}); {s.get('dropped_iterations', 0)} iterations dropped. The path is "
                    "past its knee at this rate: find it with `zgtool bench --ramp`.",
                    {"achieved_rps": got, "rate_rps": rate}))
    return out


def _engine(rs: ResultSet) -> list[Recommendation]:
    out = []
    for r in rs.of("dcgm.watch"):
        for g in (r.get("data") or {}).get("gpus") or []:
            kv = ((g.get("summary") or {}).get("kv_util_pct") or {}).get("max")
            if kv is not None and kv > KV_UTIL_PCT_MAX:
                out.append(Recommendation("act", f"The KV pool ran full ({kv:.0f}% peak)",
                                          f"Peak KV use {kv:.1f}% is above {KV_UTIL_PCT_MAX:.0f}%: requests wait "
                                          "for blocks or are preempted. Give the engine more KV memory "
                                          "(--kv-memory-mb) or cap the batch.", {"kv_util_pct_max": kv}))
    for r in rs.of("engine.metrics"):
        d = (r.get("data") or {}).get("derived") or {}
        if d.get("preemptions"):
            out.append(Recommendation("check", f"{d['preemptions']:.0f} preemptions",
                                      "Sequences were preempted and recomputed: the KV pool is too small for "
                                      "the offered concurrency.", {"preemptions": d["preemptions"]}))
        rate, q = d.get("prefix_cache_hit_rate"), d.get("prefix_cache_queries")
        if rate is not None and q and rate < PREFIX_HIT_RATE_MIN:
            out.append(Recommendation(
                "info", f"Prefix cache hit rate {rate:.1%}",
                f"{d.get('prefix_cache_hits', 0):.0f} of {q:.0f} prompt tokens came from the prefix cache (below "
                f"{PREFIX_HIT_RATE_MIN:.0%}): prompts share little, so a prefix-aware router would not help here.",
                {"prefix_cache_hit_rate": rate}))
    return out


def _probes(rs: ResultSet) -> list[Recommendation]:
    out = []
    for path, probes in probes_by_path(rs).items():
        a = (probes.get("headers") or {}).get("analysis") or {}
        seen = [d for d in a.get("intermediaries") or [] if (d.get("confidence") or 0) >= INTERMEDIARY_CONFIDENCE]
        if path == "direct" and seen:
            out.append(Recommendation("act", "The direct path is not direct",
                                      f"{', '.join(d['name'] for d in seen)} answered on the path measured as "
                                      "the baseline; every tax figure understates the gateway's cost.",
                                      {"intermediaries": [d["name"] for d in seen]}))
        cert = (probes.get("tls") or {}).get("certificate") or {}
        days = cert.get("days_left")
        if days is not None and days < CERT_DAYS_MIN:
            out.append(Recommendation("act", f"{path}: certificate expires in {days:.0f} days",
                                      f"{cert.get('subject_cn')} (issuer {cert.get('issuer_cn')}) expires "
                                      f"{cert.get('not_after')}; threshold {CERT_DAYS_MIN:.0f} days.",
                                      {"days_left": days}))
        tls = probes.get("tls") or {}
        if tls and tls.get("verified") is False:
            out.append(Recommendation("check", f"{path}: certificate not trusted by the system CAs",
                                      f"{tls.get('verify_error')}: clients need --cacert or pinning.",
                                      {"verify_error": tls.get("verify_error")}))
    return out


def _gate(rs: ResultSet) -> list[Recommendation]:
    out = []
    for r in rs.of("gate"):
        rows = [row for row in (r.get("data") or {}).get("rows") or [] if row.get("status") == "fail"]
        for row in rows:
            values = " vs ".join(f"{v:.4g}" for v in row.get("values") or [])
            out.append(Recommendation("act", f"Gate breached: {row.get('rule')}",
                                      f"{row.get('check')} does not hold for {row.get('result')} ({values}).",
                                      {"values": row.get("values")}))
    return out


def _capacity(rs: ResultSet) -> list[Recommendation]:
    """A sweep's capacity tax, as its headline states it: a firm one above TAX_PCT_MAX is to act on, an
    indicative one (thin load points) to re-measure; neither is ever "nothing to act on"."""
    out = []
    for r in rs.of("latency_sweep"):
        data = r.get("data") or {}
        for t in data.get("capacity_tax") or []:
            pct = t.get("tax_pct")
            if pct is None or pct <= 0:
                continue
            if t.get("indicative"):
                need = data.get("min_point_requests")
                out.append(Recommendation("check", f"{t.get('candidate')} may cost capacity: re-measure",
                                          f"{t.get('text')}. Re-run the sweep with -n {need} or more per load point "
                                          "before acting on it.", {"tax_pct": pct, "bound": t.get("bound")}))
            else:
                sev = "act" if pct >= TAX_PCT_MAX else "info"
                out.append(Recommendation(sev, f"{t.get('candidate')} saturates earlier than {t.get('baseline')}",
                                          f"{t.get('text')}.", {"tax_pct": pct, "bound": t.get("bound")}))
    return out


RULES: tuple[Rule, ...] = (_buffering, _tax, _noise, _cache, _jitter, _k6, _engine, _probes, _gate, _capacity)
_ORDER = {"act": 0, "check": 1, "info": 2}


def recommendations(rs: ResultSet) -> list[Recommendation]:
    out = [rec for rule in RULES for rec in rule(rs)]
    return sorted(out, key=lambda r: _ORDER.get(r.severity, 3))


def checks() -> list[str]:
    """What the rules look for, with their thresholds (shown when none fired)."""
    return ["a buffering hop on a stream",
            f"a significant gateway tax above {TAX_PCT_MAX:g}% of the direct total and {ACT_MIN_MS:g} ms",
            f"a tax growing more than {TAX_GROWTH_FACTOR:g}x with concurrency (both ends significant, intervals apart)",
            f"a gateway cache hit rate below {CACHE_HIT_RATE_MIN:.0%} (act only when its lookup costs {ACT_MIN_MS:g} ms"
            " or more)",
            f"inter-token gap p99 above {ITL_JITTER_RATIO:g}x its p50",
            f"k6 failures above {K6_FAILURE_RATE_MAX:.0%} or under {K6_RATE_SHORTFALL:.0%} of the asked rate",
            f"KV pool peak above {KV_UTIL_PCT_MAX:g}%, preemptions, prefix-cache hit rate below {PREFIX_HIT_RATE_MIN:.0%}",
            f"engine compute differing by path by more than {ENGINE_DRIFT_PCT:g}% (CPU contention or a noisy run)",
            "an intermediary on the direct path",
            f"a certificate expiring within {CERT_DAYS_MIN:g} days or untrusted",
            "a breached gate",
            f"a sweep's capacity tax above {TAX_PCT_MAX:g}% (an indicative one: re-measure)"]


__all__ = ["Recommendation", "checks", "recommendations", "path_name"]
