"""Terminal rendering of a latency split: an httpstat-like waterfall per target and a side-by-side table.

Rendering only: everything shown comes from the SplitResult the measurement produced.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from zgtool.latency.analysis.phases import MIN_FIGURES
from zgtool.latency.analysis.phases import phase as find_phase
from zgtool.latency.records import PhaseDifference, PhaseStats, SplitResult, TargetResult
from zgtool.latency.render.fit import fits, natural_width, printed_text

MIN_BAR_WIDTH = 6
ENGINE_ROWS = ("queue_ms", "prefill_ms", "decode_ms", "detok_ms", "safety_ms", "engine_other_ms")
LABELS = {
    "dns_ms": "DNS lookup", "connect_ms": "TCP connect", "tls_ms": "TLS handshake", "send_ms": "send request",
    "gw_other_ms": "gateway other+hop", "queue_ms": "engine queue", "prefill_ms": "engine prefill",
    "decode_ms": "engine decode", "detok_ms": "engine detok", "safety_ms": "engine safety",
    "engine_other_ms": "engine other", "engine_front_ms": "engine front (API server)",
    "network_client_ms": "network + client",
    "ttfb_ms": "TTFB", "ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL (every gap)",
    "ttfb_headers_ms": "TTFB, head complete", "ttfb_body_ms": "TTFB, first body byte",
    "ttft_any_ms": "TTFT, any token",
    "total_ms": "total (E2E)", "outside_engine_ms": "outside engine",
    "gateway_before_call_ms": "gateway before call", "gateway_call_ms": "gateway call (spans)",
    "gateway_after_call_ms": "gateway after call",
}
COLORS = {"dns_ms": "cyan", "connect_ms": "cyan", "tls_ms": "cyan",
          "network_client_ms": "white"}
SHORT_NAME_MAX = 10     # longer target names (URLs) become A, B, C with a legend


def label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    if name.startswith("gw_"):
        return "gateway " + name[3:].removesuffix("_ms")
    return name.removesuffix("_ms").replace("_", " ")


def _color(name: str) -> str:
    if name in COLORS:
        return COLORS[name]
    return "magenta" if name.startswith("gw_") else "green"


def short_names(names: list[str]) -> dict[str, str]:
    """Column headers that fit 80 columns: short names stay, URLs and long names become A, B, ..."""
    out: dict[str, str] = {}
    letters = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    for n in names:
        out[n] = n if len(n) <= SHORT_NAME_MAX and "://" not in n else next(letters)
    return out


def legend(names: list[str], short: dict[str, str]) -> Text | None:
    pairs = [f"{short[n]} = {n}" for n in names if short[n] != n]
    return Text("  " + "; ".join(pairs), style="dim") if pairs else None


def fmt_ms(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _digits(*values: float) -> int:
    """One precision for a figure and its bounds: 2 decimals under 10, 1 under 1000, else none."""
    m = max(abs(v) for v in values)
    return 2 if m < 10 else 1 if m < 1000 else 0


def fmt_ci(lo: float | None, hi: float | None, *, signed: bool = True) -> str:
    """`[+10.7, +92.4]`: the interval's own bounds, never a ± that reads as containing 0 or not."""
    if lo is None or hi is None:
        return "[–]"
    d = _digits(lo, hi)
    f = f"{{:{'+' if signed else ''}.{d}f}}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


def fmt_pm(value: float, lo: float | None, hi: float | None, *, signed: bool = False, clip: bool = True) -> str:
    """`6.44 [6.20, 6.71]`: the figure and its 95% interval as bounds (a latency's never below 0). A remainder's
    (clip=False) can be below 0, where a clipped 0.00 would read as a finding."""
    s = f"{value:+.2f}" if signed else f"{value:.2f}"
    if lo is None or hi is None:
        return s
    if not signed and clip:
        lo, hi = max(lo, 0.0), max(hi, 0.0)
    return f"{s} {fmt_ci(lo, hi, signed=signed)}"


