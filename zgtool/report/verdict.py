"""The verdict: what the gateway path costs over the direct one, per configuration and per phase.

Read from latency_split results only (the first target is the baseline, as latency-split
computes it): the median difference of each phase with its bootstrap interval, in ms and as
a % of the baseline's median total. Significance is latency-split's own ("higher", "lower",
"not significant": the interval contains 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NOT_SIGNIFICANT = "not significant"


@dataclass(frozen=True)
class PhaseTax:
    phase: str
    diff_ms: float
    lo_ms: float | None
    hi_ms: float | None
    significance: str
    pct_of_total: float | None         # % of the baseline's median total_ms


@dataclass(frozen=True)
class ConfigTax:
    label: str                         # "stream c=8"
    stream: bool
    concurrency: int
    baseline: str
    candidate: str
    baseline_total_ms: float | None    # medians
    candidate_total_ms: float | None
    tax_ms: float | None               # median difference of total_ms
    tax_lo_ms: float | None
    tax_hi_ms: float | None
    tax_pct: float | None
    significance: str
    phases: list[PhaseTax] = field(default_factory=list)   # waterfall phases, largest |diff| first
    ttft: PhaseTax | None = None
    outside_engine: PhaseTax | None = None   # tax on total - engine total: immune to engine drift


@dataclass(frozen=True)
class Verdict:
    rows: list[ConfigTax]
    headline: str


def _median(target: dict[str, Any], phase: str) -> float | None:
    p = (target.get("phases") or {}).get(phase)
    return None if not p else (p.get("summary") or {}).get("p50")


def _pct(diff: float | None, base: float | None) -> float | None:
    return None if diff is None or not base else diff / base * 100.0


def config_label(config: dict[str, Any]) -> str:
    return f"{'stream' if config.get('stream') else 'non-stream'} c={config.get('concurrency', 1)}"


def taxes(result: dict[str, Any]) -> list[ConfigTax]:
    """One ConfigTax per candidate target of one latency_split result."""
    data = result.get("data") or {}
    cfg = data.get("config") or {}
    targets = data.get("targets") or []
    if len(targets) < 2:
        return []
    base = targets[0]
    waterfall = set(data.get("waterfall_phases") or [])
    base_total = _median(base, "total_ms")
    out = []
    for cand in targets[1:]:
        diffs = [d for d in data.get("differences") or [] if d.get("candidate") == cand["name"]]
        by_phase = {d["phase"]: d for d in diffs}

        def tax(phase: str, by_phase: dict[str, Any] = by_phase) -> PhaseTax | None:
            d = by_phase.get(phase)
            if d is None or d.get("diff_ms") is None:
                return None
            return PhaseTax(phase, d["diff_ms"], d.get("lo_ms"), d.get("hi_ms"),
                            d.get("verdict") or NOT_SIGNIFICANT, _pct(d["diff_ms"], base_total))

        total = tax("total_ms")
        phases = [t for t in (tax(p) for p in by_phase if p in waterfall) if t is not None]
        phases.sort(key=lambda t: -abs(t.diff_ms))
        out.append(ConfigTax(
            label=config_label(cfg), stream=bool(cfg.get("stream")), concurrency=int(cfg.get("concurrency", 1)),
            baseline=base["name"], candidate=cand["name"], baseline_total_ms=base_total,
            candidate_total_ms=_median(cand, "total_ms"),
            tax_ms=total.diff_ms if total else None, tax_lo_ms=total.lo_ms if total else None,
            tax_hi_ms=total.hi_ms if total else None, tax_pct=total.pct_of_total if total else None,
            significance=total.significance if total else NOT_SIGNIFICANT, phases=phases,
            ttft=tax("ttft_ms") if cfg.get("stream") else None, outside_engine=tax("outside_engine_ms")))
    return out


def _fmt_ms(v: float) -> str:
    return f"{v:+.2f} ms" if abs(v) < 10 else f"{v:+.1f} ms"


def describe(row: ConfigTax) -> str:
    """One sentence with the figures, e.g. 'stack adds +3.21 ms (+1.4%) at non-stream c=1 [...]'."""
    if row.tax_ms is None:
        return f"{row.candidate} vs {row.baseline} at {row.label}: no total to compare"
    ci = (f" [95% CI {row.tax_lo_ms:+.2f}..{row.tax_hi_ms:+.2f}]"
          if row.tax_lo_ms is not None and row.tax_hi_ms is not None else "")
    pct = f" ({row.tax_pct:+.1f}%)" if row.tax_pct is not None else ""
    verb = "costs" if row.tax_ms >= 0 else "saves"
    sig = "significant" if row.significance != NOT_SIGNIFICANT else NOT_SIGNIFICANT
    top = [p for p in row.phases if p.significance != NOT_SIGNIFICANT][:2]
    where = ("; mostly " + ", ".join(f"{p.phase} {_fmt_ms(p.diff_ms)}" for p in top)) if top else ""
    out = f"{row.candidate} {verb} {_fmt_ms(row.tax_ms)}{pct} per request at {row.label}{ci}, {sig}{where}"
    oe = row.outside_engine
    if oe is not None:
        oe_ci = f" [95% CI {oe.lo_ms:+.2f}..{oe.hi_ms:+.2f}]" if oe.lo_ms is not None and oe.hi_ms is not None else ""
        oe_sig = "significant" if oe.significance != NOT_SIGNIFICANT else NOT_SIGNIFICANT
        out += f"; outside the engine {_fmt_ms(oe.diff_ms)}{oe_ci}, {oe_sig}"
    return out


def verdict(latency_results: list[dict[str, Any]]) -> Verdict | None:
    rows = [t for r in latency_results for t in taxes(r)]
    if not rows:
        return None
    # the outside-engine tax is the hop's own cost; total latency also carries the engine's
    # compute, which drifts between paths on a busy machine. Headline the former when present.
    oe_rows = [r for r in rows if r.outside_engine is not None]
    oe_sig = [r for r in oe_rows if r.outside_engine and r.outside_engine.significance != NOT_SIGNIFICANT]
    if oe_sig:
        worst_oe = max(oe_sig, key=lambda r: r.outside_engine.diff_ms if r.outside_engine else 0.0)
        return Verdict(rows, f"{describe(worst_oe)}.")
    sig = [r for r in rows if r.tax_ms is not None and r.significance != NOT_SIGNIFICANT]
    if not sig:
        headline = (f"No significant gateway tax on total latency in {len(rows)} configuration(s): "
                    "every interval contains 0.")
    else:
        worst = max(sig, key=lambda r: r.tax_pct if r.tax_pct is not None else r.tax_ms or 0.0)
        headline = f"{describe(worst)}."
    return Verdict(rows, headline)
