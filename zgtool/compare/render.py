"""compare's output: the verdict sentence first, then plain tables that never cut a number.

Tables are laid out as columns when the terminal is wide enough and as `label: value` rows
otherwise (numbers and intervals are never split or elided, at any width). `*` marks an interval
that excludes 0 (significant), `n.s.` one that does not.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from zgtool.compare.stats import Change, Interval, MetricRow, TaxRow


def fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def fmt_interval(iv: Interval, signed: bool = False, mark: bool = True) -> str:
    """`mean [lo, hi]`, with `*` / `n.s.` for a difference (whether the interval excludes 0)."""
    if iv.lo is None or iv.hi is None:
        return f"{fmt(iv.mean, signed)} (one run: no interval)"
    text = f"{fmt(iv.mean, signed)} [{fmt(iv.lo, signed)}, {fmt(iv.hi, signed)}]"
    if mark:
        text += " *" if (iv.lo > 0 or iv.hi < 0) else " n.s."
    return text


def layout(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """Columns when they fit in `width`, else one `header: value` line per cell, a blank line per row."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    if sum(widths) + 2 * (len(widths) - 1) <= width:
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
        out = [line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        return out
    out = []
    for r in rows:
        out += [f"{h}: {c}" for h, c in zip(headers, r, strict=True)] + [""]
    return out[:-1]


def verdict(labels: Sequence[str], metrics: list[MetricRow], taxes: list[TaxRow], regressions: int,
            inconclusive_taxes: int = 0) -> str:
    """One sentence that answers "what changed across these runs"; `inconclusive_taxes`: the hops' tax changes
    against the baseline that are not significant but whose intervals still reach a change that counts."""
    k = len(labels)
    # as latency-split's first line: outside the engine where every run has that figure (the engine's own
    # variation cannot touch it), else in total
    outside = next((t for t in taxes if t.phase == "outside_engine_ms" and all(d is not None for d in t.per_run)),
                   None)
    tax = outside or next((t for t in taxes if t.phase == "total_ms"), None)
    if tax is not None:
        iv = tax.across
        where = "outside the engine" if tax is outside else "in total"
        judged = sum(1 for d in tax.per_run if d is not None and (d[1] > 0 or d[2] < 0))
        head = (f"Across {k} runs, path {tax.candidate + 1} ({tax.candidate_name}) adds {fmt_interval(iv, signed=True)} ms per request "
                f"{where} over path 1 (between-run 95% t-interval; significant within {judged} of "
                f"{sum(1 for d in tax.per_run if d is not None)} runs)")
    else:
        row = next((m for m in metrics if m.metric == "total_ms"), None)
        head = (f"Across {k} runs, path 1 ({row.path_name}) total_ms p50 is {fmt_interval(row.across, mark=False)} "
                "ms (between-run 95% t-interval)") if row else f"Across {k} runs"
        if len({m.path for m in metrics}) > 1:
            head += "; no run gave a hop's tax an interval (too few figures per path: raise -n)"
    tail = ("no regression against the baseline" if regressions == 0
            else f"{regressions} regression(s) against the baseline {labels[0]}")
    if regressions == 0 and inconclusive_taxes:
        tail += (f", but {inconclusive_taxes} tax change(s) inconclusive: their intervals still reach a change that "
                 "counts (more requests narrow them)")
    return f"{head}; {tail}."


def metric_table(labels: Sequence[str], rows: list[MetricRow], width: int) -> list[str]:
    """One block per path (its name as the heading), a row per metric, a column per run."""
    out: list[str] = []
    for path in sorted({r.path for r in rows}):
        mine = [r for r in rows if r.path == path]
        out += [f"path {path + 1}: {mine[0].path_name}"]
        body = [[r.metric, *(fmt(v) for v in r.per_run), fmt_interval(r.across, mark=False)] for r in mine]
        out += layout(["metric", *labels, "across runs [95%]"], body, width) + [""]
    return out[:-1]


def tax_table(labels: Sequence[str], rows: list[TaxRow], width: int) -> list[str]:
    """One block per candidate path, a row per phase, a column per run (each run's paired interval)."""
    out: list[str] = []
    for cand in sorted({r.candidate for r in rows}):
        mine = [r for r in rows if r.candidate == cand]
        out += [f"path {cand + 1} minus path 1 ({mine[0].candidate_name}), ms:"]
        body = []
        for r in mine:
            cells = ["-" if d is None else f"{d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}] "
                     + ("*" if (d[1] > 0 or d[2] < 0) else "n.s.") for d in r.per_run]
            body.append([r.phase, *cells, fmt_interval(r.across, signed=True)])
        out += layout(["phase", *labels, "across runs"], body, width) + [""]
    return out[:-1]


def change_table(rows: list[Change], width: int, every: bool = False, effect: str = "max(0.2 ms, 2%)") -> list[str]:
    """The regressions and improvements (every comparison with `every`), then a count of the rest."""
    shown = rows if every else [c for c in rows if c.verdict in ("regression", "improvement")]
    headers = ["run", "path", "metric", "baseline", "change [95%]", "verdict"]
    body = [[c.run, str(c.path + 1), c.metric, fmt(c.baseline),
             f"{c.diff:+.2f}" + ("" if c.lo is None else f" [{c.lo:+.2f}, {c.hi:+.2f}]"),
             c.verdict + ("" if c.counted or c.verdict != "regression" else " (not counted)")]
            for c in shown]
    out = layout(headers, body, width) if body else ["no regression or improvement"]
    if any(c.verdict == "regression" and not c.counted for c in shown):
        out.append("(not counted): a path's own median in runs of two or more paths moves with the machine "
                   "between runs; what counts are the hops' taxes, measured within each run")
    rest = len(rows) - len(shown)
    if rest:
        unjudged = sum(1 for c in rows if c.verdict == "no interval")
        open_ = sum(1 for c in rows if c.verdict == "inconclusive")
        settled = rest - unjudged - open_
        parts = [f"{settled} no change (the interval within ±{effect})"] if settled else []
        parts += [f"{open_} inconclusive (no significant change, but the interval reaches past ±{effect}: "
                  "more requests narrow it)"] if open_ else []
        parts += [f"{unjudged} without an interval (throughput: one figure per run)"] if unjudged else []
        out += textwrap.wrap(f"{rest} other comparison(s): " + "; ".join(parts) + " (--every lists them)",
                             max(40, width), break_long_words=False, break_on_hyphens=False)
    return out


def summary_markdown(sentence: str, labels: Sequence[str], taxes: list[TaxRow], changed: list[Change],
                     effect: str = "max(0.2 ms, 2%)") -> str:
    """A CI comment: the sentence, the tax per hop across runs, and the regressions/improvements."""
    out = [f"**{sentence}**", ""]
    if taxes:
        out += ["| hop vs path 1 | phase | " + " | ".join(labels) + " | across runs |",
                "|---|---|" + "---|" * len(labels) + "---|"]
        for r in taxes:
            cells = ["-" if d is None else f"{d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]" for d in r.per_run]
            out.append(f"| {r.candidate_name} | {r.phase} | " + " | ".join(cells)
                       + f" | {fmt_interval(r.across, signed=True)} |")
        out.append("")
    flagged = [c for c in changed if c.verdict in ("regression", "improvement")]
    if flagged:
        out += ["| run | path | metric | baseline | this run | change | verdict |", "|---|---|---|---|---|---|---|"]
        out += [f"| {c.run} | {c.path_name} | {c.metric} | {c.baseline:.2f} | {c.value:.2f} | {c.diff:+.2f} "
                f"[{c.lo:+.2f}, {c.hi:+.2f}] | {c.verdict}"
                f"{'' if c.counted or c.verdict != 'regression' else ' (not counted)'} |" for c in flagged]
    else:
        out.append(f"No regression or improvement beyond the smallest effect that matters ({effect}).")
    return "\n".join(out) + "\n"
