"""The verdict: what the gateway path costs over the direct one, per configuration, in words the
statistics support. The figures come from zgtool.report.tax.

Wording rules (issues 14 and 25):
- on a streaming configuration the first token is the cost a user feels: a significant TTFT (or
  TTFB) tax leads the headline;
- then the tax outside the engine (total minus the engine's own total): the hop's own cost, immune
  to the engine's compute drifting between paths;
- a difference whose interval contains 0 is "no significant difference", never a cost or saving,
  and the sentence says the smallest effect the run could have detected;
- an effect below the minimum effect size is "negligible (< X ms)";
- with several configurations the headline picks one, says which and why ("largest of 3
  significant"), gives the range across configurations, and judges significance on the
  family-adjusted interval when the result carries one;
- a faster path "is faster by X ms", never "saves -X ms";
- the engine's phases (queue, prefill, decode, ...) running faster or slower on one path are engine
  jitter, never billed to the path; a total difference they explain is never a headline about it;
- a negative outside-engine difference is a difference within noise; "not attributed" only when
  the engine's timing truly did not reach the client;
- time nothing attributes is "unattributed", never "network + client", when a path's engine time
  is unknown;
- intervals are printed as [lo, hi].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.latency.render.split import fmt_ci
from zgtool.report.tax import (
    ENGINE_PHASES,
    ENGINE_PROCESS,
    HIGHER,
    LOWER,
    NOT_SIGNIFICANT,
    UNATTRIBUTED,
    ConfigTax,
    PhaseTax,
    config_label,
    engine_explains_total,
    engine_phases,
    family_rows,
    gateway_phases,
    significant,
    taxes,
)

__all__ = ["ENGINE_PHASES", "ENGINE_PROCESS", "HIGHER", "LOWER", "NOT_SIGNIFICANT", "ConfigTax", "PhaseTax",
           "Verdict", "config_label", "describe", "engine_phases", "gateway_phases", "outside_sentence",
           "phase_label", "significant", "taxes", "total_sentence", "verdict"]


@dataclass(frozen=True)
class Verdict:
    rows: list[ConfigTax]
    headline: str
    indicative: bool = False
    family_adjusted: bool = False      # the headline's significance used family-adjusted intervals
    lead: str | None = None            # what the headline leads with: first_token | outside_engine | total | none


def _ms(v: float) -> str:
    """A magnitude: the sentence's verb carries the direction."""
    v = abs(v)
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def _signed(v: float) -> str:
    return f"{v:+.2f}" if abs(v) < 10 else f"{v:+.1f}"


def _ci(lo: float | None, hi: float | None, adjusted: bool = False) -> str:
    if lo is None or hi is None:
        return "no interval"
    return f"{'family-adjusted ' if adjusted else ''}95% CI {fmt_ci(lo, hi)} ms"


def _pct_txt(p: float | None) -> str:
    return f" ({abs(p):.1f}% of direct)" if p is not None else ""


def phase_label(phase: str, engine_unknown: bool = False) -> str:
    """A phase as a reader sees it; the rest nothing attributes is "unattributed" when a path's
    engine time is unknown (it then holds the engine's time too), never "network + client"."""
    from zgtool.report.model import human

    if phase == UNATTRIBUTED and engine_unknown:
        return "unattributed (engine time unknown)"
    return human(phase)


def _detectable(p: PhaseTax | None) -> str:
    m = p.detectable_ms() if p is not None else None
    return "" if m is None else f"; smallest detectable ≈ {_ms(m)}"


def _negligible(p: PhaseTax) -> str:
    return f"negligible (< {_ms(p.min_effect_ms)})" if p.min_effect_ms is not None else "negligible"


def outside_sentence(row: ConfigTax, family: bool = False) -> str | None:
    """What the path adds outside the engine, or why that cannot be said."""
    if row.attribution_missing:
        return (f"time outside the engine on {row.candidate} at {row.label} is not attributed: the engine's "
                "own timing (Server-Timing or any engine adapter) did not reach the client intact on one path "
                "(attribution missing)")
    oe = row.outside_engine
    if oe is None:
        return None
    src = f"; engine time from {row.engine_source}" if row.engine_source else ""
    lo, hi, adj = oe.interval(family)
    sig = oe.sig(family)
    if sig == HIGHER and oe.negligible:
        return (f"{row.candidate} adds {_ms(oe.diff_ms)} outside the engine at {row.label} "
                f"({_ci(lo, hi, adj)}): {_negligible(oe)}")
    if sig == HIGHER:
        return (f"{row.candidate} adds {_ms(oe.diff_ms)}{_pct_txt(oe.pct_of_total)} per request outside the "
                f"engine at {row.label} ({_ci(lo, hi, adj)}{src})")
    if sig == LOWER:
        return (f"time outside the engine on {row.candidate} at {row.label}: {_signed(oe.diff_ms)} ms "
                f"({_ci(lo, hi, adj)}), a difference within noise, not a saving{src}")
    return (f"no significant difference outside the engine between {row.candidate} and {row.baseline} at "
            f"{row.label} ({_signed(oe.diff_ms)} ms, {_ci(lo, hi, adj)}{_detectable(oe)}{src})")


