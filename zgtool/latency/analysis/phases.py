"""Attribute each request's total to phases, summarise per target, and compute the gateway tax.

Decomposition of one request (all ms, sums to total_ms by construction):
    dns + connect + tls                            connection set-up (client)
  + gw_* leaves + gw_other                         gateway's own Server-Timing parts
  + queue + prefill + decode + detok + safety      engine Server-Timing parts
  + engine_other (= engine total - engine parts)
  + network_client (= the rest: sending, network, hops that report nothing, the client)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from zgtool.bootstrap import LOWER, Difference, median_ci, median_difference
from zgtool.latency.analysis import design
from zgtool.latency.analysis.hopspans import hop_account, hop_account_notes
from zgtool.latency.attribution.adapters.units import LLAMACPP, LLAMACPP_METRICS
from zgtool.latency.attribution.adapters.units import VLLM as VLLM_METRICS
from zgtool.latency.config import Slo, SplitConfig
from zgtool.latency.records import (
    DEFINITIONS,
    FROM_ARRIVAL,
    PhaseDifference,
    PhaseStats,
    RequestSample,
    SplitResult,
    TargetResult,
    Throughput,
)
from zgtool.stats import percentile, summarize
from zgtool.targets import Target

MIN_FIGURES = 8                  # no interval (and no difference) from fewer figures than this
NOT_MEASURED = "not measured"    # a verdict of its own: a side had no figure at all
TOO_FEW = "too few"              # a side kept under MIN_FIGURES figures

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
# a gateway's own account from its OTLP spans (samples[].hop_spans): per path, never compared between paths (the
# call holds the engine's time; a path without the gateway has none of it, not 0 of it)
GATEWAY_SPAN_METRICS = {"gateway_before_call_ms": "before_call_ms", "gateway_call_ms": "call_ms",
                        "gateway_after_call_ms": "after_call_ms"}
METRICS = ("send_ms", "ttfb_ms", "ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms", "ttft_ms", "tpot_ms", "itl_ms",
           "total_ms", "outside_engine_ms", *GATEWAY_SPAN_METRICS)
STREAM_ONLY = ("ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms", "ttft_ms", "tpot_ms", "itl_ms")
# a request's value of these is left out when its client could not vouch for it (samples[].unvouched)
LAG_SENSITIVE = ("ttfb_ms", "ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms", "ttft_ms", "tpot_ms")


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
    if not any(k in server for k in (*ENGINE_PARTS, "engine_other")):
        server.update(engine_parts(s))
    out.update({f"{k}_ms": v for k, v in server.items()})
    if s.engine_front_ms is not None:
        out["engine_front_ms"] = s.engine_front_ms
    total = s.total_ms or 0.0
    # one arithmetic: the rest is the total minus every attributed part, the engine's time included, so it
    # equals outside_engine_ms less the client and gateway parts whichever adapter gave the engine's time
    out["network_client_ms"] = total - sum(out.values())
    return out


def engine_parts(s: RequestSample) -> dict[str, float]:
    """The engine's parts from its adapter (vLLM per-request metrics, an OTLP span, /metrics deltas, ...) when
    its Server-Timing did not carry them: queue/prefill/decode and the rest of its total as engine_other."""
    e = s.engine
    if e is None or e.total_ms is None:
        return {}
    parts = {k: v for k, v in e.phases().items() if k in ENGINE_PARTS and v >= 0}
    parts["engine_other"] = max(0.0, e.total_ms - sum(parts.values()))
    return parts


def waterfall_order(names: set[str]) -> list[str]:
    """Client phases, gateway, engine, then the unattributed rest: the same rows for every target."""
    gw = sorted(n for n in names if n.startswith("gw_") and n != "gw_other_ms")
    engine = [f"{p}_ms" for p in ENGINE_PARTS]
    order = [*CLIENT_PHASES, *gw, "gw_other_ms", *engine, "engine_other_ms", "engine_front_ms", "network_client_ms"]
    return [n for n in order if n in names]


def engine_total_ms(s: RequestSample) -> float | None:
    """The engine's own total for this request from whichever adapter applied (s.engine: Server-Timing,
    vLLM per-request metrics, an OTLP span, /metrics deltas, TGI headers, ...), else a raw Server-Timing
    total."""
    if s.engine is not None and s.engine.total_ms is not None:
        return s.engine.total_ms
    return s.server_timing.get(ENGINE_TOTAL)


# sources that read one clock: llama-server's /metrics counters give the same prompt and generation times as its
# `timings` (zgtool.latency.attribution.promdelta_llamacpp), so a path timed by each is no mix of clocks
SAME_CLOCK = {LLAMACPP_METRICS: LLAMACPP}
LLAMACPP_SOURCES = (LLAMACPP, LLAMACPP_METRICS)


def engine_source(s: RequestSample) -> str | None:
    if s.engine is not None and s.engine.total_ms is not None:
        return s.engine.source
    return "Server-Timing" if ENGINE_TOTAL in s.server_timing else None


def outside_engine_ms(s: RequestSample) -> float | None:
    """total_ms minus the engine's own total: everything the request spent outside the engine
    (client, network, every hop). The gateway tax on this figure is immune to the engine's
    compute drifting between paths, which on a busy CPU can dwarf a hop."""
    engine_total = engine_total_ms(s)
    if s.total_ms is None or engine_total is None:
        return None
    return max(0.0, s.total_ms - engine_total)


def engine_total_missing(samples: Sequence[RequestSample]) -> bool:
    """No ok request carried the engine's own total (no adapter applied: a gateway dropped or renamed it)."""
    ok = [s for s in samples if s.ok]
    return bool(ok) and all(engine_total_ms(s) is None for s in ok)


