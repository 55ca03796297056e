"""`gate --baseline FILE` on latency_split and k6 bench results, judged by intervals (the [regression] method
"intervals"; a bench's scenarios read as paths, direct first, each hop's tax its median minus direct's).

Two separate runs drift apart on a shared machine, and a p95 of 50 requests carries no interval: the old rule
(this run's p95 over the baseline's by more than 10%) failed 4 to 10 of 11 A/A pairs of runs of the same stack
(bench/gate_calibration.py, quiet and busy, two runs of it here). So, for each result against the baseline run:

- a path's phase X (each target both runs measured; by default only in a run of one path, [regression]
  paths = "auto"): this run's 95% interval of the median (median_lo to
  median_hi, latency-split's bootstrap) lies above the baseline run's by more than the allowance:
  median_lo > median_hi_baseline * (1 + max) and median_lo - median_hi_baseline > noise_floor. A real
  change of the machine between the runs still moves a whole path; the next rows do not see that;
- a hop's tax: this run's paired difference of a candidate path from the first path (latency-split's
  `differences`: outside_engine_ms where the engine's own time was read, else the phases alike), which the
  machine's drift cancels within each run: its interval lies above the baseline run's interval by more than
  max(noise_floor, max * |the baseline's tax|). A k6 bench's tax (each scenario's median minus direct's, paired
  by rounds, not request by request) is judged by `compare`'s rule instead: the change of the tax has a 95%
  interval (the two runs' intervals combined, zgtool.compare.stats) that excludes 0, and it is at least that
  allowance. Against a stored run (bench/k6_gate_calibration.py, 10 rounds, quiet and busy) the rule above caught
  a 2 ms regression in 1 of 7 pairs, compare's in 5 to 7 of 7, each with no false alarm in 7 A/A pairs.

A pass is marked inconclusive, as [paired]'s are, when the change's 95% interval (both runs' intervals combined,
compare's rule) still reaches above the allowance: a regression that large could pass unseen between two runs
this wide. [regression] inconclusive = "unreliable" makes such a run exit 5.

The policy's globs select what is judged: phase X of target T when "T.X.p95" matches one (the percentile
method's names), so a policy's fields mean the same under both methods."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import replace
from typing import Any

from zgtool.gate.policy import MEASUREMENT, RegressionSpec
from zgtool.gate.records import FAIL, PASS, SKIP, GateRow, LoadedResult

GROUP = "regression"
TAX_PHASES = ("outside_engine_ms", "total_ms", "ttft_ms")   # a hop's cost; engine phases differ by noise alone
BENCH_PHASE = "http_req_duration"     # a k6 bench's figure, named as its rules name it (direct.http_req_duration.p95)


def _shape(result: dict[str, Any]) -> dict[str, Any]:
    """A bench.k6 result in latency-split's shape (zgtool.loadtest.differences.split_shape); others unchanged."""
    if result.get("kind") != "bench.k6":
        return result
    from zgtool.loadtest.differences import split_shape

    targets, differences = split_shape(result.get("data") or {}, BENCH_PHASE)
    return {**result, "data": {"targets": targets, "differences": differences}}


def _bench_pairing(result: dict[str, Any]) -> str:
    from zgtool.loadtest.differences import how_paired

    return how_paired((result.get("data") or {}).get("differences") or {})