def _phase_list(ps: list[PhaseTax], row: ConfigTax) -> str:
    return ", ".join(f"{phase_label(p.phase, row.engine_unknown)} {_signed(p.diff_ms)} ms {fmt_ci(p.lo_ms, p.hi_ms)}"
                     for p in ps[:3])


def explained_sentence(row: ConfigTax) -> str:
    """A significant total that the engine's own time explains: engine jitter, not the path."""
    t = row.total
    assert t is not None
    same = [p for p in engine_phases(row) if (p.diff_ms > 0) == (t.diff_ms > 0)]
    head = f"total {_signed(t.diff_ms)} ms ({_ci(t.lo_ms, t.hi_ms)}) at {row.label}"
    if same:
        share = "all of it" if abs(sum(p.diff_ms for p in same)) >= 0.8 * abs(t.diff_ms) else "most of it"
        names = " and ".join(phase_label(p.phase) for p in same[:3])
        out = f"{head}, {share} {names} (engine jitter), not the path"
    else:
        out = f"{head} is the engine's time (the difference outside the engine is within noise): engine jitter, not the path"
    if t.diff_ms > 0 and row.gateway_cpu_ms is not None and row.gateway_cpu_ms > 0:
        out += (f"; the gateway used {row.gateway_cpu_ms:.2f} ms of CPU per request on this host, which a "
                "CPU-bound engine may have lost")
    return out


def total_sentence(row: ConfigTax) -> str:
    if row.tax_ms is None:
        return f"{row.candidate} vs {row.baseline} at {row.label}: no total to compare"
    ci = _ci(row.tax_lo_ms, row.tax_hi_ms)
    if row.significance != NOT_SIGNIFICANT and engine_explains_total(row):
        return explained_sentence(row)
    oe = row.outside_engine
    if row.significance == LOWER and oe is not None and oe.significance == LOWER:
        # the whole difference is outside the engine, where a path cannot be faster: noise, not a faster path
        return (f"total {_signed(row.tax_ms)} ms at {row.label} ({ci}): the same difference within noise outside "
                "the engine, not a faster path")
    if row.total is not None and row.total.negligible and row.significance != NOT_SIGNIFICANT:
        return f"total {_signed(row.tax_ms)} ms at {row.label} ({ci}): {_negligible(row.total)}"
    if row.significance == HIGHER:
        return (f"{row.candidate} is slower by {_ms(row.tax_ms)}{_pct_txt(row.tax_pct)} in total at "
                f"{row.label} ({ci})")
    if row.significance == LOWER:
        return (f"{row.candidate} is faster by {_ms(row.tax_ms)}{_pct_txt(row.tax_pct)} in total at "
                f"{row.label} ({ci})")
    return (f"no significant difference in total latency between {row.candidate} and {row.baseline} at "
            f"{row.label} ({_signed(row.tax_ms)} ms, {ci}{_detectable(row.total)})")


def first_token_sentence(row: ConfigTax, family: bool = False) -> str | None:
    """What a streaming path adds before the first token (TTFT) and the first byte (TTFB), when significant."""
    if not row.stream:
        return None
    parts = []
    for p, what, metric in ((row.ttft, "the first token", "TTFT"), (row.ttfb, "the first byte", "TTFB")):
        if p is None or p.sig(family) == NOT_SIGNIFICANT:
            continue
        lo, hi, adj = p.interval(family)
        if p.negligible:
            parts.append(f"{metric} {_signed(p.diff_ms)} ms: {_negligible(p)}")
        elif p.diff_ms > 0:
            parts.append(f"adds {_ms(p.diff_ms)} to {what} ({metric}, {_ci(lo, hi, adj)})")
        else:
            parts.append(f"reaches {what} {_ms(p.diff_ms)} sooner ({metric}, {_ci(lo, hi, adj)})")
    if not parts:
        return None
    return f"{row.candidate} " + "; ".join(parts) + f" at {row.label}"


def engine_sentence(row: ConfigTax) -> str | None:
    """Engine phases that moved between paths are engine jitter (or contention on a shared host), not the hop."""
    moved = engine_phases(row)
    if not moved:
        return None
    out = (f"the engine's own phases ran {'slower' if moved[0].diff_ms > 0 else 'faster'} on the {row.candidate} "
           f"path ({_phase_list(moved, row)}): engine jitter, not the path")
    if any(p.diff_ms > 0 for p in moved) and row.gateway_cpu_ms is not None and row.gateway_cpu_ms > 0:
        out += (f"; the gateway used {row.gateway_cpu_ms:.2f} ms of CPU per request on this host, which a "
                "CPU-bound engine may have lost")
    return out