def negative_outside_share(samples: Sequence[RequestSample], tolerance_ms: float = 0.5) -> float:
    """Share of requests whose engine total exceeds the client's own total by more than
    `tolerance_ms`: the engine's clock cannot run longer than the request around it, so the
    attribution is wrong (a stale or foreign Server-Timing), not the hop fast."""
    vals = [s.total_ms - e for s in samples
            if s.ok and s.total_ms is not None and (e := engine_total_ms(s)) is not None]
    return sum(1 for v in vals if v < -tolerance_ms) / len(vals) if vals else 0.0


def _metric_values(ok: Sequence[RequestSample], metric: str) -> tuple[list[float], list[int]]:
    """Values of one metric and, parallel to them, the round of the request each came from."""
    if metric == "itl_ms":
        pairs = [(g, s.round) for s in ok for g in s.itl_ms]
    elif metric in GATEWAY_SPAN_METRICS:
        part = GATEWAY_SPAN_METRICS[metric]
        pairs = [(s.hop_spans[part], s.round) for s in ok if s.hop_spans and part in s.hop_spans]
    elif metric == "outside_engine_ms":
        pairs = [(v, s.round) for s in ok if (v := outside_engine_ms(s)) is not None]
    else:
        point = ("ttft_ms" if metric == "tpot_ms" else metric) if metric in LAG_SENSITIVE else None
        pairs = [(v, s.round) for s in ok if (v := getattr(s, metric)) is not None and point not in s.unvouched]
    return [v for v, _ in pairs], [r for _, r in pairs]


def _phase_values(ok: Sequence[RequestSample], rows: Sequence[dict[str, float]],
                  phase: str) -> tuple[list[float], list[int]]:
    if phase in METRICS:
        return _metric_values(ok, phase)
    pairs = [(r[phase], s.round) for s, r in zip(ok, rows, strict=True) if phase in r]
    return [v for v, _ in pairs], [g for _, g in pairs]


def _phase_stats(name: str, values: list[float], groups: list[int], n_ok: int, waterfall_sum: float | None,
                 cfg: SplitConfig) -> PhaseStats:
    # a latency's interval on log latency cannot go below 0, however few rounds widen it
    method = design.ci_method(values)
    mean_contrib = None if waterfall_sum is None or not n_ok else waterfall_sum / n_ok
    of = None if name == "itl_ms" else n_ok          # gaps are not requests
    if len(values) < MIN_FIGURES:                     # no interval from so few: "too few: k of n kept"
        return PhaseStats(name, len(values), summarize(values), None, None, mean_contrib, method, of)
    ci = median_ci(values, groups=groups, confidence=cfg.confidence, resamples=cfg.resamples, seed=cfg.seed,
                   scale=design.bootstrap_scale(method))
    if ci.note is not None:                           # too few distinct values for a resample to mean anything
        return PhaseStats(name, len(values), summarize(values), None, None, mean_contrib, method, of, ci.note)
    if method == design.CI_CLIPPED and ci.lo is not None and ci.lo < 0:
        # no resampled median of values >= 0 is below 0: the widening for few rounds took it there, and a
        # bound clipped to 0.00 would be that artefact, not a finding
        zeros = sum(1 for v in values if v == 0)
        return PhaseStats(name, len(values), summarize(values), None, None, mean_contrib, method, of,
                          f"no interval (widened below 0; {zeros} of {len(values)} are 0)")
    return PhaseStats(name, len(values), summarize(values), ci.lo, ci.hi, mean_contrib, method, of)


