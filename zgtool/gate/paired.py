"""Paired gates: baseline and candidates measured interleaved in one latency_split run.

Two separate runs compared by a percentage cannot tell a regression from the run-to-run drift of a
shared machine (the CI example failed on identical code at +46%). latency-split alternates the
targets in rounds on the same machine state, so the median difference with a paired round
bootstrap (zgtool/bootstrap.py) sees only what differs between the paths. A field breaches when
that difference is significant at the family-wise confidence (Bonferroni over every comparison in
the run) and larger than the policy's material thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

from zgtool.bootstrap import median_difference
from zgtool.gate.policy import MEASUREMENT, PairedSpec, PolicyError
from zgtool.gate.records import FAIL, PASS, SKIP, GateRow, LoadedResult
from zgtool.stats import percentile

GROUP = "paired"


def _values(target: dict[str, Any], name: str) -> tuple[list[float], list[Hashable]]:
    values: list[float] = []
    groups: list[Hashable] = []
    for s in target.get("samples") or []:
        v = s.get(name) if s.get("ok") else None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            values.append(float(v))
            groups.append(s.get("round", 0))
    return values, groups


def _known_fields(data: dict[str, Any], targets: list[dict[str, Any]]) -> list[str]:
    """Per-request fields a latency_split result defines or carries."""
    names = {k for k in (data.get("definitions") or {}) if k.endswith("_ms")}
    for t in targets:
        for s in (t.get("samples") or [])[:5]:
            names.update(k for k, v in s.items() if k.endswith("_ms") and isinstance(v, int | float))
    return sorted(names)


def evaluate_paired(spec: PairedSpec, results: list[LoadedResult], *, resamples: int = 2000) -> list[GateRow]:
    pairs: list[tuple[LoadedResult, str, dict[str, Any], dict[str, Any]]] = []
    for res in (r for r in results if r.kind == "latency_split"):
        targets = res.result.get("data", {}).get("targets") or []
        if len(targets) < 2:
            continue
        known = _known_fields(res.result["data"], targets)
        for name in spec.fields:
            if name not in known:
                raise PolicyError(f"[paired] field {name!r} is not a per-request field of {res.label} "
                                  f"(it has: {', '.join(known) or 'no successful samples'})")
            pairs.extend((res, name, targets[0], cand) for cand in targets[1:])
    if not pairs:
        return [GateRow("paired regression", "candidate vs baseline in one run", "-", SKIP, group=GROUP,
                        detail="no latency_split result with a baseline and a candidate target")]
    values = [(_values(base, name), _values(cand, name)) for _, name, base, cand in pairs]
    # Bonferroni over the comparisons that have data, so the family-wise rate stays at 1 - confidence
    comparisons = max(1, sum(1 for (a, _), (b, _) in values if a and b))
    each = 1 - (1 - spec.confidence) / comparisons
    return [_row(spec, res, name, base, cand, a, ga, b, gb, each, resamples)
            for (res, name, base, cand), ((a, ga), (b, gb)) in zip(pairs, values, strict=True)]


def _row(spec: PairedSpec, res: LoadedResult, name: str, base: dict[str, Any], cand: dict[str, Any],
         a: list[float], ga: list[Hashable], b: list[float], gb: list[Hashable], each: float,
         resamples: int) -> GateRow:
    label = f"{cand.get('name')} vs {base.get('name')}: {name}"
    check = f"{name} median difference significant and > max({spec.material_ms:g} ms, {spec.material_ratio:.0%})"
    if not a or not b:  # e.g. ttft_ms of a non-streaming run
        return GateRow(label, check, res.label, SKIP, group=GROUP, detail=f"no {name} values on one side")
    d = median_difference(a, b, baseline_groups=ga, candidate_groups=gb, confidence=each, resamples=resamples)
    iv = d.interval
    threshold = spec.threshold_ms(percentile(a, 50))
    if iv.lo is None or iv.hi is None:
        return GateRow(label, check, res.label, SKIP, group=GROUP, detail=iv.note or f"too few samples ({iv.n})")
    breached = iv.lo > 0 and iv.estimate > threshold
    why = paired_why(iv.estimate, iv.lo, iv.hi, threshold, breached)
    detail = (f"{each:.2%} confidence per comparison, {iv.rounds or 0} paired rounds; allowance "
              f"max({spec.material_ms:g} ms, {spec.material_ratio:.0%} of the baseline's median "
              f"{percentile(a, 50):.3g} ms)")
    open_above = not breached and iv.hi > threshold
    if open_above:
        why += f"; {inconclusive_why(iv.hi, threshold)}"
    if open_above and spec.inconclusive == "unreliable":
        return GateRow(label, check, res.label, FAIL, (f"{name} interval high end", "threshold"), ("<=",),
                       (iv.hi, threshold), detail, group=GROUP, category=MEASUREMENT, why=why, inconclusive=True)
    return GateRow(label, check, res.label, FAIL if breached else PASS, (f"{name} difference", "threshold"),
                   (">",), (iv.estimate, threshold), detail, group=GROUP, why=why, inconclusive=open_above)


def inconclusive_why(hi: float, threshold: float) -> str:
    """Why a pass proves little: its interval still holds regressions above the allowance."""
    return (f"inconclusive: the interval reaches {hi:+.3g} ms, above the {threshold:.3g} ms allowance, so a "
            "regression that large could pass unseen (more rounds and requests, --rounds and -n, narrow it)")


def paired_why(estimate: float, lo: float, hi: float, threshold: float, breached: bool) -> str:
    """The outcome in words: '+3.9 ms, n.s.: interval [-0.4, +8.2] contains 0'."""
    iv = f"interval [{lo:+.3g}, {hi:+.3g}]"
    if breached:
        return (f"{estimate:+.3g} ms slower, significant: {iv} excludes 0, and above the {threshold:.3g} ms "
                "allowance")
    if lo > 0:
        return f"{estimate:+.3g} ms, significant but within the {threshold:.3g} ms allowance ({iv})"
    if hi < 0:
        return f"{estimate:+.3g} ms, faster: {iv} lies below 0"
    return f"{estimate:+.3g} ms, n.s.: {iv} contains 0"
