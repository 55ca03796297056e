"""Streaming TTFT under Poisson load, measured with zgtool's own client: what k6 cannot see.

k6 reads an SSE body only as a whole, so the ramp's knee has no time to first token. Here a
scheduler draws exponential gaps (a Poisson process at `rate_rps`), hands each arrival to a
pool of workers that each own one keep-alive session, and times TTFT from the *scheduled*
arrival: when every worker is busy the wait counts, so a saturated client does not hide a
slow server (no coordinated omission). When the client cannot keep the rate (it shares the
CPU with what it measures), the result says so.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter_ns

from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.stats import percentile
from zgtool.targets import Target


@dataclass(frozen=True)
class TtftAtRate:
    path: str
    rate_rps: float
    duration_s: float
    requests: int
    ok: int
    achieved_rps: float
    ttft_p50_ms: float | None          # from the scheduled arrival (client wait included)
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    client_wait_p95_ms: float | None   # scheduled arrival -> request really sent (all workers busy, or late)
    scheduler_late_p95_ms: float | None   # scheduled arrival -> handed to a worker: the client's own lag
    client_limited: bool
    errors: dict[str, int]


def arrival_times_s(rate_rps: float, duration_s: float, seed: int = 0) -> list[float]:
    """A Poisson process: exponential gaps with mean 1/rate, up to duration_s."""
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


def poisson_ttft(target: Target, rate_rps: float, duration_s: float, *, max_tokens: int = 16,
                 workers: int = 16, seed: int = 0) -> TtftAtRate:
    from zgtool.latency.schedule.runner import preflight
    from zgtool.latency.wire.client import Endpoint, Session

    cfg = SplitConfig(num_requests=1, concurrency=workers, warmup=0, stream=True, max_tokens=max_tokens)
    ep = Endpoint.build(target, cfg, preflight(target, cfg, None))
    local = threading.local()
    sessions: list[Session] = []
    lock = threading.Lock()

    def session() -> Session:
        s = getattr(local, "session", None)
        if s is None:
            s = local.session = Session(ep, cfg, None)
            with lock:
                sessions.append(s)
        return s

    t0 = perf_counter_ns()

    def job(i: int, scheduled_ns: int) -> tuple[int, RequestSample]:
        return scheduled_ns, session().measure(i, 0, 0, t0)

    arrivals = arrival_times_s(rate_rps, duration_s, seed)
    futures = []
    late_ms: list[float] = []
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ttft") as pool:
            for i, at_s in enumerate(arrivals):
                due = t0 + int(at_s * 1e9)
                delay = (due - perf_counter_ns()) / 1e9
                if delay > 0:
                    time.sleep(delay)
                late_ms.append(max(0.0, (perf_counter_ns() - due) / 1e6))
                futures.append(pool.submit(job, i, due))
            results = [f.result() for f in futures]
    finally:
        for s in sessions:
            s.close()
    return _summarise(target.name, rate_rps, duration_s, results, t0, late_ms)


def _summarise(path: str, rate_rps: float, duration_s: float, results: list[tuple[int, RequestSample]],
               t0: int, late_ms: list[float]) -> TtftAtRate:
    ttft: list[float] = []
    wait: list[float] = []
    errors: dict[str, int] = {}
    for scheduled_ns, s in results:
        sent_ns = t0 + int(s.start_s * 1e9)
        if s.ok and s.ttft_ms is not None:
            w = max(0.0, (sent_ns - scheduled_ns) / 1e6)
            wait.append(w)
            ttft.append(w + s.ttft_ms)
        elif not s.ok:
            key = s.error or "unknown"
            errors[key] = errors.get(key, 0) + 1
    sent = [t0 + int(s.start_s * 1e9) for _, s in results]
    span_s = (max(sent) - t0) / 1e9 if sent else 0.0
    achieved = len(results) / max(span_s, duration_s) if results else 0.0

    def p(xs: list[float], q: float) -> float | None:
        return percentile(xs, q) if xs else None

    # the client kept the rate when its scheduler handed arrivals on time (within half a mean gap)
    late = p(late_ms, 95)
    limited = late is not None and late > 0.5 * 1000.0 / rate_rps
    return TtftAtRate(path, rate_rps, duration_s, len(results), len(ttft), achieved, p(ttft, 50), p(ttft, 95),
                      p(ttft, 99), p(wait, 95), late, limited, errors)