def describe(row: ConfigTax) -> str:
    """The row in sentences, first token and outside-engine tax first, e.g. 'stack adds 1.30 ms (0.6% of
    direct) per request outside the engine at non-stream c=1 (95% CI [+0.80, +1.90] ms); ...'."""
    total = total_sentence(row)
    engine = None if "engine jitter" in total else engine_sentence(row)
    parts = [first_token_sentence(row) or row.first_token_missing, outside_sentence(row), total, engine]
    out = "; ".join(p for p in parts if p)
    if row.indicative:
        out += f" [indicative: --quick, {row.requests} requests per path]"
    if row.engine_wait is not None:
        out += f" [indicative: {engine_wait_clause(row.engine_wait)}]"
    return out


def engine_wait_clause(wait: dict[str, Any]) -> str:
    """Why an outside-engine tax measured with overlapping requests is indicative (latency_split's engine_wait)."""
    spread = float(wait.get("p90_ms", 0.0)) - float(wait.get("p10_ms", 0.0))
    return (f"at {wait.get('overlap', 'this load')} requests waited up to {spread:.0f} ms for the engine's step "
            "outside its clock, where a hop's cost hides; -c 1 measures a hop's tax")


def _why(picked: float, all_values: list[float], n_sig: int, n_rows: int, what: str, kind: str = "") -> str:
    """'(largest of 3 significant; +3.60 to +21.1 ms across the 4 configurations)'."""
    if n_rows <= 1:
        return ""
    why = f"largest of {n_sig} significant" if n_sig > 1 else f"the only significant one of {n_rows}"
    lo, hi = min(all_values), max(all_values)
    rng = f"; {what} {_signed(lo)} to {_signed(hi)} ms across the {len(all_values)} {kind}configurations" \
        if len(all_values) > 1 else ""
    return f" ({why}{rng})"


def _adjust_note(rows: list[ConfigTax], family: bool, ps: list[PhaseTax | None]) -> str:
    if not family:
        return ""
    if any(p is not None and p.significant_adj is not None for p in ps):
        return ""
    return f" [interval not adjusted for the {len(rows)} configurations compared]"


def _first_token_lead(rows: list[ConfigTax], family: bool) -> str | None:
    def ft(r: ConfigTax) -> PhaseTax | None:
        for p in (r.ttft, r.ttfb):
            if p is not None and p.is_finding(family) and p.diff_ms > 0:
                return p
        return None

    hits = [(r, p) for r in rows if r.stream and (p := ft(r)) is not None]
    if not hits:
        return None
    row, p = max(hits, key=lambda rp: rp[1].diff_ms)
    sentence = first_token_sentence(row, family) or ""
    streams = [q.diff_ms for r in rows if r.stream and (q := (r.ttft if p.phase == "ttft_ms" else r.ttfb))]
    metric = "TTFT" if p.phase == "ttft_ms" else "TTFB"
    n_stream = sum(1 for r in rows if r.stream)
    return sentence + _why(p.diff_ms, streams, len(hits), n_stream, metric, "streaming ") + _adjust_note(rows, family, [p])


def _outside_lead(rows: list[ConfigTax], family: bool) -> str | None:
    hits = [r for r in rows if r.outside_engine is not None and r.outside_engine.is_finding(family)
            and r.outside_engine.sig(family) == HIGHER]
    if not hits:
        return None
    row = max(hits, key=lambda r: r.outside_engine.diff_ms if r.outside_engine else 0.0)
    assert row.outside_engine is not None
    values = [r.outside_engine.diff_ms for r in rows if r.outside_engine is not None and not r.attribution_missing]
    return ((outside_sentence(row, family) or "") + _why(row.outside_engine.diff_ms, values, len(hits), len(rows),
                                                         "outside the engine")
            + _adjust_note(rows, family, [row.outside_engine]))


def _total_lead(rows: list[ConfigTax], family: bool) -> str | None:
    """Only where the time outside the engine is unknown: otherwise a significant total is the engine's
    (jitter) or the outside-engine figure's, which have their own words."""
    hits = [r for r in rows if r.total is not None and r.total.is_finding(family) and not engine_explains_total(r)
            and r.outside_engine is None]
    if not hits:
        return None
    row = max(hits, key=lambda r: abs(r.tax_pct) if r.tax_pct is not None else abs(r.tax_ms or 0.0))
    values = [r.tax_ms for r in rows if r.tax_ms is not None]
    return (total_sentence(row) + _why(row.tax_ms or 0.0, values, len(hits), len(rows), "total")
            + _adjust_note(rows, family, [row.total]))