def judged_by_intervals(result: dict[str, Any]) -> bool:
    """Whether the intervals method can read this result: a latency_split, or a bench.k6 whose scenarios carry
    their medians' intervals (results written before they were kept are read by percentile)."""
    if result.get("kind") == "latency_split":
        return True
    return result.get("kind") == "bench.k6" and any(
        isinstance(s, dict) and s.get("p50_lo_ms") is not None
        for s in ((result.get("data") or {}).get("scenarios") or {}).values())


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _phases(result: dict[str, Any]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(target, phase) -> (median, median_lo, median_hi), where all three are numbers."""
    out: dict[tuple[str, str], tuple[float, float, float]] = {}
    for t in (result.get("data") or {}).get("targets") or []:
        if not isinstance(t, dict):
            continue
        for phase, doc in (t.get("phases") or {}).items():
            if not isinstance(doc, dict):
                continue
            med = _num((doc.get("summary") or {}).get("p50"))
            lo, hi = _num(doc.get("median_lo")), _num(doc.get("median_hi"))
            if med is not None and lo is not None and hi is not None:
                out[(str(t.get("name")), str(phase))] = (med, lo, hi)
    return out


def _taxes(result: dict[str, Any]) -> dict[tuple[str, str, str], tuple[float, float, float]]:
    """(baseline path, candidate path, phase) -> (difference, lo, hi) of the run's paired differences."""
    out: dict[tuple[str, str, str], tuple[float, float, float]] = {}
    for d in (result.get("data") or {}).get("differences") or []:
        if not isinstance(d, dict):
            continue
        est = _num(d.get("diff_ms"))
        lo = _num(d.get("lo_adj")) if d.get("lo_adj") is not None else _num(d.get("lo_ms"))
        hi = _num(d.get("hi_adj")) if d.get("hi_adj") is not None else _num(d.get("hi_ms"))
        if est is not None and lo is not None and hi is not None:
            out[(str(d.get("baseline")), str(d.get("candidate")), str(d.get("phase")))] = (est, lo, hi)
    return out


def _selected(spec: RegressionSpec, target: str, phase: str) -> bool:
    return any(fnmatch.fnmatchcase(f"{target}.{phase}.p95", p) for p in spec.fields)


def _iv(lo: float, hi: float) -> str:
    return f"[{lo:.4g}, {hi:.4g}]"


def _judge_paths(spec: RegressionSpec, result: dict[str, Any]) -> bool:
    if spec.paths != "auto":
        return spec.paths == "always"
    return len((result.get("data") or {}).get("targets") or []) < 2


def interval_rows(spec: RegressionSpec, res: LoadedResult, baseline: LoadedResult) -> list[GateRow]:
    pct = f"{spec.max_ratio:.0%}"
    rows: list[GateRow] = []
    bench = res.result.get("kind") == "bench.k6"
    current, base = _shape(res.result), _shape(baseline.result)
    mine, theirs = _phases(current), _phases(base)
    if not _judge_paths(spec, current):
        theirs = {}
        rows.append(GateRow(
            "each path's own medians", f"paths = \"{spec.paths}\"" + (": judged in a run of one path"
                                                                      if spec.paths == "auto" else ""), res.label,
            SKIP, detail="not judged in a run of two or more paths: a path's own median moves with the machine "
                         "between runs (0-3 of 11 A/A pairs of runs failed by it in bench/gate_calibration.py, quiet "
                         "or busy); the hops' taxes do not. [regression] paths = \"always\" judges them too",
            group=GROUP))
    for (target, phase), (b_med, b_lo, b_hi) in theirs.items():
        if (target, phase) not in mine or not _selected(spec, target, phase):
            continue
        med, lo, hi = mine[(target, phase)]
        limit = b_hi * (1 + spec.max_ratio)
        breached = lo > limit and lo - b_hi > spec.noise_floor
        if breached:
            verdict = f"its interval lies above the baseline's by more than +{pct} and {spec.noise_floor:g} ms"
        elif lo > b_hi:
            verdict = f"its interval lies above the baseline's, within +{pct} or {spec.noise_floor:g} ms"
        else:
            verdict = "the intervals overlap or it is faster"
        rows.append(_marked(spec, GateRow(
            f"{target}.{phase} median", f"median_lo <= baseline median_hi * (1 + {pct})", res.label,
            FAIL if breached else PASS, (f"{phase} median_lo", f"baseline median_hi * (1 + {pct})"), ("<=",),
            (lo, limit), f"95% intervals of the medians; allowance +{pct} and {spec.noise_floor:g} ms beyond the "
            "baseline's", group=GROUP, why=f"median {med:.4g} {_iv(lo, hi)} vs baseline {b_med:.4g} {_iv(b_lo, b_hi)}: {verdict}"),
            (b_lo, b_hi), (lo, hi), med - b_med, max(spec.max_ratio * b_hi, spec.noise_floor), bench=bench))
    mine_tax, their_tax = _taxes(current), _taxes(base)
    how = (f"each scenario's median minus direct's within each run ({_bench_pairing(res.result)})" if bench
           else "paired within each run (the machine's drift cancels)")
    for (base_path, cand, phase), (b_est, b_lo, b_hi) in their_tax.items():
        if phase not in (*TAX_PHASES, BENCH_PHASE) or (base_path, cand, phase) not in mine_tax or not _selected(spec, cand, phase):
            continue
        est, lo, hi = mine_tax[(base_path, cand, phase)]
        allowance = max(spec.noise_floor, spec.max_ratio * abs(b_est))
        said = f"tax {est:+.4g} ms {_iv(lo, hi)} vs baseline run's {b_est:+.4g} ms {_iv(b_lo, b_hi)}: "
        if bench:
            rows.append(_bench_tax_row(spec, f"{cand} - {base_path}: {phase} tax", res.label, (est, lo, hi),
                                       (b_est, b_lo, b_hi), allowance, said, f"{how}; allowance "
                                       f"max({spec.noise_floor:g} ms, {pct} of the baseline run's tax)"))
            continue
        breached = lo > b_hi + allowance
        said += (("its interval lies above the baseline run's by more than" if breached else "within")
                 + f" the {allowance:.3g} ms allowance")
        rows.append(_marked(spec, GateRow(
            f"{cand} - {base_path}: {phase} tax", f"tax lo <= baseline tax hi + {allowance:.3g} ms",
            res.label, FAIL if breached else PASS, ("tax lo", "baseline tax hi + allowance"), ("<=",),
            (lo, b_hi + allowance), f"{how}; allowance "
            f"max({spec.noise_floor:g} ms, {pct} of the baseline run's tax)", group=GROUP, why=said),
            (b_lo, b_hi), (lo, hi), est - b_est, allowance))
    return rows


def _marked(spec: RegressionSpec, row: GateRow, before: tuple[float, float], now: tuple[float, float],
            change: float, allowance: float, bench: bool = False) -> GateRow:
    """`row`, marked inconclusive when it passed while the change's 95% interval (both runs' intervals
    combined, compare's rule) still reaches above the allowance: a regression that large is as consistent with
    the two runs as none. With [regression] inconclusive = "unreliable" such a row makes the run exit 5."""
    from zgtool.compare.stats import interval_apart

    reach = interval_apart(*before, *now, change)[1]
    if row.status != PASS or not reach > allowance:
        return row
    why = (f"{row.why}; inconclusive: the change's interval, both runs' combined, reaches {reach:+.4g} ms, above "
           f"the {allowance:.3g} ms allowance, so a regression that large could pass unseen ("
           + ("a longer --duration in both runs narrows it)" if bench else "more requests in both runs, -n, narrow it)"))
    if spec.inconclusive == "unreliable":
        return replace(row, status=FAIL, category=MEASUREMENT, sides=("change interval high end", "allowance"),
                       values=(reach, allowance), why=why, inconclusive=True)
    return replace(row, why=why, inconclusive=True)


def _bench_tax_row(spec: RegressionSpec, name: str, label: str, now: tuple[float, float, float], before: tuple[float, float, float],
                   allowance: float, said: str, detail: str) -> GateRow:
    """A k6 bench's tax against the stored run's by compare's rule: the change's 95% interval (both runs'
    intervals combined) excludes 0 and the change is at least the allowance."""
    from zgtool.compare.stats import interval_apart

    (est, lo, hi), (b_est, b_lo, b_hi) = now, before
    change = est - b_est
    c_lo, c_hi = interval_apart(b_lo, b_hi, lo, hi, change)
    breached = c_lo > 0 and change >= allowance
    said += (f"change {change:+.4g} ms {_iv(c_lo, c_hi)}: "
             + ("above 0 and at least" if breached else "within")
             + f" the {allowance:.3g} ms allowance" + ("" if breached or c_lo > 0 else " or its interval holds 0"))
    # the side that decides: the interval when it holds 0, else the size of the change
    sides, values = (("change", "allowance"), (change, allowance)) if c_lo > 0 else (("change lo", "0"), (c_lo, 0.0))
    row = GateRow(name, f"change lo <= 0 or change < {allowance:.3g} ms", label, FAIL if breached else PASS,
                  sides, ("<",) if c_lo > 0 else ("<=",), values, detail + "; the change's interval "
                  "combines both runs' (compare's rule)", group=GROUP, why=said)
    # a change as large as the allowance still inside the interval: a pass that could not have seen it
    return _marked(spec, row, (b_lo, b_hi), (lo, hi), change, allowance, bench=True)
