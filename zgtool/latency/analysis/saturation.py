"""Where a load sweep saturates (the knee) and how much earlier it does behind a gateway (capacity tax).

Pure functions on per-point figures, so the rule is tested on synthetic curves. A point is
saturated when the path stops keeping up with the load it was offered, or when its tail latency
climbs past a factor of its value at the lowest load; the first saturated point ends the curve
(later points never "recover" it). The knee is the highest load before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

RATE = "rate"                   # open loop: load = offered req/s
CONCURRENCY = "concurrency"     # closed loop: load = streams in flight
# the fewest answered requests at every load point a knee or capacity-tax statement reads, below which it
# is printed as indicative: set from bench/sweep_calibration.py (how often two identical sweeps disagree;
# on the null engine here every pair disagreed below 16 per point, and 5 in 6 still did at 32)
MIN_POINT_REQUESTS = 32


def qty(load: float, unit: str) -> str:
    """'8 req/s', '4 streams', '1 stream'."""
    return f"{load:g} {unit.removesuffix('s') if unit == 'streams' and load == 1 else unit}"


@dataclass(frozen=True)
class CurvePoint:
    """One load point of one path. `achieved_rps` None or 0: nothing was answered."""

    load: float
    achieved_rps: float | None
    latency_p99_ms: float | None      # TTFT p99 on streams, E2E p99 on whole answers
    offered_rps: float | None = None  # rate: the schedule's own rate, when it differs from `load`


@dataclass(frozen=True)
class KneeRule:
    kind: str = RATE
    shortfall: float = 0.10           # rate: saturated when achieved < (1 - shortfall) x offered
    min_gain: float = 0.5             # concurrency: saturated when more streams add < this share of
    #                                   the throughput they would add if each ran at the previous speed
    latency_factor: float = 3.0       # either: p99 latency > factor x its value at the lowest load
    latency_metric: str = "TTFT"      # the name shown in the rule (TTFT, or E2E for whole answers)

    def __post_init__(self) -> None:
        if self.kind not in (RATE, CONCURRENCY):
            raise ValueError(f"kind must be {RATE!r} or {CONCURRENCY!r}, not {self.kind!r}")
        if not 0 < self.shortfall < 1 or not 0 < self.min_gain <= 1 or not self.latency_factor > 1:
            raise ValueError("shortfall in (0, 1), min_gain in (0, 1], latency_factor > 1")

    def describe(self) -> str:
        """The rule in one sentence, printed with every sweep and written into its result."""
        if self.kind == RATE:
            first = f"answers/s < {1 - self.shortfall:.0%} of the offered rate"
        else:
            first = (f"raising the streams adds < {self.min_gain:.0%} of the throughput they would add at "
                     f"the previous point's per-stream rate")
        due = " (counted from each request's due time)" if self.kind == RATE else ""
        return (f"saturated at the first load where {first}, or {self.latency_metric} p99{due} > "
                f"{self.latency_factor:g}x its value at low load (the lower of the two lowest loads'), and at "
                "every higher load measured; the knee is the load before it")

    def public(self) -> dict[str, object]:
        return {"kind": self.kind, "shortfall": self.shortfall, "min_gain": self.min_gain,
                "latency_factor": self.latency_factor, "latency_metric": self.latency_metric,
                "text": self.describe()}


@dataclass(frozen=True)
class Saturation:
    """One path's curve judged: `knee` None with `saturated_at` set means saturated at the lowest load;
    `saturated_at` None means not saturated anywhere up to `max_load`."""

    knee: float | None
    saturated_at: float | None
    reason: str | None
    min_load: float
    max_load: float
    # the path was seen at its service rate: past the knee its answers fell short of the load (rate)
    # or stopped growing with it (concurrency), not only its tail latency climbing
    capacity_seen: bool = False

    def describe(self, unit: str) -> str:
        if self.saturated_at is None:
            return f"not saturated up to {qty(self.max_load, unit)}"
        if self.knee is None:
            return f"saturated already at the lowest load, {qty(self.saturated_at, unit)} ({self.reason})"
        return f"knee at {qty(self.knee, unit)}; saturated at {qty(self.saturated_at, unit)} ({self.reason})"


def _throughput_miss(p: CurvePoint, prev: CurvePoint | None, rule: KneeRule) -> str | None:
    """Why this point's answers show the path at its service rate, or None."""
    offered = p.offered_rps or p.load
    achieved = p.achieved_rps or 0.0      # None: nothing was answered
    if rule.kind == RATE and achieved < (1 - rule.shortfall) * offered:
        return f"answered {achieved:.3g} req/s < {1 - rule.shortfall:.0%} of {offered:.3g} offered"
    if rule.kind == CONCURRENCY and prev is not None and prev.achieved_rps and p.load > prev.load:
        ideal_gain = prev.achieved_rps * (p.load / prev.load - 1)
        gain = achieved - prev.achieved_rps
        if gain < rule.min_gain * ideal_gain:
            return (f"{prev.load:g} -> {p.load:g} streams: {prev.achieved_rps:.3g} -> {achieved:.3g} req/s, "
                    f"{max(gain, 0.0) / ideal_gain:.0%} of the proportional gain")
    return None