def too_few(kept: int, of: int) -> str:
    return f"too few: {kept} of {of} kept"


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
        vals, groups = _phase_values(ok, rows, name)
        if not vals:
            continue
        wsum = None if name in METRICS else sum(r.get(name, 0.0) for r in rows)
        stats.append(_phase_stats(name, vals, groups, len(ok), wsum, cfg))
    return TargetResult(target.name, target.url, target.api, target.scheme, samples, errors,
                        len(ok), len(samples) - len(ok), stats, num_lagged=sum(1 for s in ok if s.lagged),
                        subsets=subsets(stats, len(ok)))


def subsets(stats: Sequence[PhaseStats], n_ok: int) -> dict[str, Any] | None:
    """Where the table's per-request figures rest on different subsets of the ok requests (TTFB kept for 22 of
    30, total for 30 of 30): the counts, so the table can say that one median may exceed another's."""
    kept = {p.name: p.count for p in stats if p.name in METRICS and p.of is not None}
    if len(set(kept.values())) < 2:
        return None
    return {"of": n_ok, "kept": kept}


def _zero_when_absent(phase: str) -> bool:
    """A gateway's own part (gw_*) costs a path without that gateway 0 ms; an engine part or a
    metric missing on one side is missing attribution, not a zero."""
    return phase.startswith("gw_")


def differences(results: Sequence[TargetResult], cfg: SplitConfig) -> list[PhaseDifference]:
    """Every non-baseline target against the first one, per phase (median difference + interval).

    A gateway phase the baseline does not have (gw_* on a direct path) costs it 0 ms, so the
    gateway's own parts count fully toward its tax. Rounds are paired between the two paths.
    Each difference also carries its minimum effect (below it: negligible), the smallest effect the
    run could detect, and its interval adjusted for the family of comparisons (zgtool.latency.analysis.design).
    """
    if len(results) < 2:
        return []
    m = design.comparisons(len(results) - 1, cfg.family_size)
    base = results[0]
    base_ok = [s for s in base.samples if s.ok]
    base_rows = [decompose(s, cfg.stream) for s in base_ok]
    out: list[PhaseDifference] = []
    for cand in results[1:]:
        cand_ok = [s for s in cand.samples if s.ok]
        cand_rows = [decompose(s, cfg.stream) for s in cand_ok]
        names = [p.name for p in base.phases] + [p.name for p in cand.phases]
        for phase in dict.fromkeys(names):
            if phase in GATEWAY_SPAN_METRICS:
                continue
            a, ga = _phase_values(base_ok, base_rows, phase)
            b, gb = _phase_values(cand_ok, cand_rows, phase)
            if _zero_when_absent(phase):
                if not a:
                    a, ga = [0.0] * len(base_ok), [s.round for s in base_ok]
                if not b:
                    b, gb = [0.0] * len(cand_ok), [s.round for s in cand_ok]
            if not a or not b:
                # e.g. a gateway that hides the engine's Server-Timing: no figure, never a "saving", and
                # never "not significant" either: nothing was measured to compare
                side = base.name if not a else cand.name
                out.append(PhaseDifference(phase, base.name, cand.name, None, None, None, NOT_MEASURED,
                                           note=f"not measured on {side}"))
                continue
            if phase != "itl_ms" and min(len(a), len(b)) < MIN_FIGURES:
                k, n = (len(a), len(base_ok)) if len(a) <= len(b) else (len(b), len(cand_ok))
                out.append(PhaseDifference(phase, base.name, cand.name, None, None, None, TOO_FEW,
                                           note=too_few(k, n)))
                continue
            # paired by round: both paths ran round r back to back, on the same machine state
            d = median_difference(a, b, baseline_groups=ga, candidate_groups=gb, confidence=cfg.confidence,
                                  resamples=cfg.resamples, seed=cfg.seed, family_size=m)
            out.append(_difference(phase, base.name, cand.name, d, percentile(a, 50), cfg.confidence, m))
    return out