def fmt_p50(p: PhaseStats | None) -> str:
    """The median and its interval; with how many of the ok requests it rests on when not all of them, and
    no interval from under 8 figures ("too few: k of n kept")."""
    if p is None or p.summary.get("p50") is None:
        return "-"
    s = fmt_pm(p.summary["p50"], p.median_lo, p.median_hi, clip=p.ci_method != "linear")
    if p.ci_note is not None and p.count >= MIN_FIGURES:
        s = f"{s} ({p.ci_note})"
    if p.count < MIN_FIGURES:
        return f"{s} (too few: {p.count} of {p.of if p.of is not None else p.count} kept)"
    return s if p.of is None or p.count >= p.of else f"{s} ({p.count}/{p.of})"


SIGNIFICANT, NOT_SIGNIFICANT_MARK = "*", "n.s."


def fmt_diff(d: PhaseDifference | None) -> Text:
    """`+36.33 [+10.7, +92.4] *`: red when higher, green when lower, dim when the interval contains 0; the
    text marker (`*` significant, `n.s.` not) says the same in a pipe, a file or under NO_COLOR."""
    if d is None or d.diff_ms is None:
        return Text(d.note if d is not None and d.note else "-", style="dim")
    style = {"higher": "red", "lower": "green"}.get(d.verdict, "dim")
    mark = SIGNIFICANT if d.verdict in ("higher", "lower") else NOT_SIGNIFICANT_MARK
    if d.lo_ms is None and d.note:          # "no interval (1 distinct value)": no CI, so no marker either
        k = d.note.removeprefix("no interval (").split(" ")[0]
        return Text(f"{d.diff_ms:+.2f} (no CI: {k} value{'s' if k != '1' else ''})", style="dim")
    return Text(f"{fmt_pm(d.diff_ms, d.lo_ms, d.hi_ms, signed=True)} {mark:<4}", style=style)


def _bar(offset: float, width: float, scale: float, style: str, bar_width: int) -> Text:
    """A waterfall segment: starts where the previous phases ended, on a scale shared by all targets."""
    if scale <= 0:
        return Text("")
    start = int(round(offset / scale * bar_width))
    cells = width / scale * bar_width
    body = "█" * int(round(cells)) if cells >= 0.5 else ("▏" if width > 0 else "")
    return Text(" " * min(start, bar_width)) + Text(body, style=style)


def _title(tr: TargetResult, res: SplitResult, short: str) -> str:
    cfg = res.config
    o = tr.open_loop
    if cfg["new_connection"]:
        mode = "new connection per request"
    elif o is not None:     # open loop: the pool grows with the requests in flight, not -c
        rate = f"{o.target_rate_rps:g} req/s" if o.target_rate_rps is not None else "a schedule"
        mode = f"open loop {rate}, keep-alive, {o.workers_max if o.workers_max is not None else '?'} workers"
    else:
        mode = f"keep-alive, {cfg['concurrency']} conn"
    name = short if short == tr.name else f"{short} = {tr.name}"
    where = "" if tr.url in (tr.name, tr.name + "/v1/messages", tr.name + "/v1/chat/completions") else f"  {tr.url}"
    resent = sum(1 for s in tr.samples if s.resent_after is not None)
    return (f"[bold]{name}[/bold]{where}\n{tr.api}, {'stream' if cfg['stream'] else 'no-stream'}, "
            f"{mode}, ok {tr.num_ok}/{tr.num_ok + tr.num_error}" + (f", {resent} resent" if resent else ""))


def _unattributed(tr: TargetResult) -> bool:
    """No engine phase reached the client on this path: its rest holds the engine's time too."""
    return not any(find_phase(tr, p) is not None for p in ENGINE_ROWS)


def row_label(name: str, engine_unknown: bool) -> str:
    if name == "network_client_ms" and engine_unknown:
        return "unattributed"
    return label(name)


