"""vLLM's engine phases from its Prometheus histograms, read around each request (the coarse fallback when
neither per-request metrics nor OTLP spans are on).

The `_sum` and `_count` of vllm:request_queue_time_seconds, request_prefill_time_seconds,
request_decode_time_seconds, e2e_request_latency_seconds and time_to_first_token_seconds are scraped before
and after every request; with exactly one request in flight the deltas are that request's phases. This only
holds at concurrency 1 and when nothing else uses the engine: the e2e count must grow by exactly one, or the
reading is dropped with a counted warning. vLLM records a finished request's histograms just after the last
output leaves the engine, so the scrape after a request is retried until the count moves (up to AFTER_WAIT_S).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zgtool.errors import UsageError
from zgtool.latency.attribution.adapters.base import Reject, check_against_client
from zgtool.latency.attribution.scrape import TIMEOUT_S, Limits, Scrape, Scraper
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming, RequestSample

SOURCE = "vLLM /metrics deltas (c=1 only)"
S_TO_MS = 1000.0
# histogram family -> EngineTiming field (vLLM v1 names, vllm/v1/metrics/loggers.py; seconds)
FAMILIES = {
    "vllm:request_queue_time_seconds": "queue_ms",
    "vllm:request_prefill_time_seconds": "prefill_ms",
    "vllm:request_decode_time_seconds": "decode_ms",
    "vllm:e2e_request_latency_seconds": "total_ms",
    "vllm:time_to_first_token_seconds": "ttft_ms",
}
E2E = "vllm:e2e_request_latency_seconds"
AFTER_WAIT_S = 1.0
AFTER_POLL_S = 0.01

Snapshot = dict[str, tuple[float, float]]   # family -> (sum, count), over every label set


def parse(text: str) -> Snapshot:
    """The _sum/_count of FAMILIES from a Prometheus text exposition, summed over label sets."""
    out: dict[str, list[float]] = {f: [0.0, 0.0] for f in FAMILIES}
    seen: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):      # a declared family with no observations yet is (0, 0)
            parts = line.split()
            if len(parts) >= 3 and parts[2] in out:
                seen.add(parts[2])
            continue
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        for suffix, idx in (("_sum", 0), ("_count", 1)):
            fam = name.removesuffix(suffix)
            if fam != name and fam in out:
                try:
                    value = float(line.rsplit("}", 1)[-1].split()[0])
                except (ValueError, IndexError):
                    continue
                out[fam][idx] += value
                seen.add(fam)
    return {f: (v[0], v[1]) for f, v in out.items() if f in seen}


def fetch(url: str, timeout_s: float = TIMEOUT_S) -> Snapshot:
    """FAMILIES' (sum, count) from one bounded scrape (zgtool.latency.attribution.scrape); OSError naming why
    when the page is unreachable, slow or huge."""
    s = Scraper(url, Limits(timeout_s=timeout_s)).scrape()
    if s.error is not None:
        raise OSError(s.error)
    return {fam: hv for fam in FAMILIES if (hv := s.histogram(fam)) is not None}


def delta(before: Snapshot, after: Snapshot) -> EngineTiming:
    """One request's phases; Reject when the e2e count did not grow by exactly one."""
    if E2E not in before or E2E not in after:
        raise Reject(f"{E2E} not exposed")
    n = after[E2E][1] - before[E2E][1]
    if n != 1:
        raise Reject(f"{E2E}_count grew by {n:g}, not 1 (another request used the engine)")
    fields: dict[str, float | None] = {}
    for fam, name in FAMILIES.items():
        if fam not in before or fam not in after or after[fam][1] - before[fam][1] != 1:
            fields[name] = None
            continue
        v = after[fam][0] - before[fam][0]
        if not math.isfinite(v) or v < 0:
            raise Reject(f"{fam}_sum moved by {v}")
        fields[name] = v * S_TO_MS
    return EngineTiming(source=SOURCE, queue_ms=fields["queue_ms"], prefill_ms=fields["prefill_ms"],
                        decode_ms=fields["decode_ms"], total_ms=fields["total_ms"], ttft_ms=fields["ttft_ms"],
                        ttft_start=FROM_ARRIVAL, total_start=FROM_ARRIVAL)


