"""The shared records of a latency split: per-request samples, the engine's own timing, per-target
summaries and the run's result (plain data, no behaviour beyond small accessors). A leaf: it imports
nothing else of zgtool.latency, so every stage (wire, schedule, attribution, analysis, render) can."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# How each figure is defined; repeated in `--help` and written into every result.
DEFINITIONS: dict[str, str] = {
    "dns_ms": "timed getaddrinfo() before a request that opens a new connection (None for IP literals "
              "and reused connections); the request then connects to that address with Host/SNI kept",
    "connect_ms": "TCP connect: the connect() call inside httpcore's connect_tcp (trace "
                  "connection.connect_tcp marks a new connection); None on a reused connection",
    "tls_ms": "TLS handshake (httpcore trace connection.start_tls); https only",
    "send_ms": "request headers + body written (http11.send_request_headers.started -> send_request_body.complete)",
    "ttfb_ms": "request's first byte handed to the socket -> the response's first byte (status line) arrived "
               "(kernel receive time of its own segment; marks in httpcore's network stream, so h11 "
               "serialising/parsing is not in it): network + server, curl's time_starttransfer",
    "ttfb_headers_ms": "request's first byte out -> the response head complete (its blank line arrived)",
    "ttfb_body_ms": "request's first byte out -> the first body byte arrived (a stream's first SSE bytes, "
                    "keep-alive comments included)",
    "ttft_any_ms": "request start (like ttft_ms) -> the first generated token of any kind: content, reasoning "
                   "(reasoning_content / thinking_delta), a tool call (tool_calls / tool_use / input_json_delta)",
    "ttft_ms": "request start (incl. any DNS/connect/TLS) -> first content token of a stream (non-empty "
               "delta.content / text_delta; a role-only or empty first delta is not one) (vLLM TTFT)",
    "client_lag_ms": "how much earlier than measured a request's first byte, first content token or last byte "
                     "may have arrived: 0 when the kernel's own time of that byte was had (the packet clock's "
                     "segment, or a read of one segment). A figure unsure by over 0.2 ms (no kernel time for it) "
                     "is listed in samples[].unvouched and left out of its stats; an unsure ttfb/ttft/total flags "
                     "the request (lagged, counted as num_lagged)",
    "total_ms": "request start -> response body complete (vLLM E2EL)",
    "itl_ms": "every gap between successive content deltas whose both ends are vouched for, pooled over "
              "requests (vLLM ITL)",
    "tpot_ms": "(total_ms - ttft_ms) / (output_tokens - 1) per request, None when output_tokens <= 1 (vLLM TPOT)",
    "server parts": "Server-Timing durations (engine queue/prefill/decode/detok/safety/total, gateway gw_*) "
                    "from the header and, for streams, the timing event; engine_other = total - engine parts",
    "outside_engine_ms": "total_ms minus the engine's Server-Timing total: client, network and every hop; "
                         "its difference between paths is the gateway tax without the engine's compute noise",
    "gateway_before_call_ms": "a gateway's own spans (LiteLLM's, exported to --otlp-listen): its server span's start "
                              "-> the start of its call to the engine (auth, routing, pre-call hooks); per path, "
                              "never compared between paths",
    "gateway_call_ms": "the gateway's call to the engine by its own span (litellm_request): to the last byte of the "
                       "engine's answer, the engine's time included",
    "gateway_after_call_ms": "the end of the gateway's call -> the end of its server span, which may close after "
                             "the client has the answer's last byte (its logging)",
    "network_client_ms": "total_ms minus DNS/connect/TLS and the attributed server parts: sending, network, "
                         "hops that report nothing (e.g. nginx) and the client itself",
    "waterfall": "rows are disjoint by construction and their means sum to the mean total_ms; send_ms is "
                 "shown as a metric because a server may start its clock before the body is sent",
    "statistics": "p50/p90/p95/p99 (linear), mean, stddev; 95% bootstrap interval of each median, resampling "
                  "whole rounds (paired between paths: requests of one round share machine state) when there "
                  "are >= 3 rounds; a latency's interval is drawn on log latency (ci_method 'log', never "
                  "negative), a difference's on the linear scale; a difference whose interval contains 0 is "
                  "'not significant'",
    "rounds": "targets alternate block-wise (A B, B A, ...); every block opens its connections anew, so "
              "per-connection effects are resampled with the rounds; with keep-alive, each new connection "
              "first carries one unmeasured request, so no measured request pays a connect (connect_ms is "
              "measured with --new-connection, where every request pays it)",
    "min_effect_ms": "the smallest difference that matters: max(0.2 ms, 2% of the baseline's median of that "
                     "figure); a difference whose estimate is below it, significant or not, and whose "
                     "interval is significant or lies within +-min_effect_ms, is 'negligible'",
    "mde_ms": "minimum detectable effect: the smallest true difference this run would call significant "
              "(family-adjusted) 80% of the time, (z(1-alpha/2m) + z(0.8)) x the interval's standard error",
    "lo_adj/hi_adj": "the difference's interval at confidence 1 - 0.05/m (Bonferroni), m = candidates x "
                     "configurations compared (family_size): the one a headline picking the largest uses",
    "request_rps": "ok requests / the wall time of this target's measured blocks (vLLM request_throughput)",
    "output_tok_s": "output tokens (the API's usage) of ok requests / the same wall time (vLLM output_throughput)",
    "goodput_rps": "ok requests meeting every SLO of --slo / the same wall time (vLLM --goodput, DistServe); "
                   "non-stream: TTFT is the whole answer's time and a TPOT SLO does not apply",
    "open_loop": "--rate R: each target's blocks are sent on a schedule (poisson: seeded exponential gaps, "
                 "the same draw for every target of a round; constant: 1/R apart), whatever the answers take. "
                 "scheduled_s = when a request was due; dispatch_lag_ms = its actual send - due; "
                 "*_from_scheduled_ms = the latency counted from due time (what a user arriving on schedule "
                 "saw); achieved rate = sends / (first due -> last actual send) per block, against the schedule "
                 "drawn; load_generator_behind when that is under 95% (one request of slack), the lag p99 "
                 "is over its limit (lag_limit_ms: 5 ms, or 5% of the schedule's mean gap between arrivals "
                 "where that is larger), or a request was due while every worker was busy",
    "cpu_ms_per_request": "CPU time of each local process group (engine, gateway processes) during this target's "
                          "blocks / its requests: what a co-located gateway takes from a CPU-bound engine",
}


# where each engine clock starts (EngineTiming.ttft_start / total_start)
FROM_ARRIVAL = "from arrival"          # the request reached the engine's server
FROM_SCHEDULING = "from scheduling"    # the scheduler first ran it (queue time excluded)


@dataclass(frozen=True)
class EngineTiming:
    """The engine's own account of one request, in ms, as one adapter read it (zgtool.latency.attribution.adapters).

    Phases the engine does not report are None, never 0. `source` names the adapter ("vLLM per-request
    metrics", "llama.cpp timings", "Server-Timing", "TGI headers", ...); `ttft_start`/`total_start` say
    where that clock starts (FROM_ARRIVAL / FROM_SCHEDULING). `other_ms` holds further engine parts
    (zgtool's detok/safety, TGI's validation/inference, Ollama's load) that are not queue/prefill/decode;
    `info` holds figures that are not parts of the total (vLLM's mean_itl_ms, llama.cpp's cache_n tokens).
    """

    source: str
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    total_ms: float | None = None
    ttft_ms: float | None = None
    ttft_start: str | None = None
    total_start: str | None = None
    other_ms: dict[str, float] = field(default_factory=dict)
    info: dict[str, float] = field(default_factory=dict)

    def phases(self) -> dict[str, float]:
        """queue/prefill/decode (+ other parts) that are set: disjoint parts inside total_ms."""
        out = {k: v for k, v in (("queue", self.queue_ms), ("prefill", self.prefill_ms),
                                 ("decode", self.decode_ms)) if v is not None}
        out.update(self.other_ms)
        return out


@dataclass
class RequestSample:
    """One measured request. Phases that did not happen are None, not 0."""

    index: int
    worker: int
    round: int
    ok: bool
    status: int | None = None
    error: str | None = None
    start_s: float = 0.0               # since the run started (perf_counter based)
    local_port: int | None = None
    new_connection: bool = False
    dns_ms: float | None = None
    connect_ms: float | None = None
    tls_ms: float | None = None
    send_ms: float | None = None
    ttfb_ms: float | None = None       # first response byte (DEFINITIONS has the four first-byte/token points)
    ttfb_headers_ms: float | None = None
    ttfb_body_ms: float | None = None
    ttft_any_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    input_tokens: int | None = None
    content_events: int = 0
    server_timing: dict[str, float] = field(default_factory=dict)
    request_id: str | None = None
    first_byte_out_ms: float | None = None   # request start -> its first byte handed to the kernel
    rx_clock: str = "client"            # "packet": every point's own segment; "kernel": the socket's timestamps
    client_lag_ms: float | None = None  # how much earlier than measured its points may have arrived
    lagged: bool = False                # client_lag_ms over the tolerance: ttfb, ttft or total not vouched for
    unvouched: list[str] = field(default_factory=list)  # figures unsure by > 0.2 ms: left out of their stats
    itl_left_out: int = 0               # token gaps with an end not vouched for: left out of itl_ms
    trace_back: bool | None = None      # its traceparent's trace id came back in the engine's spans (None: no spans)
    engine_front_ms: float | None = None   # the engine's own front (API server) before its clock starts: the
                                            # direct path's median rest, the same on every path (analysis)
    trace_id: str | None = None         # the W3C traceparent's trace id this request carried (32 hex)
    trace_echo: str | None = None       # the trace id the engine echoed (x-zgtool-trace-id); None: no echo
    engine: EngineTiming | None = None  # the engine's own timing, from whichever adapter applied
    hop_reports: dict[str, float] = field(default_factory=dict)  # gateways' self-reports, raw name -> ms
    hop_spans: dict[str, float] | None = None   # a gateway's own OTLP spans: before_call_ms, call_ms, after_call_ms
    engine_warnings: list[str] = field(default_factory=list)     # why an engine report was ignored
    error_detail: str | None = None     # the server's error body, trimmed to one line
    # sent first on a kept-alive connection the server had closed (no answer byte came: the error it got), then
    # resent once on a new connection, whose connect is in its figures (zgtool.latency.wire.client); else None
    resent_after: str | None = None
    content_encoding: str | None = None     # the answer's Content-Encoding when not identity (decoded here)
    # open loop only (zgtool.latency.schedule.openloop): None in a closed-loop run
    scheduled_s: float | None = None    # when it was due, since the run started (same clock as start_s)
    dispatch_lag_ms: float | None = None          # its first byte out (kernel time) - scheduled_s, less set-up
    total_from_scheduled_ms: float | None = None  # total_ms + dispatch lag: what a user arriving on time saw
    ttft_from_scheduled_ms: float | None = None
    waited_for_worker: bool = False     # every open-loop worker was busy when it was due


@dataclass
class PhaseStats:
    """One phase of one target: summary (zgtool.stats.summarize) + the median's interval."""

    name: str
    count: int
    summary: dict[str, float]
    median_lo: float | None
    median_hi: float | None
    waterfall_mean_ms: float | None    # mean contribution per ok request (absent = 0): sums to mean total
    ci_method: str = "linear"          # how median_lo/hi were drawn: log | linear, clipped at 0 | linear
    of: int | None = None              # ok requests it could come from (count < of: figures left out)
    ci_note: str | None = None         # why no interval though count >= 8: "no interval (k distinct values)"


@dataclass
class PhaseDifference:
    """candidate - baseline median of one phase (the "gateway tax" when candidate is a gateway)."""

    phase: str
    baseline: str
    candidate: str
    diff_ms: float | None
    lo_ms: float | None
    hi_ms: float | None
    verdict: str                       # higher | lower | not significant
    method: str = "requests"           # what the bootstrap resampled: rounds (paired) or requests
    rounds: int | None = None
    negligible: bool = False           # |diff| below min_effect_ms (zgtool.latency.analysis.design)
    min_effect_ms: float | None = None
    mde_ms: float | None = None        # smallest effect this run detects with 80% power (family-adjusted)
    lo_adj: float | None = None        # interval at 1 - (1 - confidence) / comparisons
    hi_adj: float | None = None
    significant_adj: bool = False
    comparisons: int = 1               # m of the adjustment: candidates x family_size
    note: str | None = None            # why there is no figure: "too few: k of n kept", "not measured: ..."


@dataclass
class Throughput:
    """What the field reports beside latency (vLLM benchmark_serving names), over the wall time of
    this target's measured blocks."""

    duration_s: float
    requests_ok: int
    request_rps: float | None
    input_tokens: int | None           # None: the API reported no usage
    output_tokens: int | None
    output_tok_s: float | None
    slo: dict[str, float] | None = None
    good_requests: int | None = None
    goodput_rps: float | None = None


@dataclass(frozen=True)
class OpenLoopSummary:
    arrivals: str                       # poisson | constant | schedule
    target_rate_rps: float | None       # asked (--rate); None for an explicit schedule
    scheduled_rate_rps: float | None    # the schedule actually drawn: sends / scheduled send spans
    achieved_rate_rps: float | None     # sends / (first due -> last actual send), summed over blocks
    requests_sent: int
    dispatch_lag_p50_ms: float | None
    dispatch_lag_p99_ms: float | None
    dispatch_lag_max_ms: float | None
    lag_limit_ms: float
    waited_for_worker: int              # requests due while every worker was busy
    workers_max: int | None             # the worker pool's largest size
    in_flight_max: int | None           # most requests in flight at once
    max_in_flight: int | None
    client_cpu_s: float | None          # this process's CPU time over the target's blocks
    client_cpu_share: float | None      # client_cpu_s / wall time: 1.0 = one core busy throughout
    load_generator_behind: bool
    reason: str | None                  # why it was flagged, in one line


@dataclass
class TargetResult:
    name: str
    url: str
    api: str
    scheme: str
    samples: list[RequestSample]
    errors: dict[str, int]
    num_ok: int
    num_error: int
    phases: list[PhaseStats] = field(default_factory=list)
    throughput: Throughput | None = None
    cpu_ms_per_request: dict[str, float] | None = None   # local process group -> CPU ms per request
    attribution_warnings: dict[str, int] = field(default_factory=dict)  # engine reports ignored: reason -> n
    detected: dict[str, str] | None = None                # api/model found by probing (zgtool.latency.wire.detect)
    num_lagged: int = 0                                   # ok requests flagged lagged (their unvouched figures left out)
    open_loop: OpenLoopSummary | None = None              # achieved rate, dispatch lag (zgtool.latency.analysis.openloop)
    trace_context: dict[str, Any] | None = None           # did its traceparent reach the engine (survived/dropped)
    trace_echo: dict[str, Any] | None = None              # the engine's echo of the trace id vs the one sent
    hop_account: dict[str, Any] | None = None             # the gateway's own spans' account (analysis.hopspans)
    subsets: dict[str, Any] | None = None                 # figures resting on different requests: {of, kept: {name: k}}


@dataclass
class SplitResult:
    config: dict[str, Any]
    definitions: dict[str, str]
    targets: list[TargetResult]
    differences: list[PhaseDifference]
    waterfall_phases: list[str]
    metric_phases: list[str]
    unattributed_parts: dict[str, list[str]]
    attribution_notes: list[str] = field(default_factory=list)
    # requests overlapped an engine whose clock starts after its front (vLLM's per-request metrics), and the
    # direct path's time outside that clock spread widely: the engine's wait between steps, which a hop's own
    # cost hides in (zgtool.latency.analysis.phases.engine_wait); None when not seen
    engine_wait: dict[str, Any] | None = None


class RequestHook(Protocol):
    """Called around every measured request of one target, outside its timed window
    (zgtool.latency.attribution.promdelta.DeltaWatch reads the engine's histograms before and after)."""

    def before(self) -> Any: ...

    def after(self, token: Any, sample: RequestSample) -> None: ...

    def unmeasured(self, send: Callable[[], list[RequestSample]]) -> list[RequestSample]:
        """Runs ``send`` (requests sent but not measured: the warm-ups) and returns its samples; a hook
        whose next reading they could still move (an engine that records a request after answering it)
        waits here until they no longer can."""
        ...