def _why_saturated(p: CurvePoint, prev: CurvePoint | None, low_p99: float | None, rule: KneeRule) -> str | None:
    if not p.achieved_rps:
        return "no request answered"
    miss = _throughput_miss(p, prev, rule)
    if miss is not None:
        return miss
    if low_p99 and p.latency_p99_ms is not None and p.latency_p99_ms > rule.latency_factor * low_p99:
        return (f"{rule.latency_metric} p99 {p.latency_p99_ms:.3g} ms > {rule.latency_factor:g}x "
                f"{low_p99:.3g} ms at low load")
    return None


def detect(points: Sequence[CurvePoint], rule: KneeRule) -> Saturation:
    """The knee of one path's curve; points in any order (sorted by load here).

    Saturation starts at the first point that, with every point above it, meets the rule: a higher
    load that kept up shows an earlier miss was noise (one slow block, a p99 of a few requests),
    not the path's capacity. The highest point is judged on its own."""
    pts = sorted(points, key=lambda p: p.load)
    if not pts:
        raise ValueError("no load points")
    # the reference tail: the lower p99 of the two lowest loads, so one slow block there does not
    # blind the rule (a p99 of a few dozen requests is nearly their maximum)
    low = [p.latency_p99_ms for p in pts if p.latency_p99_ms is not None and p.achieved_rps][:2]
    low_p99 = min(low) if low else None
    why = [_why_saturated(p, pts[i - 1] if i else None, low_p99, rule) for i, p in enumerate(pts)]
    first = len(pts)
    while first > 0 and why[first - 1] is not None:
        first -= 1
    if first == len(pts):
        return Saturation(None, None, None, pts[0].load, pts[-1].load)
    knee = pts[first - 1].load if first else None
    seen = any(p.achieved_rps and _throughput_miss(p, pts[i - 1] if i else None, rule) is not None
               for i, p in enumerate(pts) if i >= first)
    return Saturation(knee, pts[first].load, why[first], pts[0].load, pts[-1].load, seen)


@dataclass(frozen=True)
class CapacityTax:
    """How much earlier a candidate path (behind a gateway) saturates than the baseline, in %.

    bound: "exact" (both knees on the measured grid), "at least" / "at most" (one side's capacity
    is only bounded), or None with tax_pct None (no figure: neither saturated, or both at the lowest)."""

    baseline: str
    candidate: str
    baseline_knee: float | None
    candidate_knee: float | None
    tax_pct: float | None
    bound: str | None
    text: str
    # finer than the load grid: the most each path answered per second, where both were driven past
    # their knee (what a saturated path answers is its capacity)
    baseline_peak_rps: float | None = None
    candidate_peak_rps: float | None = None
    peak_tax_pct: float | None = None
    # a load point it reads answered fewer than MIN_POINT_REQUESTS: the statement may flip on a rerun
    indicative: bool = False


def thin(fewest_ok: int | None) -> str | None:
    """Why a statement read from load points of at most `fewest_ok` answers is only indicative, or None."""
    if fewest_ok is None or fewest_ok >= MIN_POINT_REQUESTS:
        return None
    return (f"indicative: {fewest_ok} answered requests at a load point, a firm statement needs "
            f"{MIN_POINT_REQUESTS} (-n {MIN_POINT_REQUESTS})")


def mark_indicative(tax: CapacityTax, fewest_ok: int | None) -> CapacityTax:
    """The capacity tax prefixed "indicative: ..." where a point either path's statement reads was thin."""
    why = thin(fewest_ok)
    return tax if why is None else dataclasses.replace(tax, indicative=True, text=f"{why}; {tax.text}")


