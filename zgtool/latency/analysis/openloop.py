"""Did the client keep its open-loop schedule? Achieved vs target rate, dispatch lag, client CPU.

A load generator that falls behind sends fewer requests than asked and measures latency from its
own late sends, so the server looks faster than it is (vLLM's benchmark achieved 183.5 of a
200 req/s target without saying so). The run is flagged `load_generator_behind` when:

- it sent slower than its own schedule: over each block, the time from the first request's due
  time to the last actual send, the sends fell short of what the schedule asked in that time by
  more than 5% (with one request of slack for the count). The schedule's own Poisson draw is not
  held against the client: the comparison is with the schedule actually drawn, which is reported
  beside the target rate;
- the dispatch lag p99 exceeded its limit: LAG_P99_LIMIT_MS, or LAG_GAP_SHARE of the schedule's mean gap
  between arrivals where that is larger. What a late send changes is the arrivals the server saw, and
  a shift that small beside the gaps leaves them the asked load: at 2 req/s a send 8 ms late (a busy
  2-core box's run queue, bench/dispatch_lag.py) is 1.6% of a 500 ms gap, while at 200 req/s 5 ms is a
  whole gap. Every latency is also reported from its due time, which counts the lag in;
- a request was due while every worker was busy (the --max-in-flight bound).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from zgtool.latency.config import SplitConfig
from zgtool.latency.records import OpenLoopSummary, RequestSample
from zgtool.latency.schedule.openloop import DispatchRecord
from zgtool.stats import percentile

RATE_KEPT_SHARE = 0.95          # achieved send rate below this share of the scheduled rate: behind
LAG_P99_LIMIT_MS = 5.0          # dispatch lag p99 above this: the latency from actual sends flatters
LAG_GAP_SHARE = 0.05            # ... or above this share of the mean gap between arrivals, where larger


def lag_limit_ms(rate_rps: float | None) -> float:
    """The dispatch lag p99 a run at `rate_rps` may have and still show the asked load."""
    if rate_rps is None or rate_rps <= 0:
        return LAG_P99_LIMIT_MS
    return max(LAG_P99_LIMIT_MS, LAG_GAP_SHARE * 1000.0 / rate_rps)


def _rates(samples: Sequence[RequestSample]) -> tuple[float | None, float | None, int]:
    """(scheduled rps, achieved rps, sends counted): each block's n requests give n - 1 intervals."""
    blocks: dict[int, list[RequestSample]] = defaultdict(list)
    for s in samples:
        if s.scheduled_s is not None:
            blocks[s.round].append(s)
    sends, sched_span, actual_span = 0, 0.0, 0.0
    for block in blocks.values():
        if len(block) < 2:
            continue
        first_due = min(s.scheduled_s for s in block if s.scheduled_s is not None)
        sends += len(block) - 1
        sched_span += max(s.scheduled_s for s in block if s.scheduled_s is not None) - first_due
        actual_span += max(s.start_s for s in block) - first_due
    scheduled = sends / sched_span if sends and sched_span > 0 else None
    achieved = sends / actual_span if sends and actual_span > 0 else None
    return scheduled, achieved, sends


def rate_kept(sends: int, scheduled_rps: float, seconds: float) -> bool:
    """Did `sends` intervals fit in `seconds` at (about) the scheduled rate? One request of slack."""
    return sends + 1 >= RATE_KEPT_SHARE * scheduled_rps * seconds


def summarize_open_loop(samples: Sequence[RequestSample], cfg: SplitConfig,
                        record: DispatchRecord | None = None) -> OpenLoopSummary:
    lags = [s.dispatch_lag_ms for s in samples if s.dispatch_lag_ms is not None]
    scheduled, achieved, sends = _rates(samples)
    waited = sum(1 for s in samples if s.waited_for_worker)
    p99 = percentile(lags, 99) if lags else None
    limit = lag_limit_ms(cfg.rate_rps if cfg.rate_rps is not None and cfg.schedule_s is None else scheduled)
    reasons = []
    if scheduled is not None and achieved is not None and not rate_kept(sends, scheduled, sends / achieved):
        asked = f" (target {cfg.rate_rps:g})" if cfg.rate_rps is not None else ""
        reasons.append(f"sent {achieved:.1f} req/s against a schedule of {scheduled:.1f} req/s{asked}: "
                       f"below {RATE_KEPT_SHARE:.0%}")
    if p99 is not None and p99 > limit:
        reasons.append(f"dispatch lag p99 {p99:.2f} ms > {limit:.3g} ms")
    if waited:
        cap = f" (max in flight {record.max_in_flight})" if record is not None else ""
        reasons.append(f"{waited} request(s) were due while every worker was busy{cap}")
    cpu_share = record.cpu_s / record.wall_s if record is not None and record.wall_s > 0 else None
    if reasons and cpu_share is not None:
        reasons.append(f"the client used {cpu_share:.0%} of a core")
    return OpenLoopSummary(
        arrivals="schedule" if cfg.schedule_s is not None else cfg.arrivals,
        target_rate_rps=cfg.rate_rps if cfg.schedule_s is None else None,
        scheduled_rate_rps=scheduled, achieved_rate_rps=achieved, requests_sent=len(lags),
        dispatch_lag_p50_ms=percentile(lags, 50) if lags else None, dispatch_lag_p99_ms=p99,
        dispatch_lag_max_ms=max(lags) if lags else None, lag_limit_ms=limit,
        waited_for_worker=waited,
        workers_max=record.workers_max if record is not None else None,
        in_flight_max=record.in_flight_max if record is not None else None,
        max_in_flight=record.max_in_flight if record is not None else None,
        client_cpu_s=record.cpu_s if record is not None else None, client_cpu_share=cpu_share,
        load_generator_behind=bool(reasons), reason="; ".join(reasons) if reasons else None)
