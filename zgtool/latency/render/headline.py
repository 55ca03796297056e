"""The answer first: one sentence that says what the run found, printed as latency-split's first stdout line.

Two or more targets: what each candidate adds over the first target per request, outside the engine when
both paths carry the engine's own timing (the engine's jitter cannot touch that figure), else in total;
with its 95% interval, whether it is significant and, when it is not, the smallest effect the run could have
detected. One target: its median total and TTFT with their intervals. Rendering only.
"""

from __future__ import annotations

from zgtool.latency.analysis.phases import phase as find_phase
from zgtool.latency.records import PhaseDifference, SplitResult, TargetResult
from zgtool.latency.render.split import short_names


def _ms(v: float, signed: bool = True) -> str:
    digits = 2 if abs(v) < 10 else 1 if abs(v) < 1000 else 0
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _interval(lo: float | None, hi: float | None, signed: bool = True) -> str:
    if lo is None or hi is None:
        return "[no interval]"
    return f"[{_ms(lo, signed)}, {_ms(hi, signed)}]"


def _difference(res: SplitResult, cand: str) -> tuple[PhaseDifference | None, str]:
    diffs = {d.phase: d for d in res.differences if d.candidate == cand}
    outside = diffs.get("outside_engine_ms")
    if outside is not None and outside.diff_ms is not None:
        return outside, "outside the engine"
    return diffs.get("total_ms"), "in total"


def _candidate_sentence(res: SplitResult, base: TargetResult, cand: TargetResult, name: str, base_name: str) -> str:
    d, where = _difference(res, cand.name)
    if d is None or d.diff_ms is None:
        return f"{name} vs {base_name}: no difference could be computed (too few answers on one path)"
    significant = d.verdict in ("higher", "lower")
    verb = "adds" if d.diff_ms >= 0 else "takes"
    amount = _ms(d.diff_ms) if d.diff_ms >= 0 else _ms(d.diff_ms)
    out = f"{name} {verb} {amount} ms {_interval(d.lo_ms, d.hi_ms)} per request {where}"
    if significant:
        out += ", significant"
    else:
        mde = (f"; the run could have detected {_ms(d.mde_ms, signed=False)} ms or more"
               if d.mde_ms is not None else "")
        out += f", n.s. (not significant: the interval contains 0){mde}"
    total = find_phase(base, "total_ms")
    base_total = total.summary.get("p50") if total is not None else None
    if base_total:
        out += f"; {abs(d.diff_ms) / base_total:.1%} of {base_name}'s {_ms(base_total, signed=False)} ms total"
    if where == "in total" and _has_engine_time(base) and not _has_engine_time(cand):
        out += (" (in total: the engine's own time did not come through this path, so the engine's variation is in "
                "the figure; the notes say what measures the hop alone)")
    out += _first_token_clause(res, cand)
    wait = res.engine_wait
    if wait is not None and where == "outside the engine":
        out += (f" (indicative: at {wait['overlap']} requests waited up to {_ms(wait['p90_ms'] - wait['p10_ms'], signed=False)}"
                " ms for the engine's step outside its clock, where a hop's cost hides; -c 1 measures it)")
    return out


def _first_token_clause(res: SplitResult, cand: TargetResult) -> str:
    """A stream's first token, when the hop moved it significantly: what a streaming user waits for, and what a
    hop that holds the stream back (a compressing or buffering proxy) moves by nearly the whole answer."""
    d = next((x for x in res.differences if x.candidate == cand.name and x.phase == "ttft_ms"), None)
    if d is None or d.diff_ms is None or d.verdict not in ("higher", "lower"):
        return ""
    out = f"; its first token {_ms(d.diff_ms)} ms {_interval(d.lo_ms, d.hi_ms)}, significant"
    ttft, total, itl = (find_phase(cand, m) for m in ("ttft_ms", "total_ms", "itl_ms"))
    if (ttft is not None and total is not None and itl is not None and d.diff_ms > 0
            and ttft.summary.get("p50") is not None and total.summary.get("p50")
            and ttft.summary["p50"] >= 0.9 * total.summary["p50"] and (itl.summary.get("p50") or 0.0) < 0.05):
        out += (" (the stream arrived in one piece: a hop held it back"
                + (", compressing it" if any(s.content_encoding for s in cand.samples if s.ok) else "") + ")")
    return out


def _has_engine_time(tr: TargetResult) -> bool:
    return find_phase(tr, "outside_engine_ms") is not None


def _single_sentence(tr: TargetResult, name: str) -> str:
    parts = []
    for metric, label in (("total_ms", "total"), ("ttft_ms", "TTFT")):
        p = find_phase(tr, metric)
        if p is not None and p.summary.get("p50") is not None:
            parts.append(f"{label} {_ms(p.summary['p50'], signed=False)} ms "
                         f"{_interval(p.median_lo, p.median_hi, signed=False)}")
    sent = tr.num_ok + tr.num_error
    figures = ", ".join(parts) if parts else "no latency figure"
    return f"{name}: median {figures} per request (95% intervals); {tr.num_ok} of {sent} requests answered"


def headline(res: SplitResult) -> str:
    """One sentence (one line, however long: it wraps, it is never cut)."""
    if not res.targets:
        return "no target was measured"
    names = [tr.name for tr in res.targets]
    short = short_names(names)
    label = {n: (n if short[n] == n else f"{short[n]} ({n})") for n in names}
    base = res.targets[0]
    if len(res.targets) == 1:
        return _single_sentence(base, base.name)
    sentences = [_candidate_sentence(res, base, c, label[c.name], label[base.name]) for c in res.targets[1:]]
    return "; ".join(sentences) + "."