def _difference(phase: str, base: str, cand: str, d: Difference, base_median_ms: float, confidence: float,
                m: int) -> PhaseDifference:
    iv, adj = d.interval, d.adjusted
    floor = design.min_effect_ms(base_median_ms)
    return PhaseDifference(
        phase, base, cand, iv.estimate, iv.lo, iv.hi, d.verdict, iv.method, iv.rounds,
        negligible=design.is_negligible(iv.estimate, iv.lo, iv.hi, d.significant, floor),
        min_effect_ms=floor, mde_ms=design.mde_ms(iv.lo, iv.hi, confidence, m),
        lo_adj=adj.lo if adj else None, hi_adj=adj.hi if adj else None,
        significant_adj=d.significant_adjusted, comparisons=m, note=iv.note)


def measured_duration_s(samples: Sequence[RequestSample]) -> float:
    """Wall time of a target's measured blocks: per round, first request start -> last request end.

    Open loop (samples with a scheduled send): a block of k sends spans k mean gaps of its schedule,
    not k - 1, so a short block at rate R does not read as more than R req/s."""
    spans: dict[int, tuple[float, float]] = {}
    due: dict[int, list[float]] = {}
    for s in samples:
        end = s.start_s + (s.total_ms or 0.0) / 1000.0
        lo, hi = spans.get(s.round, (s.start_s, end))
        spans[s.round] = (min(lo, s.start_s), max(hi, end))
        if s.scheduled_s is not None:
            due.setdefault(s.round, []).append(s.scheduled_s)
    total = 0.0
    for rnd, (lo, hi) in spans.items():
        times = sorted(due.get(rnd, ()))
        if len(times) > 1:
            lo = min(lo, times[0])
            hi = max(hi, times[-1] + (times[-1] - times[0]) / (len(times) - 1))
        total += hi - lo
    return total


def _token_sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def throughput(samples: Sequence[RequestSample], slo: Slo | None, stream: bool) -> Throughput:
    ok = [s for s in samples if s.ok]
    dur = measured_duration_s(samples)
    out_tok = _token_sum([s.output_tokens for s in ok])

    def rate(x: float | None) -> float | None:
        return None if x is None or dur <= 0 else x / dur

    good = None
    if slo is not None:
        good = sum(1 for s in ok if slo.met_by(ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms, e2e_ms=s.total_ms,
                                               stream=stream))
    return Throughput(duration_s=dur, requests_ok=len(ok), request_rps=rate(len(ok)),
                      input_tokens=_token_sum([s.input_tokens for s in ok]), output_tokens=out_tok,
                      output_tok_s=rate(out_tok), slo=slo.public() if slo else None, good_requests=good,
                      goodput_rps=rate(good))


LITELLM_HOP = "x-litellm-overhead-duration-ms"


def dropped_note(name: str, samples: Sequence[RequestSample], stream: bool, sources_elsewhere: set[str]) -> str:
    """A path whose answers lost the engine's timing that another path's kept; for LiteLLM's streams in front of
    vLLM, why and what measures it instead (fixtures/engines/litellm_vllm_live_*.txt: LiteLLM 1.110 in front of
    vLLM-CPU). ``sources_elsewhere``: where the other paths' engine time came from; vLLM's per-request metrics
    LiteLLM keeps in a whole answer; vLLM's OTLP spans join through it only once LiteLLM forwards the traceparent."""
    note = (f"{name}: no engine timing reached the client (no adapter applied: the path drops or renames it), so "
            "its time outside the engine is not attributed")
    vllm_metrics_elsewhere = VLLM_METRICS in sources_elsewhere
    vllm_elsewhere = any(src.startswith("vLLM") for src in sources_elsewhere)
    behind_litellm = stream and any(LITELLM_HOP in s.hop_reports for s in samples if s.ok)
    if behind_litellm and vllm_elsewhere:
        instead = ("--no-stream measures its tax, and so does " if vllm_metrics_elsewhere else
                   "what measures its tax is ")
        note += ("; LiteLLM drops vLLM's per-request metrics from a stream's usage chunk and keeps them in a whole "
                 f"answer: {instead}-c 1, closed loop, when the first target is vLLM (its /metrics deltas, read by "
                 "default); at any rate, streamed, vLLM's OTLP spans (--otlp-traces-endpoint, joined here by "
                 "--otlp-listen) time each request through it once LiteLLM forwards the traceparent")
        # spans came, none under this path's trace ids: the trace-context note says how to make it forward them
        lost = any(s.trace_back is False for s in samples if s.ok)
        note += " (the note below)" if lost else f": {LITELLM_FORWARD}"
    elif behind_litellm and LLAMACPP in sources_elsewhere:
        # LiteLLM 1.110 in front of llama-server, live here: its stream chunks lose `timings`, a whole answer keeps it
        note += ("; LiteLLM drops llama.cpp's timings from a stream's chunks and keeps them in a whole answer: "
                 "--no-stream measures its tax, and so does -c 1, closed loop, when the first target is llama-server "
                 "started with --metrics (its /metrics counters around each request, read by default)")
    return note