def _waterfall_table(tr: TargetResult, res: SplitResult, scale: float, title: str, *, bar_width: int,
                     with_ci: bool) -> Table:
    t = Table(title=title, title_justify="left", box=None, pad_edge=False, show_edge=False)
    t.add_column("phase", overflow="fold")
    t.add_column("mean", justify="right", no_wrap=True)
    t.add_column("p50 [95% CI]" if with_ci else "p50", justify="right", no_wrap=True)
    t.add_column("p99", justify="right", no_wrap=True)
    t.add_column("seen", justify="right", no_wrap=True)
    if bar_width:
        t.add_column("waterfall", no_wrap=True, max_width=bar_width, overflow="crop")
    unknown = _unattributed(tr)
    offset = 0.0
    for name in res.waterfall_phases:
        p = find_phase(tr, name)
        if p is None or p.waterfall_mean_ms is None:
            continue
        seen = "" if p.count == tr.num_ok else f"{p.count}/{tr.num_ok}"
        cells: list[str | Text] = [row_label(name, unknown), fmt_ms(p.waterfall_mean_ms),
                                   fmt_p50(p) if with_ci else fmt_ms(p.summary.get("p50")),
                                   fmt_ms(p.summary.get("p99")), seen]
        if bar_width:
            cells.append(_bar(offset, max(p.waterfall_mean_ms, 0.0), scale, _color(name), bar_width))
        t.add_row(*cells)
        offset += max(p.waterfall_mean_ms, 0.0)
    for name in res.metric_phases:
        p = find_phase(tr, name)
        if p is not None:
            cells = [Text(label(name), style="bold"), fmt_ms(p.summary.get("mean")),
                     fmt_p50(p) if with_ci else fmt_ms(p.summary.get("p50")), fmt_ms(p.summary.get("p99")),
                     str(p.count)]
            t.add_row(*cells, *([""] if bar_width else []))
    if (tc := trace_cell(tr)) is not None:
        t.add_row(Text("trace context", style="bold"), "", tc[0], "", tc[1], *([""] if bar_width else []))
    return t


def trace_cell(tr: TargetResult) -> tuple[str, str] | None:
    """(what happened to the path's traceparent, on how many requests): from the engine's echo of the trace id,
    else from the engine's spans (--otlp-listen); None when neither came back."""
    if (e := tr.trace_echo) is not None:
        if e["verdict"] == "mixed":
            how = ", ".join(f"{e[v]} {v}" for v in ("survived", "rewritten", "dropped") if e[v])
            return f"mixed: {how} (echo)", str(e["sent"])
        return f"{e['verdict']} (echo)", str(e["sent"])
    if (c := tr.trace_context) is not None:
        return f"{c['verdict']} ({c['came_back']}/{c['sent']} spans)", str(c["sent"])
    return None


def _lines(renderable: object, width: int) -> int:
    return len(printed_text(renderable, width).splitlines())


def bar_room(tr: TargetResult, res: SplitResult, width: int, *, with_ci: bool = True) -> int:
    """The widest waterfall bar that leaves every other cell of this path's table as it is at full width."""
    bare = _waterfall_table(tr, res, 0.0, "", bar_width=0, with_ci=with_ci)
    need = _lines(bare, 1000)
    room = width - natural_width(bare) - 2
    while room >= MIN_BAR_WIDTH:
        if _lines(_waterfall_table(tr, res, 0.0, "", bar_width=room, with_ci=with_ci), width) <= need:
            return room
        room -= 1
    return 0


def waterfall(tr: TargetResult, res: SplitResult, scale: float, *, short: str | None = None,
              width: int = 80, bar_width: int | None = None) -> Table:
    """The path's phases with their figures and a waterfall bar. Numbers are never cut: the bar takes
    only the width they leave (`bar_width`, the same for every path when given), and goes when that is
    under MIN_BAR_WIDTH; at a width too narrow even then, the medians lose their interval before any
    figure is cut."""
    title = _title(tr, res, short or tr.name)
    for with_ci in (True, False):
        room = bar_room(tr, res, width, with_ci=with_ci) if bar_width is None else bar_width
        if room >= MIN_BAR_WIDTH:
            table = _waterfall_table(tr, res, scale, title, bar_width=room, with_ci=with_ci)
            if fits(table, width):
                return table
        bare = _waterfall_table(tr, res, scale, title, bar_width=0, with_ci=with_ci)
        if fits(bare, width):
            return bare
    return bare


