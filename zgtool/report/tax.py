"""The gateway tax per configuration, read from latency_split results (the first target is the
baseline): the median difference of each phase with its bootstrap interval, in ms and as a % of
the baseline's median total, plus what the statistics say about it (family-adjusted interval,
negligible effect, smallest detectable effect) where the result carries it.

Data only; the words are in zgtool.report.verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from zgtool.latency.render.fieldlines import CHANCE_NEGATIVE

NOT_SIGNIFICANT = "not significant"
HIGHER = "higher"
LOWER = "lower"
ENGINE_PHASES = ("queue_ms", "prefill_ms", "decode_ms", "detok_ms", "safety_ms", "engine_other_ms")
ENGINE_PROCESS = "engine"
UNATTRIBUTED = "network_client_ms"   # what no Server-Timing part or engine adapter explains
# (z_0.975 + z_0.80) / z_0.975: a 95% interval of half-width h detects, with 80% power, an
# effect of about 1.43 h. Used only when the result does not carry its own mde_ms.
MDE_PER_HALF_WIDTH = (1.959964 + 0.841621) / 1.959964


@dataclass(frozen=True)
class PhaseTax:
    phase: str
    diff_ms: float
    lo_ms: float | None
    hi_ms: float | None
    significance: str                  # higher | lower | not significant (the run's own 95% interval)
    pct_of_total: float | None         # % of the baseline's median total_ms
    negligible: bool = False           # |effect| below the minimum effect size worth naming
    min_effect_ms: float | None = None  # that minimum, when the result states it
    mde_ms: float | None = None        # the smallest effect the run could have detected (result's own)
    lo_adj_ms: float | None = None     # family-adjusted interval (multiple configurations)
    hi_adj_ms: float | None = None
    significant_adj: bool | None = None
    comparisons: int | None = None     # how many comparisons the adjustment covers (candidates x configurations)

    def detectable_ms(self) -> float | None:
        """The smallest effect this run could have detected: the result's mde_ms, else a conservative
        one from the interval's wider half (80% power at the 95% level)."""
        if self.mde_ms is not None:
            return self.mde_ms
        if self.lo_ms is None or self.hi_ms is None:
            return None
        return MDE_PER_HALF_WIDTH * max(self.diff_ms - self.lo_ms, self.hi_ms - self.diff_ms, 0.0)

    def is_finding(self, family: bool = False) -> bool:
        """Significant (family-adjusted when several configurations compete for the headline and the
        result carries the adjustment) and not negligible."""
        return self.sig(family) != NOT_SIGNIFICANT and not self.negligible

    def sig(self, family: bool = False) -> str:
        if family and self.significant_adj is not None:
            return self.significance if self.significant_adj else NOT_SIGNIFICANT
        return self.significance

    def interval(self, family: bool = False) -> tuple[float | None, float | None, bool]:
        """(lo, hi, adjusted): the family-adjusted interval when asked for and present."""
        if family and self.lo_adj_ms is not None and self.hi_adj_ms is not None:
            return self.lo_adj_ms, self.hi_adj_ms, True
        return self.lo_ms, self.hi_ms, False


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
    attribution_missing: bool = False        # the engine's timing truly did not reach the client on a path
    gateway_cpu_ms: float | None = None      # CPU ms per request of the gateway's local processes
    engine_cpu_ms: dict[str, float] | None = None   # path -> engine CPU ms per request
    indicative: bool = False                 # --quick sample sizes
    requests: int | None = None              # per path
    engine_source: str | None = None         # where the engine's own time came from (join's engine_sources)
    total: PhaseTax | None = None            # the total difference with its statistics
    ttfb: PhaseTax | None = None             # stream only: first byte
    engine_unknown: bool = False             # a path has no engine time: its rest is unattributed, not network
    first_token_missing: str | None = None   # stream without a TTFT figure: why (e.g. every request lag-flagged)
    # requests overlapped an engine whose clock starts after its front, and waited for its steps outside that
    # clock (latency_split's engine_wait: overlap, p10_ms, p90_ms): the outside-engine tax is indicative
    engine_wait: dict[str, Any] | None = None


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
    """The engine's own timing did not reach the client on this path (or did so wrong on most
    requests): the notes latency_split wrote. A chance negative difference is not one of them."""
    return any(note.startswith(f"{name}:") and ("not attributed" in note or "exceeds the request's own time" in note)
               for note in data.get("attribution_notes") or [])