def with_peaks(tax: CapacityTax, base: Saturation, cand: Saturation, base_peak_rps: float | None,
               cand_peak_rps: float | None) -> CapacityTax:
    """The capacity tax with each path's peak answered rate. A peak is the path's capacity only where
    its answers were seen falling behind (capacity_seen); otherwise it is a lower bound, and the peak
    tax becomes a bound ("at most" when only the candidate's peak is a lower bound, "at least" when
    only the baseline's is) or is left out (both)."""
    peaks = dataclasses.replace(tax, baseline_peak_rps=base_peak_rps, candidate_peak_rps=cand_peak_rps)
    if not base_peak_rps or cand_peak_rps is None or not (base.capacity_seen or cand.capacity_seen):
        return peaks
    t = 100.0 * (1.0 - cand_peak_rps / base_peak_rps)
    if base.capacity_seen and cand.capacity_seen:
        said = f"{abs(t):.0f}% {'less' if t >= 0 else 'more'}"
    elif base.capacity_seen and t > 0:
        said = f"at most {t:.0f}% less ({tax.candidate} was not driven to its service rate)"
    elif cand.capacity_seen and t > 0:
        said = f"at least {t:.0f}% less ({tax.baseline} was not driven to its service rate)"
    else:
        return peaks
    return dataclasses.replace(peaks, peak_tax_pct=t,
                               text=f"{tax.text}; peak answered {cand_peak_rps:.3g} vs {base_peak_rps:.3g} req/s: "
                                    f"{said}")


def _estimate(s: Saturation) -> tuple[float | None, str]:
    """The path's capacity on the load grid and what it is: "knee" (last sustained load), "at least"
    (never saturated: its highest load) or "below" (saturated at the lowest load)."""
    if s.saturated_at is None:
        return s.max_load, "at least"
    if s.knee is None:
        return s.saturated_at, "below"
    return s.knee, "knee"


def capacity_tax(baseline: str, base: Saturation, candidate: str, cand: Saturation, unit: str) -> CapacityTax:
    """100 x (1 - candidate knee / baseline knee); where one capacity is only bounded, the bound that holds."""
    (b, b_kind), (c, c_kind) = _estimate(base), _estimate(cand)
    assert b is not None and c is not None
    t = 100.0 * (1.0 - c / b)

    def out(tax: float | None, bound: str | None, text: str) -> CapacityTax:
        return CapacityTax(baseline, candidate, base.knee, cand.knee, tax, bound, text)

    if b_kind == "knee" and c_kind == "knee":
        more = (f" ({candidate} held more than {baseline}: a cache in the path, or load that is not the "
                "same on both)") if t < 0 else ""
        return out(t, "exact", f"knee at {qty(b, unit)} {baseline} vs {qty(c, unit)} {candidate}: "
                               f"capacity tax {t:.0f}%{more}")
    if b_kind == "at least" and c_kind in ("knee", "below") and t > 0:
        held = f"knee at {qty(c, unit)}" if c_kind == "knee" else f"saturated already at {qty(c, unit)}"
        return out(t, "at least", f"{held} {candidate} while {baseline} held {qty(b, unit)} "
                                  f"unsaturated: capacity tax at least {t:.0f}%")
    if b_kind == "knee" and c_kind == "below":
        return out(t, "at least", f"{candidate} saturated already at {qty(c, unit)}, {baseline}'s knee at "
                                  f"{qty(b, unit)}: capacity tax more than {t:.0f}%")
    if b_kind == "knee" and c_kind == "at least":
        if t <= 0:
            return out(0.0, "at most", f"{candidate} held {qty(c, unit)} unsaturated, at or past {baseline}'s "
                                       f"knee at {qty(b, unit)}: no capacity tax")
        return out(t, "at most", f"{candidate} held {qty(c, unit)} unsaturated, {baseline}'s knee at "
                                 f"{qty(b, unit)}: capacity tax at most {t:.0f}%")
    if b_kind == "at least" and c_kind == "at least":
        return out(None, None, f"{candidate} vs {baseline}: neither saturated up to {qty(min(b, c), unit)}, "
                               "so no capacity tax")
    return out(None, None, f"{candidate} vs {baseline}: no capacity tax ({baseline}: {base.describe(unit)}; "
                           f"{candidate}: {cand.describe(unit)})")
