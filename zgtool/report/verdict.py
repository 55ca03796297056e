"""The verdict: what the gateway path costs over the direct one, per configuration, in words the
statistics support.

Read from latency_split results only (the first target is the baseline): the median difference
of each phase with its bootstrap interval, in ms and as a % of the baseline's median total.

Wording rules (issue 14):
- lead with the tax outside the engine (total minus the engine's Server-Timing total): it is the
  hop's own cost, immune to the engine's compute drifting between paths;
- a difference whose interval contains 0 is "no significant difference", never a cost or saving;
- a faster path "is faster by X ms", never "saves -X ms";
- the engine's phases (queue, prefill, decode, ...) are never billed to the gateway: when they
  differ between paths on one host that is CPU contention, said so with the gateway's CPU time;
- a negative outside-engine figure is missing attribution (a hop hid or renamed the engine's
  Server-Timing), never a finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NOT_SIGNIFICANT = "not significant"
HIGHER = "higher"
LOWER = "lower"
ENGINE_PHASES = ("queue_ms", "prefill_ms", "decode_ms", "detok_ms", "safety_ms", "engine_other_ms")
ENGINE_PROCESS = "engine"


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
    attribution_missing: bool = False        # the engine's timing did not reach the client on a path
    gateway_cpu_ms: float | None = None      # CPU ms per request of the gateway's local processes
    engine_cpu_ms: dict[str, float] | None = None   # path -> engine CPU ms per request
    indicative: bool = False                 # --quick sample sizes
    requests: int | None = None              # per path
    engine_source: str | None = None         # where the engine's own time came from (join's engine_sources)


@dataclass(frozen=True)
class Verdict:
    rows: list[ConfigTax]
    headline: str
    indicative: bool = False


def _median(target: dict[str, Any], phase: str) -> float | None:
    p = (target.get("phases") or {}).get(phase)
    return None if not p else (p.get("summary") or {}).get("p50")


def _pct(diff: float | None, base: float | None) -> float | None:
    return None if diff is None or not base else diff / base * 100.0


def config_label(config: dict[str, Any]) -> str:
    return f"{'stream' if config.get('stream') else 'non-stream'} c={config.get('concurrency', 1)}"


def _cpu(base: dict[str, Any], cand: dict[str, Any]) -> tuple[float | None, dict[str, float] | None]:
    """(gateway CPU ms per request, engine CPU ms per request per path) from the targets' CPU reads.

    The gateway's figure is its processes' CPU during the candidate's blocks less what the same
    processes used while the baseline ran (idle work: timers, health checks)."""
    bc, cc = base.get("cpu_ms_per_request"), cand.get("cpu_ms_per_request")
    if not cc:
        return None, None
    bc = bc or {}
    gw = [name for name in cc if name != ENGINE_PROCESS]
    gateway = max(0.0, sum(cc[n] for n in gw) - sum(bc.get(n, 0.0) for n in gw)) if gw else None
    engine = {path: c[ENGINE_PROCESS] for path, c in ((base["name"], bc), (cand["name"], cc))
              if ENGINE_PROCESS in c}
    return gateway, engine or None


def _engine_timing_missing(data: dict[str, Any], name: str) -> bool:
    return any(note.startswith(f"{name}:") and "not attributed" in note or
               note.startswith(f"{name}:") and "attribution is missing" in note
               for note in data.get("attribution_notes") or [])


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
        oe = tax("outside_engine_ms")
        missing = (_engine_timing_missing(data, cand["name"]) or _engine_timing_missing(data, base["name"])
                   or (oe is not None and oe.significance == LOWER))
        gw_cpu, engine_cpu = _cpu(base, cand)
        out.append(ConfigTax(
            label=config_label(cfg), stream=bool(cfg.get("stream")), concurrency=int(cfg.get("concurrency", 1)),
            baseline=base["name"], candidate=cand["name"], baseline_total_ms=base_total,
            candidate_total_ms=_median(cand, "total_ms"),
            tax_ms=total.diff_ms if total else None, tax_lo_ms=total.lo_ms if total else None,
            tax_hi_ms=total.hi_ms if total else None, tax_pct=total.pct_of_total if total else None,
            significance=total.significance if total else NOT_SIGNIFICANT, phases=phases,
            ttft=tax("ttft_ms") if cfg.get("stream") else None, outside_engine=None if missing else oe,
            attribution_missing=missing, gateway_cpu_ms=gw_cpu, engine_cpu_ms=engine_cpu,
            indicative=bool(cfg.get("quick")), requests=cfg.get("num_requests"),
            engine_source=_engine_source(data, base["name"], cand["name"])))
    return out


def _engine_source(data: dict[str, Any], *names: str) -> str | None:
    """The adapters that gave the engine's time on these paths ("vLLM OTLP span", "Server-Timing", ...)."""
    paths = (data.get("join") or {}).get("paths") or {}
    found = dict.fromkeys(s for n in names for s in ((paths.get(n) or {}).get("engine_sources") or {}))
    return " + ".join(found) or None


def _ms(v: float) -> str:
    """A magnitude: the sentence's verb carries the direction."""
    v = abs(v)
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def _signed(v: float) -> str:
    return f"{v:+.2f}" if abs(v) < 10 else f"{v:+.1f}"


