"""Load sweeps on latency-split: one measurement per load point (every path, alternating, at that
load), summarised per (path, load), then judged for a knee (zgtool.latency.analysis.saturation).

-c 1,4,16 runs closed-loop points (c streams each); --rate 1,2,4 runs open-loop points at each
offered rate; --rate sweep starts at one stream's own rate (1 / the c=1 mean E2E on the baseline)
and doubles until every path saturated, at most MAX_POINTS points and about MAX_SWEEP_S seconds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zgtool.errors import UsageError
from zgtool.latency.analysis.saturation import (
    CONCURRENCY,
    MIN_POINT_REQUESTS,
    RATE,
    CapacityTax,
    CurvePoint,
    KneeRule,
    Saturation,
    capacity_tax,
    detect,
    mark_indicative,
    qty,
    thin,
    with_peaks,
)
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.stats import summarize
from zgtool.targets import Target

if TYPE_CHECKING:
    from zgtool.latency.schedule.openloop import DispatchRecord

MAX_POINTS = 8              # --rate sweep: at most this many doublings
MAX_SWEEP_S = 600.0         # --rate sweep: no new point starts after this long
MAX_LIST_POINTS = 32        # an explicit list longer than this is a mistake, not a sweep
CALIBRATION_REQUESTS = 10   # --rate sweep: c=1 requests on the baseline to find one stream's rate
UNITS = {RATE: "req/s", CONCURRENCY: "streams"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepSpec:
    kind: str                         # RATE | CONCURRENCY
    loads: tuple[float, ...] = ()     # ascending; empty with auto
    auto: bool = False                # --rate sweep: from one stream's rate, doubling
    max_points: int = MAX_POINTS
    max_duration_s: float = MAX_SWEEP_S

    def __post_init__(self) -> None:
        if self.kind not in UNITS:
            raise ValueError(f"unknown sweep kind {self.kind!r}")
        if self.auto == bool(self.loads):
            raise ValueError("a sweep has either explicit loads or auto, not both")

    @property
    def unit(self) -> str:
        return UNITS[self.kind]


def _numbers(option: str, text: str, integer: bool) -> list[float]:
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not integer:
            part = part.removesuffix("rps").removesuffix("/s")
        try:
            v = float(int(part)) if integer else float(part)
        except ValueError:
            what = "a whole number" if integer else "a number"
            raise UsageError(f"{option} {text}: {part!r} is not {what}") from None
        if not (0 < v < float("inf")):
            raise UsageError(f"{option} {text}: every load must be positive, not {part}")
        out.append(v)
    if len(set(out)) != len(out):
        raise UsageError(f"{option} {text}: a load is listed twice")
    if len(out) > MAX_LIST_POINTS:
        raise UsageError(f"{option} {text}: {len(out)} points; at most {MAX_LIST_POINTS}")
    return sorted(out)


def parse_load(concurrency: str | int, rate: str | None) -> tuple[int, str | None, SweepSpec | None]:
    """-c and --rate as typed -> (single concurrency, single rate as typed or None, sweep or None).

    `-c 4` and `--rate 2` stay single measurements; a comma list (or `--rate sweep`) is a sweep.
    Only one of the two may be a list: a sweep has one load axis."""
    c_text = str(concurrency).strip()
    c_list = _numbers("-c", c_text, integer=True)
    r_text = None if rate is None else str(rate).strip()
    auto = r_text is not None and r_text.lower() == "sweep"
    r_list = _numbers("--rate", r_text, integer=False) if r_text is not None and "," in r_text else []
    if (auto or r_list) and c_list != [1]:
        if len(c_list) > 1:
            raise UsageError(f"--rate {r_text} and -c {c_text}: sweep one load axis at a time")
        raise UsageError(f"--rate {r_text} with -c {c_text}: a rate sweep is open loop; the requests in flight "
                         "are capped by --max-in-flight, not -c")
    if auto:
        return 1, None, SweepSpec(RATE, auto=True)
    if r_list:
        return 1, None, SweepSpec(RATE, tuple(r_list))
    if len(c_list) > 1:
        if r_text is not None:
            raise UsageError(f"-c {c_text} with --rate {r_text}: a rate is open loop, -c sets closed-loop "
                             "streams; sweep one of them")
        return int(c_list[0]), None, SweepSpec(CONCURRENCY, tuple(c_list))
    return int(c_list[0]), r_text, None        # one rate: checked by zgtool.latency.schedule.arrivals.parse_rate


@dataclass
class PointSummary:
    """One path at one load point."""

    target: str
    load: float                        # req/s offered (rate) or streams (concurrency)
    num_ok: int
    num_error: int
    errors: dict[str, int]
    achieved_rps: float | None         # answers per second (definitions: achieved_rps)
    offered_rps: float | None          # rate: the schedule actually drawn; concurrency: None
    goodput_rps: float | None
    duration_s: float
    ttft_ms: dict[str, float]          # summarize(): count, mean, p50, p99, ...
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    sent_rps: float | None = None      # rate: what the client actually sent (behind: below offered)
    dispatch_lag_p99_ms: float | None = None
    client_behind: str | None = None   # the load generator's own flag (rate, dispatch lag, pool): why
    rate_short: bool = False           # it sent under RATE_KEPT_SHARE of the offered rate
    # rate: latency counted from each request's due time (what a user arriving on schedule saw; a
    # queue that delays the sends still counts), beside ttft_ms/e2e_ms counted from the actual send
    ttft_from_due_ms: dict[str, float] = field(default_factory=dict)
    e2e_from_due_ms: dict[str, float] = field(default_factory=dict)

    def latency(self, stream: bool) -> dict[str, float]:
        """The latency the knee rule reads: TTFT on streams, else E2E; from the due time when open loop."""
        if self.e2e_from_due_ms:
            return self.ttft_from_due_ms if stream else self.e2e_from_due_ms
        return self.ttft_ms if stream else self.e2e_ms

    def curve_point(self, stream: bool) -> CurvePoint:
        return CurvePoint(self.load, self.achieved_rps if self.num_ok else None, self.latency(stream).get("p99"),
                          self.offered_rps)


@dataclass
class SweepResult:
    kind: str
    unit: str
    targets: list[str]
    rule: KneeRule
    config: dict[str, Any]
    points: list[PointSummary] = field(default_factory=list)
    saturation: dict[str, Saturation] = field(default_factory=dict)
    capacity_tax: list[CapacityTax] = field(default_factory=list)
    calibration: dict[str, float] | None = None    # --rate sweep: one stream's measured rate
    stopped: str | None = None                     # why an automatic sweep ended
    notes: list[str] = field(default_factory=list)
    fewest_ok: dict[str, int | None] = field(default_factory=dict)   # per path: fewest_answered()

    def of(self, target: str) -> list[PointSummary]:
        return sorted((p for p in self.points if p.target == target), key=lambda p: p.load)

    def fewest_answered(self, target: str) -> int | None:
        """The fewest answers at a load point the path's statement reads: every point up to the first
        saturated one (a point where nothing answered is saturated whatever -n was; it does not count)."""
        s = self.saturation.get(target)
        limit = s.saturated_at if s is not None and s.saturated_at is not None else float("inf")
        counts = [p.num_ok for p in self.of(target) if p.load <= limit and p.num_ok]
        return min(counts) if counts else None

    def peak_rps(self, target: str) -> float | None:
        """The most this path answered per second at any load point."""
        rates = [p.achieved_rps for p in self.of(target) if p.achieved_rps is not None]
        return max(rates) if rates else None


def answered_rps(samples: Sequence[RequestSample]) -> float | None:
    """Open loop: the rate the answers kept. Per block, from its first quarter of requests to its last
    (medians of each): the requests between them over the schedule's time between them, stretched by
    how much later than due the answers came (lateness) at the end than at the start. A path that
    keeps up answers at the schedule's rate whatever its latency (lateness stays flat); a saturated
    one falls further behind with every request, at its service rate. The medians keep one slow
    answer from reading as a queue. None with fewer than two answers in every block."""
    blocks: dict[int, list[RequestSample]] = defaultdict(list)
    for s in samples:
        if s.ok and s.total_from_scheduled_ms is not None and s.scheduled_s is not None:
            blocks[s.round].append(s)
    intervals, span = 0, 0.0
    for block in blocks.values():
        if len(block) < 2:
            continue
        block.sort(key=lambda s: s.scheduled_s or 0.0)
        late = [(s.total_from_scheduled_ms or 0.0) / 1000.0 for s in block]
        due = [s.scheduled_s or 0.0 for s in block]
        q = max(1, len(block) // 4)
        med = statistics.median
        intervals += len(block) - q          # between the two quarters' middle requests
        span += max(med(due[-q:]) - med(due[:q]) + med(late[-q:]) - med(late[:q]), 1e-9)
    return intervals / span if intervals and span > 0 else None


def _stats(values: list[float]) -> dict[str, float]:
    s = summarize(values)
    return {k: v for k, v in s.items() if k in ("count", "mean", "p50", "p90", "p99", "max")}


def summarize_point(target: str, load: float, samples: Sequence[RequestSample], cfg: SplitConfig,
                    kind: str, record: DispatchRecord | None = None) -> PointSummary:
    from zgtool.latency.analysis.phases import throughput

    ok = [s for s in samples if s.ok]
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error or "unknown"] = errors.get(s.error or "unknown", 0) + 1
    tp = throughput(samples, cfg.slo, cfg.stream)
    point = PointSummary(
        target=target, load=load, num_ok=len(ok), num_error=len(samples) - len(ok), errors=errors,
        achieved_rps=tp.request_rps, offered_rps=None, goodput_rps=tp.goodput_rps, duration_s=tp.duration_s,
        ttft_ms=_stats([s.ttft_ms for s in ok if s.ttft_ms is not None]) if cfg.stream else {},
        itl_ms=_stats([g for s in ok for g in s.itl_ms]) if cfg.stream else {},
        e2e_ms=_stats([s.total_ms for s in ok if s.total_ms is not None]))
    if kind == RATE:
        from zgtool.latency.analysis.openloop import RATE_KEPT_SHARE, summarize_open_loop

        ol = summarize_open_loop(samples, cfg, record)
        point.achieved_rps = answered_rps(samples)
        point.offered_rps = ol.scheduled_rate_rps or load
        point.sent_rps = ol.achieved_rate_rps
        point.dispatch_lag_p99_ms = ol.dispatch_lag_p99_ms
        point.client_behind = ol.reason if ol.load_generator_behind else None
        point.rate_short = bool(point.sent_rps and point.sent_rps < RATE_KEPT_SHARE * point.offered_rps)
        if cfg.stream:
            point.ttft_from_due_ms = _stats([s.ttft_from_scheduled_ms for s in ok
                                             if s.ttft_from_scheduled_ms is not None])
        point.e2e_from_due_ms = _stats([s.total_from_scheduled_ms for s in ok if s.total_from_scheduled_ms is not None])
        if cfg.slo is not None and ok and point.achieved_rps is not None:
            # the SLO as a user arriving on schedule met it, at the rate the answers came
            good = sum(1 for s in ok if cfg.slo.met_by(ttft_ms=s.ttft_from_scheduled_ms, tpot_ms=s.tpot_ms,
                                                       e2e_ms=s.total_from_scheduled_ms, stream=cfg.stream))
            point.goodput_rps = point.achieved_rps * good / len(ok)
    return point


def point_config(cfg: SplitConfig, kind: str, load: float) -> SplitConfig:
    """The measurement of one load point. Closed loop: at least 2 requests per stream, in blocks of
    at least 4 per stream where -n allows (so all c streams are busy most of each block). Open loop:
    one block per path (--rounds to split it) of at least --point-s (5 s) of sends, more than -n at
    high rates: a short burst fits in a batching engine's running batch and never shows its queue."""
    if kind == CONCURRENCY:
        c = int(load)
        n = max(cfg.num_requests, 2 * c)
        rounds = cfg.rounds or max(1, min(16, n // (4 * c)))
        return dataclasses.replace(cfg, concurrency=c, num_requests=n, rounds=rounds)
    n = max(cfg.num_requests, math.ceil(load * cfg.sweep_point_s))
    return dataclasses.replace(cfg, concurrency=1, rate_rps=load, num_requests=n, rounds=cfg.rounds or 1)


def knee_rule(kind: str, stream: bool) -> KneeRule:
    return KneeRule(kind=kind, latency_metric="TTFT" if stream else "E2E")


def judge(res: SweepResult, stream: bool) -> None:
    """Saturation per path and the capacity tax of every other path against the first."""
    res.saturation = {}
    for name in res.targets:
        pts = [p.curve_point(stream) for p in res.of(name)]
        if pts:
            res.saturation[name] = detect(pts, res.rule)
    base = res.targets[0]
    res.fewest_ok = {name: res.fewest_answered(name) for name in res.saturation}
    res.capacity_tax = [
        mark_indicative(with_peaks(capacity_tax(base, res.saturation[base], name, res.saturation[name], res.unit),
                                   res.saturation[base], res.saturation[name], res.peak_rps(base), res.peak_rps(name)),
                        min((n for n in (res.fewest_ok[base], res.fewest_ok[name]) if n is not None), default=None))
        for name in res.targets[1:] if base in res.saturation and name in res.saturation]


def _measure_point(targets: Sequence[Target], cfg: SplitConfig, kind: str, load: float) -> list[PointSummary]:
    from zgtool.latency.schedule.openloop import OpenLoopLog
    from zgtool.latency.schedule.runner import measure_targets

    pcfg = point_config(cfg, kind, load)
    log = OpenLoopLog() if pcfg.open_loop else None
    samples = measure_targets(targets, pcfg, open_loop=log)
    return [summarize_point(t.name, load, s, pcfg, kind, log.records.get(t.name) if log else None)
            for t, s in zip(targets, samples, strict=True)]


def one_stream_rps(baseline: Target, cfg: SplitConfig) -> dict[str, float]:
    """--rate sweep's start: 1 / the mean E2E of c=1 requests on the baseline."""
    from zgtool.errors import VerdictFailed
    from zgtool.latency.schedule.runner import measure_targets

    ccfg = dataclasses.replace(cfg, concurrency=1, num_requests=min(cfg.num_requests, CALIBRATION_REQUESTS),
                               rounds=1)
    samples = measure_targets([baseline], ccfg)[0]
    totals = [s.total_ms for s in samples if s.ok and s.total_ms]
    if not totals:
        raise VerdictFailed(f"{baseline.name}: none of {len(samples)} c=1 requests answered; no rate to start "
                            "the sweep from")
    mean_ms = sum(totals) / len(totals)
    return {"requests": float(len(totals)), "mean_e2e_ms": mean_ms, "one_stream_rps": 1000.0 / mean_ms}


def _round_rate(r: float) -> float:
    return float(f"{r:.3g}")


def run_sweep(targets: Sequence[Target], cfg: SplitConfig, spec: SweepSpec,
              progress: Progress | None = None) -> SweepResult:
    res = SweepResult(kind=spec.kind, unit=spec.unit, targets=[t.name for t in targets],
                      rule=knee_rule(spec.kind, cfg.stream), config=cfg.public())
    if spec.kind == RATE:   # each point's rate is its load
        res.config["open_loop"] = {"rate_rps": None, "arrivals": cfg.arrivals,
                                   "max_in_flight": cfg.max_in_flight or None}

    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    if not spec.auto:
        for load in spec.loads:
            say(f"load {qty(load, spec.unit)}: measuring {', '.join(t.name for t in targets)}")
            res.points.extend(_measure_point(targets, cfg, spec.kind, load))
        judge(res, cfg.stream)
        return res
    t0 = time.monotonic()
    res.calibration = one_stream_rps(targets[0], cfg)
    rate = _round_rate(res.calibration["one_stream_rps"])
    say(f"one stream on {targets[0].name}: {res.calibration['mean_e2e_ms']:.1f} ms mean E2E -> starting at "
        f"{rate:g} req/s")
    active = list(targets)
    for i in range(spec.max_points):
        say(f"load {rate:g} req/s: measuring {', '.join(t.name for t in active)}")
        pts = _measure_point(active, cfg, spec.kind, rate)
        res.points.extend(pts)
        judge(res, cfg.stream)
        active = [t for t in active if res.saturation[t.name].saturated_at is None]
        behind = [p for p in pts if p.rate_short and p.target in {t.name for t in active}]
        if behind:
            res.stopped = (f"the client could not keep {rate:g} req/s ({behind[0].client_behind}); higher rates "
                           "would measure the client, not the paths")
            break
        if not active:
            res.stopped = f"every path saturated by {rate:g} req/s"
            break
        if i == spec.max_points - 1:
            res.stopped = (f"{spec.max_points} points (the cap); not saturated at {rate:g} req/s: "
                           f"{', '.join(t.name for t in active)}")
            break
        if time.monotonic() - t0 > spec.max_duration_s:
            res.stopped = f"the time cap ({spec.max_duration_s:g} s) after {rate:g} req/s"
            break
        rate = _round_rate(rate * 2)
    return res


def result_data(res: SweepResult) -> dict[str, Any]:
    """The `data` of a latency_sweep result."""
    from zgtool.results import to_jsonable

    return {
        "load_kind": res.kind, "unit": res.unit, "targets": res.targets, "config": res.config,
        "rule": res.rule.public(), "calibration": res.calibration, "stopped": res.stopped, "notes": res.notes,
        "points": to_jsonable(res.points),
        "saturation": {name: {**to_jsonable(s), "text": s.describe(res.unit)} for name, s in res.saturation.items()},
        "capacity_tax": to_jsonable(res.capacity_tax),
        # flat figures for `zgtool gate` rules: knee.direct, capacity_tax_pct.nginx
        "knee": {name: s.knee for name, s in res.saturation.items()},
        "capacity_tax_pct": {t.candidate: t.tax_pct for t in res.capacity_tax},
        "peak_tax_pct": {t.candidate: t.peak_tax_pct for t in res.capacity_tax},
        # below MIN_POINT_REQUESTS answers at a point the statement reads, it is indicative
        "fewest_ok_per_point": res.fewest_ok, "min_point_requests": MIN_POINT_REQUESTS,
        "indicative": {name: thin(n) is not None for name, n in res.fewest_ok.items()},
        "definitions": {
            "achieved_rps": "closed loop (-c): ok answers / the measured wall time (vLLM request_throughput); "
                            "open loop (--rate): per block, the requests between its first and last quarter "
                            "over the schedule's time between them (medians), stretched by the growth of the "
                            "answers' lateness (answer time - due time) between them: the schedule's rate "
                            "while the path keeps up, its service rate once it falls behind",
            "offered_rps": "open loop: the rate of the send schedule actually drawn (Poisson draws vary)",
            "sent_rps": "open loop: the rate the client actually sent; rate_short: under 95% of offered_rps",
            "ttft_from_due_ms/e2e_from_due_ms": "open loop: latency counted from each request's due time (a "
                                                "send delayed by a queue still counts); the knee rule reads "
                                                "these",
            "goodput_rps": "closed loop: ok answers meeting every --slo per second of the measured wall time; "
                           "open loop: achieved_rps x the share of ok answers meeting it, TTFT/E2E counted from "
                           "each request's due time",
            "ttft_ms/itl_ms/e2e_ms": "per point: count, mean, p50, p90, p99, max of the ok requests",
        },
    }