def subsets_text(tr: TargetResult, short: str | None = None) -> Text | None:
    """The table's footnote where its figures rest on different requests (issue 38: a TTFB p50 above the
    total p50 is then no contradiction)."""
    if not tr.subsets:
        return None
    of, kept = tr.subsets["of"], tr.subsets["kept"]
    counts = ", ".join(f"{label(name)} {k} of {of}" for name, k in kept.items())
    return Text(f"  {short or tr.name}: figures from different subsets of requests ({counts}): a median of one "
                "may exceed another's", style="dim")


def errors_text(tr: TargetResult, short: str | None = None) -> Text | None:
    if not tr.errors:
        return None
    parts = ", ".join(f"{k} x{v}" for k, v in sorted(tr.errors.items(), key=lambda kv: -kv[1]))
    return Text(f"  {short or tr.name}: {tr.num_error} of {tr.num_ok + tr.num_error} requests failed "
                f"(excluded from the figures): {parts}", style="bold red")


def lag_text(tr: TargetResult, short: str) -> Text | None:
    """Requests whose receive times zgtool's own client cannot vouch for: it waited for a CPU,
    found bytes already queued, or took several sends in one read, while they arrived for longer
    than the tolerance."""
    ok = [s for s in tr.samples if s.ok]
    lagged = [s for s in ok if s.lagged]
    if not lagged:
        return None
    worst = max(s.client_lag_ms or 0.0 for s in lagged)
    # latency-split leaves them out of its ttfb/ttft figures (num_lagged); older results kept them
    fate = ("left out of the TTFB/TTFT figures" if tr.num_lagged else "their TTFB/TTFT may be late by that much")
    return Text(f"  {short}: {len(lagged)} of {len(ok)} requests flagged: zgtool's client lagged up to "
                f"{worst:.2f} ms (CPU busy, or woken late and read several sends at once): {fate}",
                style="yellow")


