"""Config, per-request samples and summaries of a latency split (measurement only, no rendering)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zgtool.errors import UsageError

# How each figure is defined; repeated in `--help` and written into every result.
DEFINITIONS: dict[str, str] = {
    "dns_ms": "timed getaddrinfo() before a request that opens a new connection (None for IP literals "
              "and reused connections); the request then connects to that address with Host/SNI kept",
    "connect_ms": "TCP connect: the connect() call inside httpcore's connect_tcp (trace "
                  "connection.connect_tcp marks a new connection); None on a reused connection",
    "tls_ms": "TLS handshake (httpcore trace connection.start_tls); https only",
    "send_ms": "request headers + body written (http11.send_request_headers.started -> send_request_body.complete)",
    "ttfb_ms": "request's first byte handed to the socket -> first response bytes read from it (marks in "
               "httpcore's network stream, so h11 serialising/parsing is not in it): network + server",
    "ttft_ms": "request start (incl. any DNS/connect/TLS) -> first content delta of a stream (vLLM TTFT)",
    "total_ms": "request start -> response body complete (vLLM E2EL)",
    "itl_ms": "every gap between successive content deltas, pooled over requests (vLLM ITL)",
    "tpot_ms": "(total_ms - ttft_ms) / (output_tokens - 1) per request, None when output_tokens <= 1 (vLLM TPOT)",
    "server parts": "Server-Timing durations (engine queue/prefill/decode/detok/safety/total, gateway gw_*) "
                    "from the header and, for streams, the timing event; engine_other = total - engine parts",
    "outside_engine_ms": "total_ms minus the engine's Server-Timing total: client, network and every hop; "
                         "its difference between paths is the gateway tax without the engine's compute noise",
    "network_client_ms": "total_ms minus DNS/connect/TLS and the attributed server parts: sending, network, "
                         "hops that report nothing (e.g. nginx) and the client itself",
    "waterfall": "rows are disjoint by construction and their means sum to the mean total_ms; send_ms is "
                 "shown as a metric because a server may start its clock before the body is sent",
    "statistics": "p50/p90/p95/p99 (linear), mean, stddev; 95% percentile-bootstrap interval of each median; "
                  "a difference whose interval contains 0 is 'not significant'",
}

PROMPTS: dict[str, str] = {
    "short": "Say hello in one short sentence.",
    "medium": " ".join(["Summarise the trade-offs of putting an HTTP gateway in front of an inference server,"
                        " covering latency, authentication, rate limits and caching."] * 8),
    "long": " ".join(["Explain, step by step and with examples, how paged KV caches, continuous batching and"
                      " chunked prefill interact in a modern LLM serving engine."] * 60),
}
MAX_TOKENS: dict[str, int] = {"short": 16, "medium": 128, "long": 512}


@dataclass(frozen=True)
class SplitConfig:
    num_requests: int = 50
    concurrency: int = 1
    warmup: int = 2
    stream: bool = True
    new_connection: bool = False
    prompt: str = PROMPTS["short"]
    prompt_name: str = "short"
    max_tokens: int = MAX_TOKENS["short"]
    timeout_s: float = 30.0
    verify: bool | str = True          # False, True or a CA bundle path
    rounds: int = 4                    # targets alternate block-wise to spread drift evenly
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise UsageError(f"-n must be at least 1, not {self.num_requests}")
        if self.concurrency < 1:
            raise UsageError(f"-c must be at least 1, not {self.concurrency}")
        if self.warmup < 0:
            raise UsageError(f"--warmup cannot be negative ({self.warmup})")
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1, not {self.max_tokens}")
        if not self.prompt.strip():
            raise UsageError("the prompt is empty")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout must be positive, not {self.timeout_s}")
        if self.rounds < 1:
            raise UsageError(f"--rounds must be at least 1, not {self.rounds}")
        if not 0.5 <= self.confidence < 1.0:
            raise UsageError(f"--confidence must be in [0.5, 1), not {self.confidence}")
        if self.resamples < 100:
            raise UsageError(f"--resamples must be at least 100, not {self.resamples}")

    def public(self) -> dict[str, Any]:
        """Written into the result; the prompt text itself is summarised, not copied."""
        return {"num_requests": self.num_requests, "concurrency": self.concurrency, "warmup": self.warmup,
                "stream": self.stream, "new_connection": self.new_connection, "prompt": self.prompt_name,
                "prompt_chars": len(self.prompt), "max_tokens": self.max_tokens, "timeout_s": self.timeout_s,
                "rounds": self.rounds, "confidence": self.confidence, "resamples": self.resamples,
                "seed": self.seed}


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
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    content_events: int = 0
    server_timing: dict[str, float] = field(default_factory=dict)
    request_id: str | None = None


@dataclass
class PhaseStats:
    """One phase of one target: summary (zgtool.stats.summarize) + the median's interval."""

    name: str
    count: int
    summary: dict[str, float]
    median_lo: float | None
    median_hi: float | None
    waterfall_mean_ms: float | None    # mean contribution per ok request (absent = 0): sums to mean total


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


@dataclass
class SplitResult:
    config: dict[str, Any]
    definitions: dict[str, str]
    targets: list[TargetResult]
    differences: list[PhaseDifference]
    waterfall_phases: list[str]
    metric_phases: list[str]
    unattributed_parts: dict[str, list[str]]