def attribution_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]],
                      stream: bool = False) -> list[str]:
    """Why an outside-engine figure is missing or cannot be trusted, per target."""
    notes = []
    has_engine = [not engine_total_missing(s) for s in samples]
    every_source = {src for per_target in samples for s in per_target if s.ok and (src := engine_source(s))}
    for t, per_target, has in zip(targets, samples, has_engine, strict=True):
        if not has and any(has_engine):
            notes.append(dropped_note(t.name, per_target, stream, every_source))
        share = negative_outside_share(per_target)
        if share > 0.1:
            notes.append(f"{t.name}: the engine's Server-Timing total exceeds the request's own time on "
                         f"{share:.0%} of requests; the outside-engine attribution is missing, not negative")
    notes.extend(resent_notes(targets, samples))
    notes.extend(encoding_notes(targets, samples))
    notes.extend(clock_notes(samples))
    notes.extend(front_notes(targets, samples))
    notes.extend(trace_notes(targets, samples))
    sources = [sorted({SAME_CLOCK.get(src, src) for s in per_target if s.ok and (src := engine_source(s))})
               for per_target in samples]
    if len({tuple(x) for x in sources if x}) > 1:
        named = "; ".join(f"{t.name}: {', '.join(x)}" for t, x in zip(targets, sources, strict=True) if x)
        notes.append(f"the engine's time comes from different sources on different paths ({named}); their "
                     "start points may differ, so the difference outside the engine carries that offset")
    return notes


SURVIVED, DROPPED, PARTLY = "survived", "dropped or rewritten", "partly survived"


def trace_context(samples: Sequence[RequestSample]) -> dict[str, Any] | None:
    """Did this path's fresh traceparents reach the engine? From the engine's spans: every request's trace id
    came back (survived), none did while spans came for other ids (dropped or rewritten by a hop), or some."""
    seen = [s.trace_back for s in samples if s.ok and s.trace_back is not None]
    if not seen:
        return None
    k, n = sum(seen), len(seen)
    verdict = SURVIVED if k == n else DROPPED if k == 0 else PARTLY
    return {"verdict": verdict, "came_back": k, "sent": n}


REWRITTEN, DROPPED_ECHO, MIXED = "rewritten", "dropped", "mixed"


def trace_echo(samples: Sequence[RequestSample], direct_echoes: bool) -> dict[str, Any] | None:
    """Did this path's traceparent reach the engine? From the trace id the engine echoed (zgtool's engine:
    x-zgtool-trace-id) against the one zgtool sent on that request: the same = survived, another = rewritten (a
    hop started its own trace), none while the direct path's answers echo = dropped. None: nothing to judge by
    (no echo on this path nor on the direct one)."""
    ok = [s for s in samples if s.ok and s.trace_id]
    echoed = [s for s in ok if s.trace_echo]
    if not ok or (not echoed and not direct_echoes):
        return None
    same = sum(1 for s in echoed if s.trace_echo == s.trace_id)
    counts = {SURVIVED: same, REWRITTEN: len(echoed) - same, DROPPED_ECHO: len(ok) - len(echoed)}
    verdict = next((v for v, k in counts.items() if k == len(ok)), MIXED)
    return {"verdict": verdict, **counts, "sent": len(ok), "source": "engine echo (x-zgtool-trace-id)"}


def trace_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]]) -> list[str]:
    per = [(t.name, tc) for t, s in zip(targets, samples, strict=True) if (tc := trace_context(s)) is not None]
    notes = litellm_trace_notes(targets, samples)
    if not per:
        return notes
    return ["trace context per path (the engine's spans under each request's fresh traceparent): " + "; ".join(
        f"{name} {tc['verdict']} ({tc['came_back']} of {tc['sent']})" for name, tc in per), *notes]