def _side_table(res: SplitResult, short: dict[str, str], candidates: list[TargetResult], *,
                with_ci: bool) -> Table:
    base = res.targets[0]
    t = Table(title=f"side by side: p50 ms; difference of medians vs {short[base.name]} [95% CI]",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    t.add_column("phase", overflow="fold")
    shown = [base, *candidates]
    for tr in shown:
        t.add_column(short[tr.name], justify="right", no_wrap=True)
    for tr in candidates:
        t.add_column(f"{short[tr.name]} - {short[base.name]}", justify="right", no_wrap=True)
    diffs = {(d.candidate, d.phase): d for d in res.differences}
    unknown = any(_unattributed(tr) for tr in shown)
    for name in [*res.waterfall_phases, *res.metric_phases]:
        cells: list[str | Text] = [row_label(name, unknown)]
        for tr in shown:
            p = find_phase(tr, name)
            cells.append(fmt_p50(p) if with_ci else fmt_ms(p.summary.get("p50") if p is not None else None))
        cells += [fmt_diff(diffs.get((tr.name, name))) for tr in candidates]
        t.add_row(*cells)
    return t


def side_by_side(res: SplitResult, short: dict[str, str] | None = None, width: int = 80) -> Table | Group:
    """Each path's median and each difference with its interval. Numbers are never cut: when the
    table does not fit, the medians lose their intervals, then each candidate gets its own table."""
    short = short or short_names([tr.name for tr in res.targets])
    cands = res.targets[1:]
    layouts: list[Table | Group] = [_side_table(res, short, cands, with_ci=True)] if len(cands) == 1 else []
    layouts.append(_side_table(res, short, cands, with_ci=False))
    if len(cands) > 1:
        layouts.append(Group(*(_side_table(res, short, [c], with_ci=False) for c in cands)))
    for layout in layouts:
        if fits(layout, width):
            return layout
    return _side_records(res, short, cands)


def _side_records(res: SplitResult, short: dict[str, str], candidates: list[TargetResult]) -> Group:
    """The side-by-side figures one phase a block, `path  figure` a line, for a terminal too narrow for any
    table of them: no figure is cut and no phase name is folded."""
    base = res.targets[0]
    diffs = {(d.candidate, d.phase): d for d in res.differences}
    unknown = any(_unattributed(tr) for tr in [base, *candidates])
    keys = [short[tr.name] for tr in (base, *candidates)]
    keys += [f"{short[tr.name]} - {short[base.name]}" for tr in candidates]
    key_w = max(len(k) for k in keys)
    parts: list[Text] = [Text(f"side by side: p50 ms; difference of medians vs {short[base.name]} [95% CI]")]
    for name in [*res.waterfall_phases, *res.metric_phases]:
        medians = [fmt_p50(find_phase(tr, name)) for tr in (base, *candidates)]
        if all(m == "-" for m in medians) and not any((tr.name, name) in diffs for tr in candidates):
            continue        # no path has this phase: a row of dashes in the table, left out here
        parts.append(Text(row_label(name, unknown), style="bold"))
        for tr, median in zip((base, *candidates), medians, strict=True):
            parts.append(Text(f"  {short[tr.name]:<{key_w}}  {median}"))
        for tr in candidates:
            parts.append(Text(f"  {short[tr.name] + ' - ' + short[base.name]:<{key_w}}  ")
                         + fmt_diff(diffs.get((tr.name, name))))
    return Group(*parts)


def render(res: SplitResult, console: Console) -> None:
    means = [p.waterfall_mean_ms or 0.0 for tr in res.targets for p in tr.phases if p.waterfall_mean_ms]
    totals = [sum(max(p.waterfall_mean_ms or 0.0, 0.0) for p in tr.phases if p.waterfall_mean_ms is not None)
              for tr in res.targets]
    scale = max(totals) if totals and means else 0.0
    short = short_names([tr.name for tr in res.targets])
    blocks: list[Table | Text | Group] = []
    # one bar width for every path, so that bars on the shared scale compare
    room = min(bar_room(tr, res, console.width) for tr in res.targets)
    for tr in res.targets:
        blocks.append(waterfall(tr, res, scale, short=short[tr.name], width=console.width, bar_width=room))
        if (err := errors_text(tr, short[tr.name])) is not None:
            blocks.append(err)
        if (sub := subsets_text(tr, short[tr.name])) is not None:
            blocks.append(sub)
        blocks.append(Text(""))
    if len(res.targets) > 1:
        blocks.append(side_by_side(res, short, width=console.width))
        if (lg := legend([tr.name for tr in res.targets], short)) is not None:
            blocks.append(lg)
    from zgtool.latency.attribution.join import Boot, join_data
    from zgtool.latency.render.join import render_join

    joined = join_data(res.targets, Boot.of(res.config))
    if any(p["engine_sources"] or p["hops_self_ms"] for p in joined["paths"].values()):
        blocks.append(render_join(joined, short, console.width))   # type: ignore[arg-type]
    for tr in res.targets:
        if (lag := lag_text(tr, short[tr.name])) is not None:
            blocks.append(lag)
    for name, parts in res.unattributed_parts.items():
        blocks.append(Text(f"  {short[name]}: Server-Timing parts not attributed (overlap unknown): "
                           f"{', '.join(parts)}", style="dim"))
    blocks.append(Text("  ms; [lo, hi] = 95% bootstrap CI (a latency's on log latency, never negative; "
                       "none from under 3 distinct values; a remainder's can be); * = significant (its CI excludes 0), n.s. = not significant (its CI "
                       "contains 0). TTFT/E2E from request start; ITL = every gap; TPOT = "
                       "(E2E - TTFT)/(tokens - 1) (vLLM). Waterfall rows sum to the mean total; unattributed = "
                       "time no Server-Timing part or engine adapter explains.", style="dim"))
    console.print(Group(*blocks))
