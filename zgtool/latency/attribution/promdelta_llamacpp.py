"""llama.cpp server's engine phases from its /metrics counters, read around each request (the fallback for a path
whose answers lost its `timings`: LiteLLM drops them from a stream's chunks).

llama-server started with ``--metrics`` exposes counters that grow when a slot finishes a request
(tools/server, recorded here from llama-cpp-python 0.3.36's vendored build: tests/latency/fixtures/engines/
llamaserver_metrics_*.txt): ``llamacpp:prompt_seconds_total`` and ``llamacpp:tokens_predicted_seconds_total``, the
same prompt and generation times its `timings` give a request (prompt_ms, predicted_ms), and
``llamacpp:tokens_predicted_total``. With one request in flight their deltas are that request's: the predicted
tokens must have grown by exactly the answer's own output tokens (its usage), or the reading is dropped with a
counted warning (another request used the engine, or the answer gave no count to check). As with vLLM's
histograms (promdelta.py) this holds only at -c 1, closed loop. The clock is the slot's: the wait for a free slot
is not in it, as in its `timings`.

llama-server prints its counters to 6 significant digits, so a delta is good to one unit in the 6th digit of the
total: 0.1 ms while it has spent under 100 s generating, 10 ms past 1,000 s. Each reading carries that bound
(`info["resolution_ms"]`, prompt and generation together); the rounding is as often up as down, so it widens a
median's interval and does not shift it.
"""

from __future__ import annotations

import math
from typing import Any

from zgtool.latency.attribution.adapters.base import Reject
from zgtool.latency.attribution.adapters.units import LLAMACPP_METRICS
from zgtool.latency.attribution.scrape import TIMEOUT_S, Limits, Scrape, Scraper
from zgtool.latency.records import EngineTiming, RequestSample

SOURCE = LLAMACPP_METRICS
S_TO_MS = 1000.0
PROMPT_S = "llamacpp:prompt_seconds_total"
PREDICTED_S = "llamacpp:tokens_predicted_seconds_total"
PREDICTED_N = "llamacpp:tokens_predicted_total"
PROCESSING = "llamacpp:requests_processing"
NAMES = (PROMPT_S, PREDICTED_S, PREDICTED_N, PROCESSING)
FROM_SLOT = "from prompt processing (slot wait not reported)"

Snapshot = dict[str, float]


def exposes(scrape: Scrape) -> bool:
    """Whether a scraped page is llama-server's with the counters this reads."""
    return all(scrape.value(n) is not None for n in NAMES)


def snapshot(scrape: Scrape) -> Snapshot:
    return {n: v for n in NAMES if (v := scrape.value(n)) is not None}


def fetch(url: str, timeout_s: float = TIMEOUT_S) -> Snapshot:
    """The counters from one bounded scrape; OSError naming why when the page is unreachable, slow or huge."""
    s = Scraper(url, Limits(timeout_s=timeout_s)).scrape()
    if s.error is not None:
        raise OSError(s.error)
    return snapshot(s)


def settled(before: Snapshot, now: Snapshot, requests: int) -> bool:
    """The finished requests are in the counters: no slot busy, and tokens predicted since `before`."""
    del requests    # llama.cpp counts no requests; a request that predicted nothing is dropped by delta()
    return now.get(PROCESSING, 1.0) == 0 and now.get(PREDICTED_N, 0.0) > before.get(PREDICTED_N, 0.0)


def delta(before: Snapshot, after: Snapshot, sample: RequestSample) -> EngineTiming:
    """One request's prompt and generation times; Reject when the counters do not belong to it alone."""
    missing = [n for n in (PROMPT_S, PREDICTED_S, PREDICTED_N) if n not in before or n not in after]
    if missing:
        raise Reject(f"{missing[0]} not exposed (llama-server --metrics)")
    n = after[PREDICTED_N] - before[PREDICTED_N]
    if sample.output_tokens is None:
        raise Reject(f"the answer gave no output token count to check {PREDICTED_N} against")
    if n != sample.output_tokens:
        raise Reject(f"{PREDICTED_N} grew by {n:g}, not the answer's {sample.output_tokens} "
                     "(another request used the engine)")
    ms: dict[str, Any] = {}
    for name in (PROMPT_S, PREDICTED_S):
        v = after[name] - before[name]
        if not math.isfinite(v) or v < 0:
            raise Reject(f"{name} moved by {v}")
        ms[name] = v * S_TO_MS
    resolution = (printed_unit(after[PROMPT_S]) + printed_unit(after[PREDICTED_S])) * S_TO_MS
    return EngineTiming(source=SOURCE, prefill_ms=ms[PROMPT_S], decode_ms=ms[PREDICTED_S],
                        total_ms=ms[PROMPT_S] + ms[PREDICTED_S], total_start=FROM_SLOT,
                        info={"resolution_ms": resolution})


def printed_unit(value: float, digits: int = 6) -> float:
    """One unit in the last of `digits` significant digits of `value` (C++ streams' default precision, 6)."""
    if not math.isfinite(value) or value <= 0:
        return 0.0
    return float(10 ** (math.floor(math.log10(value)) - digits + 1))