LITELLM_FORWARD = ("LiteLLM passes the client's traceparent on only with its OpenTelemetry callback loaded and told to "
                   "(litellm_settings: callbacks: [\"otel\"] and forward_traceparent_to_llm_provider: true, with "
                   "opentelemetry-sdk installed beside it; OTEL_TRACES_SAMPLER=always_off keeps LiteLLM's own spans "
                   "unsent; `zgtool gateway --kind litellm --forward-traceparent` starts it so)")


def litellm_trace_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]]) -> list[str]:
    """A LiteLLM path on which no request's trace context reached the engine (no span came back under its trace
    id while spans came, or no echo while the direct path's answers echo): what makes LiteLLM pass it on."""
    direct_echoes = bool(samples) and any(s.ok and s.trace_echo for s in samples[0])
    notes = []
    for t, per_target in zip(targets[1:], samples[1:], strict=True):
        ok = [s for s in per_target if s.ok]
        if not ok or not any(LITELLM_HOP in s.hop_reports for s in ok):
            continue
        spans = trace_context(per_target)
        lost = ((spans is not None and spans["verdict"] == DROPPED)
                or (spans is None and direct_echoes and not any(s.trace_echo for s in ok)))
        if lost:
            notes.append(f"{t.name}: no request's trace context reached the engine through LiteLLM, so its spans "
                         f"cannot be joined to the requests: {LITELLM_FORWARD}")
    return notes


def apply_engine_front(samples: Sequence[list[RequestSample]]) -> float | None:
    """Where the direct (first) path's engine clock starts after the engine's own HTTP server (vLLM's per-request
    metrics: engine-core queueing), its median rest (total minus client set-up and engine time) is the engine
    front (API server): set on every request of every path whose engine clock starts there, so each path's
    waterfall shows it and a hop's rest is what the hop adds. Returns the front, or None."""
    direct = [s for s in samples[0] if s.ok and s.engine is not None and s.total_ms is not None] if samples else []
    starts = {s.engine.total_start for s in direct if s.engine is not None}
    if not direct or len(starts) != 1 or next(iter(starts)) in (None, FROM_ARRIVAL):
        return None
    start = next(iter(starts))
    for per_target in samples:
        for s in per_target:
            s.engine_front_ms = None
    front = max(0.0, percentile([decompose(s)["network_client_ms"] for s in direct], 50))
    for per_target in samples:
        for s in per_target:
            if s.ok and s.engine is not None and s.engine.total_start == start:
                s.engine_front_ms = front
    return front


# the direct path's time outside an engine clock that starts after its front, p90 - p10, above which requests
# that overlapped are taken to have waited for the engine's step outside its clock (at -c 1 against vLLM-CPU
# here it spread 1.6 ms; at -c 4, 40 to 70 ms: a request that reaches the engine core during a step waits for it)
ENGINE_WAIT_SPREAD_MS = 10.0


def engine_wait(targets: Sequence[Target], samples: Sequence[list[RequestSample]],
                cfg: SplitConfig) -> dict[str, Any] | None:
    """Where requests overlap (-c above 1, or an open loop) on an engine whose clock starts after its own front
    (vLLM's per-request metrics: when its engine core takes the request, between two steps), a request that
    arrives during a step waits for that step outside the engine's clock. The direct path's time outside the
    engine then spreads by up to a step, and a hop's own cost hides in that wait: what differs outside the
    engine between paths is mostly which requests waited. Returns the direct path's spread when it is over
    ENGINE_WAIT_SPREAD_MS, else None."""
    if not samples or not (cfg.concurrency > 1 or cfg.open_loop):
        return None
    direct = [s for s in samples[0] if s.ok and s.engine is not None and s.total_ms is not None]
    starts = {s.engine.total_start for s in direct if s.engine is not None}
    if len(direct) < 3 or len(starts) != 1 or next(iter(starts)) in (None, FROM_ARRIVAL):
        return None
    rest = [decompose(s)["network_client_ms"] + (s.engine_front_ms or 0.0) for s in direct]
    lo, hi = percentile(rest, 10), percentile(rest, 90)
    if hi - lo <= ENGINE_WAIT_SPREAD_MS:
        return None
    overlap = f"--rate {cfg.rate_rps:g}" if cfg.rate_rps is not None else (
        "an open loop" if cfg.open_loop else f"-c {cfg.concurrency}")
    source = direct[0].engine.source if direct[0].engine is not None else "the engine"
    return {"target": targets[0].name, "overlap": overlap, "source": source, "starts": next(iter(starts)),
            "p10_ms": round(lo, 3), "p90_ms": round(hi, 3)}