def settled(before: Snapshot, now: Snapshot, requests: int) -> bool:
    """vLLM records a request just after answering it: the e2e count has moved by `requests` past `before`."""
    return now.get(E2E, (0.0, 0.0))[1] - before.get(E2E, (0.0, 0.0))[1] >= requests


def delta_for(before: Snapshot, after: Snapshot, sample: RequestSample) -> EngineTiming:
    del sample      # vLLM's own count says whether the deltas are one request's
    return delta(before, after)


@dataclass(frozen=True)
class DeltaKind:
    """Whose /metrics a DeltaWatch reads: how to scrape it, when a finished request is in it, and its deltas."""

    source: str
    fetch: Callable[[str], Any]
    settled: Callable[[Any, Any, int], bool]
    delta: Callable[[Any, Any, RequestSample], EngineTiming]


VLLM = DeltaKind(SOURCE, fetch, settled, delta_for)


def llamacpp_kind() -> DeltaKind:
    from zgtool.latency.attribution import promdelta_llamacpp as lc

    return DeltaKind(lc.SOURCE, lc.fetch, lc.settled, lc.delta)


def kind_of(scrape: Scrape) -> DeltaKind | None:
    """The engine whose per-request deltas a scraped /metrics page holds: vLLM's histograms or llama-server's
    counters (--metrics); None for neither."""
    from zgtool.latency.attribution import promdelta_llamacpp as lc

    if scrape.histogram(E2E) is not None:
        return VLLM
    return llamacpp_kind() if lc.exposes(scrape) else None


@dataclass
class DeltaWatch:
    """Scrapes `url` before and after every measured request of one target (runner hook)."""

    url: str
    concurrency: int
    kind: DeltaKind = VLLM

    def scrape(self, url: str) -> Any:
        return self.kind.fetch(url)

    def __post_init__(self) -> None:
        if self.concurrency != 1:
            raise UsageError(f"--vllm-metrics reads histogram deltas around each request, which only "
                             f"belong to one request at -c 1 (not -c {self.concurrency}); use vLLM's "
                             f"per-request metrics or --otlp-listen at higher concurrency")

    def before(self) -> Any:
        try:
            return self.scrape(self.url)
        except OSError:
            return None

    def _settled(self, snap: Any, requests: int) -> Any:
        """A scrape once ``requests`` finished requests are in it past ``snap`` (an engine records a request
        just after answering it), or the last one when AFTER_WAIT_S runs out first; OSError as fetch."""
        deadline = time.monotonic() + AFTER_WAIT_S
        while True:
            now = self.scrape(self.url)
            if self.kind.settled(snap, now, requests) or time.monotonic() >= deadline:
                return now
            time.sleep(AFTER_POLL_S)

    def after(self, snap: Any, sample: RequestSample) -> None:
        if not sample.ok or sample.engine is not None:
            return
        source = self.kind.source
        if snap is None:
            sample.engine_warnings.append(f"{source}: /metrics unreachable")
            return
        try:
            now = self._settled(snap, 1)
        except OSError as exc:
            sample.engine_warnings.append(f"{source}: /metrics {exc or 'unreachable'}")
            return
        try:
            timing = self.kind.delta(snap, now, sample)
            check_against_client(timing, sample.total_ms)
        except Reject as exc:
            sample.engine_warnings.append(f"{source}: {exc}")
            return
        sample.engine = timing

    def unmeasured(self, send: Callable[[], list[RequestSample]]) -> list[RequestSample]:
        """The warm-ups: their records must be in before the next measured request's ``before`` scrape,
        or its delta counts two requests and is dropped (each block's first request, behind a busy engine)."""
        snap = self.before()
        samples = send()
        answered = sum(1 for s in samples if s.ok)
        if snap is not None and answered:
            try:
                self._settled(snap, answered)
            except OSError:
                pass    # the next measured request's own scrape says so
        return samples