def _ci(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "no interval"
    d = 2 if max(abs(lo), abs(hi)) < 10 else 1      # one precision for both bounds
    return f"95% CI {lo:+.{d}f}..{hi:+.{d}f} ms"


def _pct_txt(p: float | None) -> str:
    return f" ({abs(p):.1f}% of direct)" if p is not None else ""


def significant(p: PhaseTax | None) -> bool:
    return p is not None and p.significance != NOT_SIGNIFICANT


def outside_sentence(row: ConfigTax) -> str | None:
    """What the path adds outside the engine, or why that cannot be said."""
    if row.attribution_missing:
        return (f"time outside the engine on {row.candidate} at {row.label} is not attributed: the engine's "
                "own timing (Server-Timing or any engine adapter) did not reach the client intact on one path "
                "(attribution missing)")
    oe = row.outside_engine
    if oe is None:
        return None
    src = f"; engine time from {row.engine_source}" if row.engine_source else ""
    if oe.significance == HIGHER:
        return (f"{row.candidate} adds {_ms(oe.diff_ms)}{_pct_txt(oe.pct_of_total)} per request outside the "
                f"engine at {row.label} ({_ci(oe.lo_ms, oe.hi_ms)}{src})")
    return (f"no significant difference outside the engine between {row.candidate} and {row.baseline} at "
            f"{row.label} ({_signed(oe.diff_ms)} ms, {_ci(oe.lo_ms, oe.hi_ms)}{src})")


def total_sentence(row: ConfigTax) -> str:
    if row.tax_ms is None:
        return f"{row.candidate} vs {row.baseline} at {row.label}: no total to compare"
    ci = _ci(row.tax_lo_ms, row.tax_hi_ms)
    if row.significance == HIGHER:
        return (f"{row.candidate} is slower by {_ms(row.tax_ms)}{_pct_txt(row.tax_pct)} in total at "
                f"{row.label} ({ci})")
    if row.significance == LOWER:
        return (f"{row.candidate} is faster by {_ms(row.tax_ms)}{_pct_txt(row.tax_pct)} in total at "
                f"{row.label} ({ci})")
    return (f"no significant difference in total latency between {row.candidate} and {row.baseline} at "
            f"{row.label} ({_signed(row.tax_ms)} ms, {ci})")


def engine_phases(row: ConfigTax) -> list[PhaseTax]:
    """The engine's own phases that differ significantly between the paths."""
    return [p for p in row.phases if p.phase in ENGINE_PHASES and significant(p)]


def gateway_phases(row: ConfigTax) -> list[PhaseTax]:
    """Significant, positive non-engine phases: where the gateway's own time goes."""
    return [p for p in row.phases if p.phase not in ENGINE_PHASES and significant(p) and p.diff_ms > 0]


def engine_sentence(row: ConfigTax) -> str | None:
    """Engine phases that moved between paths are contention on a shared host, not the hop."""
    slower = [p for p in engine_phases(row) if p.diff_ms > 0]
    if not slower:
        return None
    what = ", ".join(f"{p.phase.removesuffix('_ms')} {_signed(p.diff_ms)} ms" for p in slower[:3])
    out = (f"the engine's own phases ran slower on the {row.candidate} path ({what}): CPU contention on a "
           "shared host, not gateway latency")
    if row.gateway_cpu_ms is not None and row.gateway_cpu_ms > 0:
        out += f"; the gateway stole {row.gateway_cpu_ms:.2f} ms of CPU per request from a CPU-bound engine"
    return out


def describe(row: ConfigTax) -> str:
    """The row in sentences, outside-engine tax first, e.g. 'stack adds 1.30 ms (0.6% of direct)
    per request outside the engine at non-stream c=1 (95% CI +0.80..+1.90 ms); no significant
    difference in total latency between stack and direct at non-stream c=1 (...)'."""
    parts = [outside_sentence(row), total_sentence(row), engine_sentence(row)]
    out = "; ".join(p for p in parts if p)
    if row.indicative:
        out += f" [indicative: --quick, {row.requests} requests per path]"
    return out


def verdict(latency_results: list[dict[str, Any]]) -> Verdict | None:
    rows = [t for r in latency_results for t in taxes(r)]
    if not rows:
        return None
    indicative = any(r.indicative for r in rows)
    prefix = "Indicative (--quick sample sizes): " if indicative else ""
    oe_sig = [r for r in rows if r.outside_engine is not None and r.outside_engine.significance == HIGHER]
    if oe_sig:
        worst = max(oe_sig, key=lambda r: r.outside_engine.diff_ms if r.outside_engine else 0.0)
        return Verdict(rows, prefix + _capital(_strip_tag(describe(worst))) + ".", indicative)
    sig = [r for r in rows if r.tax_ms is not None and r.significance != NOT_SIGNIFICANT]
    missing = [r for r in rows if r.attribution_missing]
    if sig:
        worst = max(sig, key=lambda r: abs(r.tax_pct) if r.tax_pct is not None else abs(r.tax_ms or 0.0))
        headline = _capital(_strip_tag(describe(worst))) + "."
    elif missing:
        headline = (f"Time outside the engine is not attributed in {len(missing)} configuration(s) (the engine's "
                    "Server-Timing did not reach the client); no significant difference in total latency in "
                    f"{len(rows)} configuration(s): every interval contains 0.")
    else:
        oe_rows = [r for r in rows if r.outside_engine is not None]
        where = " or outside the engine" if oe_rows and len(oe_rows) == len(rows) else ""
        headline = (f"No significant difference in total latency{where} in {len(rows)} configuration(s): "
                    "every interval contains 0.")
    return Verdict(rows, prefix + headline, indicative)


def _strip_tag(text: str) -> str:
    i = text.find(" [indicative:")
    return text if i < 0 else text[:i]


def _capital(text: str) -> str:
    """Capitalise a sentence that starts with a word, not with a path's name."""
    if text.startswith(("no ", "time ", "the ")):
        return text[:1].upper() + text[1:]
    return text