def engine_wait_note(wait: dict[str, Any]) -> str:
    return (f"{wait['source']}: at {wait['overlap']} the time outside the engine on {wait['target']} spread from "
            f"{wait['p10_ms']:.1f} to {wait['p90_ms']:.1f} ms (p10 to p90): the engine's clock starts {wait['starts']}, "
            "between two of its steps, so a request that arrives during a step waits for it outside the clock. "
            "A hop's own cost hides in that wait, and a difference outside the engine between paths is mostly "
            "which requests waited: read it as indicative; -c 1 (each request alone on the engine) measures a "
            "hop's tax to about a millisecond")


def front_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]]) -> list[str]:
    """Where an engine's clock starts after its own HTTP server (vLLM's per-request metrics start when its
    engine core queues the request), the time outside the engine holds the engine's own front on every path
    alike: named once, so the direct path's remainder is not read as network."""
    starts = {(SAME_CLOCK.get(s.engine.source, s.engine.source), s.engine.total_start) for per_target in samples
              for s in per_target if s.ok and s.engine is not None and s.engine.total_start not in (None, FROM_ARRIVAL)}
    return [f"{source}: the engine's clock starts {start}, after its API server: each path's time outside the "
            f"engine includes the engine front (API server), shown as its own row: {targets[0].name}'s median "
            f"rest, subtracted on every path alike; a hop's tax is the difference between paths"
            for source, start in sorted(starts)]


def _upstream_closed(s: RequestSample) -> bool:
    """A hop's answer for a request it could not pass on: nginx's 502, LiteLLM's 500 naming a connection error."""
    err = s.error or ""
    return err.startswith("http_502") or (err.startswith("http_500")
                                          and "connection error" in (s.error_detail or "").lower())


def resent_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]]) -> list[str]:
    """Per path: requests that went out on a kept-alive connection the server had closed, resent on a new one
    (zgtool.latency.wire.client.Session.measure), and what that means for a gateway in front of that server."""
    notes = []
    # streams timed as llama.cpp's on any path: the engine is llama-server, which closes after a streamed answer
    llama_streams = any(s.ok and s.content_events and s.engine is not None and s.engine.source in LLAMACPP_SOURCES
                        for per_target in samples for s in per_target)
    for t, per_target in zip(targets, samples, strict=True):
        resent = [s for s in per_target if s.resent_after is not None]
        bad_gateway = [s for s in per_target if _upstream_closed(s)]
        if bad_gateway and llama_streams:
            # in front of llama-server here: nginx answered 1 to 4 of 30 streams 502 ("upstream prematurely
            # closed"), LiteLLM 1.110 1 of 30 with 500 ("OpenAIException - Connection error")
            statuses = "/".join(sorted({(s.error or "")[5:8] for s in bad_gateway}))
            notes.append(f"{t.name}: {len(bad_gateway)} of {len(per_target)} requests were answered {statuses} by a "
                         "hop in front of llama-server, which closes its kept-alive connection after a streamed answer "
                         "without 'Connection: close': the hop sent them into a connection llama-server had closed "
                         "(nginx resends them with 'proxy_next_upstream error timeout non_idempotent;', LiteLLM with "
                         "num_retries >= 1)")
        if not resent:
            continue
        errors = ", ".join(f"{e} x{n}" for e, n in Counter(s.resent_after for s in resent).most_common())
        notes.append(f"{t.name}: {len(resent)} of {len(per_target)} requests went out on a kept-alive connection "
                     f"the server had already closed after its previous answer (no answer byte: {errors}) and were "
                     "resent on a new connection, as a browser does; their figures are the resent request's, its "
                     "connect included. The server closes kept-alive connections without 'Connection: close' "
                     "(llama-server does after every streamed answer): a gateway that keeps its connections to it "
                     "alive (nginx's upstream keepalive) sends some requests into a closed connection and answers "
                     "them 502 (nginx resends them on a new connection with 'proxy_next_upstream error timeout "
                     "non_idempotent;': 0 of 60 streams failed in front of llama-server here, 1 to 4 of 30 without)")
    return notes