def _chance_negative(data: dict[str, Any], cand: str, base_total: float | None) -> PhaseTax | None:
    """Older latency_split results dropped a significantly negative outside-engine difference and left
    only a note; the figure is recovered from it so the verdict can call it what it is (noise)."""
    for note in data.get("attribution_notes") or []:
        m = CHANCE_NEGATIVE.match(note)
        if m and m["cand"] == cand:
            diff = -float(m["abs"])
            return PhaseTax("outside_engine_ms", diff, float(m["lo"]), float(m["hi"]), LOWER, _pct(diff, base_total))
    return None


def _float(d: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def phase_tax(d: dict[str, Any], base_total: float | None) -> PhaseTax | None:
    """One difference entry of a latency_split result (optional statistics read when present)."""
    if d.get("diff_ms") is None:
        return None
    lo_adj, hi_adj = _float(d, "lo_adj_ms", "lo_adj"), _float(d, "hi_adj_ms", "hi_adj")
    adj = d.get("significant_adj")
    has_adj = isinstance(adj, bool) and lo_adj is not None and hi_adj is not None
    comparisons = d.get("comparisons")
    return PhaseTax(
        d["phase"], d["diff_ms"], d.get("lo_ms"), d.get("hi_ms"), d.get("verdict") or NOT_SIGNIFICANT,
        _pct(d["diff_ms"], base_total), negligible=bool(d.get("negligible")),
        min_effect_ms=_float(d, "min_effect_ms", "negligible_below_ms", "min_effect_size_ms"),
        mde_ms=_float(d, "mde_ms"), lo_adj_ms=lo_adj if has_adj else None, hi_adj_ms=hi_adj if has_adj else None,
        significant_adj=adj if has_adj else None, comparisons=comparisons if isinstance(comparisons, int) else None)


def engine_known(target: dict[str, Any]) -> bool:
    """The engine's own time reached the client on this path (an engine phase was attributed)."""
    phases = target.get("phases") or {}
    return any((phases.get(p) or {}).get("count") for p in ENGINE_PHASES)


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
    stream = bool(cfg.get("stream"))
    out = []
    for cand in targets[1:]:
        by_phase = {d["phase"]: d for d in data.get("differences") or [] if d.get("candidate") == cand["name"]}

        def tax(phase: str, by_phase: dict[str, Any] = by_phase) -> PhaseTax | None:
            d = by_phase.get(phase)
            return None if d is None else phase_tax(d, base_total)

        total = tax("total_ms")
        phases = [t for t in (tax(p) for p in by_phase if p in waterfall) if t is not None]
        phases.sort(key=lambda t: -abs(t.diff_ms))
        missing = _engine_timing_missing(data, cand["name"]) or _engine_timing_missing(data, base["name"])
        oe = None if missing else tax("outside_engine_ms") or _chance_negative(data, cand["name"], base_total)
        gw_cpu, engine_cpu = _cpu(base, cand)
        out.append(ConfigTax(
            label=config_label(cfg), stream=stream, concurrency=int(cfg.get("concurrency", 1)),
            baseline=base["name"], candidate=cand["name"], baseline_total_ms=base_total,
            candidate_total_ms=_median(cand, "total_ms"),
            tax_ms=total.diff_ms if total else None, tax_lo_ms=total.lo_ms if total else None,
            tax_hi_ms=total.hi_ms if total else None, tax_pct=total.pct_of_total if total else None,
            significance=total.significance if total else NOT_SIGNIFICANT, phases=phases,
            ttft=tax("ttft_ms") if stream else None, outside_engine=oe,
            attribution_missing=missing, gateway_cpu_ms=gw_cpu, engine_cpu_ms=engine_cpu,
            indicative=bool(cfg.get("quick")), requests=cfg.get("num_requests"),
            engine_source=_engine_source(data, base["name"], cand["name"]), total=total,
            ttfb=tax("ttfb_ms") if stream else None,
            engine_unknown=not (engine_known(base) and engine_known(cand)),
            first_token_missing=_first_token_missing(base, cand) if stream and tax("ttft_ms") is None else None,
            engine_wait=data.get("engine_wait")))
    return out


def _first_token_missing(*targets: dict[str, Any]) -> str:
    """Why a stream has no TTFT difference: latency-split leaves lag-flagged requests out of it."""
    flagged = [f"{t.get('name')} {t['num_lagged']} of {t.get('num_ok')}" for t in targets if t.get("num_lagged")]
    if flagged:
        return ("no first-token figure: requests whose receive times the client could not vouch for are left "
                f"out ({'; '.join(flagged)} flagged)")
    return "no first-token figure on one path"


def _engine_source(data: dict[str, Any], *names: str) -> str | None:
    """The adapters that gave the engine's time on these paths ("vLLM OTLP span", "Server-Timing", ...)."""
    paths = (data.get("join") or {}).get("paths") or {}
    found = dict.fromkeys(s for n in names for s in ((paths.get(n) or {}).get("engine_sources") or {}))
    return " + ".join(found) or None


def significant(p: PhaseTax | None) -> bool:
    return p is not None and p.significance != NOT_SIGNIFICANT


def engine_phases(row: ConfigTax) -> list[PhaseTax]:
    """The engine's own phases that differ significantly between the paths."""
    return [p for p in row.phases if p.phase in ENGINE_PHASES and significant(p)]


def gateway_phases(row: ConfigTax) -> list[PhaseTax]:
    """Significant, positive, material non-engine phases: where the gateway's own time goes. Without
    the engine's time on a path, the unattributed rest holds the engine's time, not the gateway's."""
    return [p for p in row.phases if p.phase not in ENGINE_PHASES and significant(p) and p.diff_ms > 0
            and not p.negligible and not (p.phase == UNATTRIBUTED and row.engine_unknown)]


def engine_explains_total(row: ConfigTax) -> bool:
    """A significant total difference that is the engine's time, not the path's: the difference
    outside the engine is not significant in the same direction, or significant engine phases in
    the total's direction make up at least half of it."""
    t = row.total
    if t is None or not significant(t):
        return False
    same = [p for p in engine_phases(row) if (p.diff_ms > 0) == (t.diff_ms > 0)]
    if same and abs(sum(p.diff_ms for p in same)) >= 0.5 * abs(t.diff_ms):
        return True
    oe = row.outside_engine
    return oe is not None and not (significant(oe) and (oe.diff_ms > 0) == (t.diff_ms > 0))


def _unadjusted(p: PhaseTax | None) -> PhaseTax | None:
    return None if p is None else replace(p, lo_adj_ms=None, hi_adj_ms=None, significant_adj=None)


def family_rows(rows: list[ConfigTax]) -> tuple[list[ConfigTax], bool]:
    """(rows, family): several configurations compete for the headline. A family adjustment that
    covers fewer comparisons than the rows compared (results of separate runs put together) does not
    hold for this family, so it is dropped and the unadjusted interval is shown as such."""
    family = len(rows) > 1
    if not family:
        return rows, False
    ps = [p for r in rows for p in (r.total, r.ttft, r.ttfb, r.outside_engine, *r.phases) if p is not None]
    if all(p.comparisons is not None and p.comparisons >= len(rows) for p in ps if p.significant_adj is not None):
        return rows, True
    return [replace(r, total=_unadjusted(r.total), ttft=_unadjusted(r.ttft), ttfb=_unadjusted(r.ttfb),
                    outside_engine=_unadjusted(r.outside_engine),
                    phases=[q for q in (_unadjusted(p) for p in r.phases) if q is not None]) for r in rows], True