def _explained(rows: list[ConfigTax]) -> str | None:
    """Significant totals the engine explains: said so, so that no one reads them as the path's."""
    found = [r for r in rows if engine_explains_total(r)]
    if not found:
        return None
    row = max(found, key=lambda r: abs(r.tax_ms or 0.0))
    return explained_sentence(row)


def _minor(rows: list[ConfigTax], family: bool) -> list[str]:
    """Significant but immaterial outside-engine figures: negligible effects and chance negatives,
    named for what they are so that no one reads them as a finding (or as missing attribution)."""
    out = []
    for r in rows:
        oe = r.outside_engine
        if oe is not None and oe.sig(family) != NOT_SIGNIFICANT and (oe.negligible or oe.sig(family) == LOWER):
            out.append(outside_sentence(r, family) or "")
    return [s for s in out if s][:2]


def _nothing(rows: list[ConfigTax], missing: list[ConfigTax]) -> str:
    # a significant total the engine explains is said in its own clause, not denied here
    measured = [] if any(engine_explains_total(r) for r in rows) else ["in total latency"]
    if any(r.outside_engine is not None for r in rows):
        measured.append("outside the engine")
    if any(r.ttft is not None or r.ttfb is not None for r in rows):
        measured.append("to the first token")
    n = len(rows)
    where = f"in {n} configuration{'s' if n > 1 else ''}"
    if measured:
        what = ", ".join(measured[:-1]) + (" or " if len(measured) > 1 else "") + measured[-1]
        out = f"No significant difference {what} {where}"
    else:
        out = f"No significant cost to the path {where}"
    figures = [(r, p) for r in rows if (p := r.outside_engine or r.total) is not None]
    mdes = [(r, m) for r, p in figures if (m := p.detectable_ms()) is not None]
    if mdes:
        lo_r, lo_m = min(mdes, key=lambda x: x[1])
        hi_r, hi_m = max(mdes, key=lambda x: x[1])
        what_mde = "outside the engine" if any(r.outside_engine is not None for r, _ in mdes) else "in total"
        if len(mdes) == 1 or hi_m - lo_m < 0.05 * hi_m:
            out += f": the smallest difference {what_mde} this run could have detected is about {_ms(hi_m)}"
        else:
            out += (f": the smallest difference {what_mde} this run could have detected is about {_ms(lo_m)} at "
                    f"{lo_r.label} and {_ms(hi_m)} at {hi_r.label}")
        if hi_r.concurrency > 1 and hi_m > 2 * lo_m:
            out += " (little power at high concurrency: a smaller tax there would go unseen)"
    else:
        out += ": every interval contains 0"
    if missing:
        out += (f"; time outside the engine is not attributed in {len(missing)} configuration(s) (the engine's "
                "own timing did not reach the client intact on a path)")
    return out


def verdict(latency_results: list[dict[str, Any]]) -> Verdict | None:
    rows, family = family_rows([t for r in latency_results for t in taxes(r)])
    if not rows:
        return None
    indicative = any(r.indicative for r in rows)
    prefix = "Indicative (--quick sample sizes): " if indicative else ""
    first = _first_token_lead(rows, family)
    outside = _outside_lead(rows, family)
    total = None if outside else _total_lead(rows, family)
    explained = _explained(rows)
    lead = "first_token" if first else "outside_engine" if outside else "total" if total else "none"
    clauses = [c for c in (first, outside, total) if c]
    if not clauses:
        minor = _minor(rows, family)
        nothing = _nothing(rows, [r for r in rows if r.attribution_missing])
        sooner = any(p is not None and p.is_finding(family) for r in rows for p in (r.ttft, r.ttfb))
        if any("negligible" in m for m in minor):
            nothing = nothing.replace("No significant difference", "No material difference", 1)
        elif minor or sooner:     # chance negatives or a sooner first token: significant, but no cost
            nothing = nothing.replace("No significant difference", "No significant cost", 1)
        clauses = [nothing, *minor]
    if explained:
        clauses.append(explained)
    waited = next((r.engine_wait for r in rows if r.engine_wait is not None), None)
    if waited is not None:
        clauses.append("indicative outside the engine: " + engine_wait_clause(waited))
    headline = "; ".join(_capital(c) if i == 0 else c for i, c in enumerate(clauses)) + "."
    adjusted = family and any(p is not None and p.significant_adj is not None
                              for r in rows for p in (r.outside_engine, r.ttft, r.ttfb, r.total))
    return Verdict(rows, prefix + headline, indicative, adjusted, lead)


def _capital(text: str) -> str:
    """Capitalise a sentence that starts with a word, not with a path's name."""
    if text.startswith(("no ", "time ", "the ", "total ")):
        return text[:1].upper() + text[1:]
    return text