def encoding_notes(targets: Sequence[Target], samples: Sequence[list[RequestSample]]) -> list[str]:
    """Per path whose answers came compressed (the client accepts what the SDKs accept, --accept-encoding): what
    that means for a stream, which a compressing hop holds back until its buffer fills or the answer ends."""
    notes = []
    for t, per_target in zip(targets, samples, strict=True):
        ok = [s for s in per_target if s.ok]
        coded = Counter(s.content_encoding for s in ok if s.content_encoding)
        if not coded:
            continue
        how = ", ".join(f"{c} x{n}" for c, n in coded.most_common())
        streams = any(s.content_events for s in ok)
        notes.append(f"{t.name}: {sum(coded.values())} of {len(ok)} answers came compressed ({how}), as every client "
                     "that accepts gzip (the OpenAI and Anthropic SDKs) gets them"
                     + ("; a compressing hop holds a stream's chunks back until its buffer fills or the answer ends "
                        "(nginx's gzip filter), which the first token's time shows: --accept-encoding identity "
                        "measures the path as curl sees it" if streams else ""))
    return notes


def clock_notes(samples: Sequence[list[RequestSample]]) -> list[str]:
    """Once per run: which clock the receive times came from, when it was not every segment's own."""
    ok = [s for per_target in samples for s in per_target if s.ok and s.first_byte_out_ms is not None]
    off = [s for s in ok if s.rx_clock != "packet"]
    if not off:
        return []
    from zgtool.latency.wire.pktclock import CURRENT

    why = f" (no packet clock: {CURRENT.why_not})" if CURRENT.why_not else ""
    kernel = sum(1 for s in off if s.rx_clock == "kernel")
    return [f"receive times of {len(off)} of {len(ok)} requests from the client socket's own timestamps{why}: "
            f"{kernel} kernel, {len(off) - kernel} user-space; a figure whose byte may have waited behind another "
            f"by over 0.2 ms is left out of its stats (samples[].unvouched)"]


def analyse(targets: Sequence[Target], samples: Sequence[list[RequestSample]], cfg: SplitConfig,
            cpu: dict[str, dict[str, float]] | None = None) -> SplitResult:
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
    if apply_engine_front(samples) is not None:
        names.add("engine_front_ms")
    order = waterfall_order(names)
    stream_metrics = [m for m in METRICS if cfg.stream or m not in STREAM_ONLY]
    results = [summarize_target(t, s, cfg, [*order, *stream_metrics])
               for t, s in zip(targets, samples, strict=True)]
    direct_echoes = bool(samples) and any(s.ok and s.trace_echo for s in samples[0])
    for r, per_target in zip(results, samples, strict=True):
        r.trace_context = trace_context(per_target)
        r.trace_echo = trace_echo(per_target, direct_echoes)
        r.hop_account = hop_account(per_target)
        r.throughput = throughput(per_target, cfg.slo, cfg.stream)
        r.cpu_ms_per_request = (cpu or {}).get(r.name)
    notes = attribution_notes(targets, samples, cfg.stream)
    notes.extend(hop_account_notes(targets, [r.hop_account for r in results]))
    wait = engine_wait(targets, samples, cfg)
    if wait is not None:
        notes.append(engine_wait_note(wait))
    diffs = [_no_negative_outside(d, notes) for d in differences(results, cfg)]
    return SplitResult(config=cfg.public(), definitions=dict(DEFINITIONS), targets=results,
                       differences=diffs, waterfall_phases=order,
                       metric_phases=stream_metrics, unattributed_parts=unattributed,
                       attribution_notes=notes, engine_wait=wait)


def _no_negative_outside(d: PhaseDifference, notes: list[str]) -> PhaseDifference:
    """No hop makes a request spend less time outside the engine than the direct path does, so a
    significantly negative figure is a difference within noise (chance: 1 in 40 A/A runs at 95%, or
    per-connection effects), not a saving. The figure is kept, and the note says so; a path whose
    engine timing is missing or exceeds the request's time has its own note (attribution_notes)."""
    if d.phase != "outside_engine_ms" or d.verdict != LOWER or d.diff_ms is None:
        return d
    notes.append(f"{d.candidate}: time outside the engine came out {abs(d.diff_ms):.2f} ms below {d.baseline}'s "
                 f"([{d.lo_ms:+.2f}, {d.hi_ms:+.2f}] ms): no hop saves time, so a difference within noise "
                 "(chance, or per-connection effects), not a saving; if it recurs run after run, check that "
                 "this path's engine total is the engine's own (a gateway's total under the engine's name "
                 "shrinks the time outside it)")
    return d


def phase(result: TargetResult, name: str) -> PhaseStats | None:
    return next((p for p in result.phases if p.name == name), None)
