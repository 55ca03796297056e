"""Terminal rendering of a latency split: an httpstat-like waterfall per target and a side-by-side table.

Rendering only: everything shown comes from the SplitResult the measurement produced.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from zgtool.latency.analysis import phase as find_phase
from zgtool.latency.model import PhaseDifference, PhaseStats, SplitResult, TargetResult

BAR_WIDTH = 44
LABELS = {
    "dns_ms": "DNS lookup", "connect_ms": "TCP connect", "tls_ms": "TLS handshake", "send_ms": "send request",
    "gw_other_ms": "gateway other (incl. hop)", "queue_ms": "engine queue", "prefill_ms": "engine prefill",
    "decode_ms": "engine decode", "detok_ms": "engine detok", "safety_ms": "engine safety",
    "engine_other_ms": "engine other", "network_client_ms": "network + client (incl. send)",
    "ttfb_ms": "TTFB (1st byte out -> 1st in)", "ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL (every gap)",
    "total_ms": "total (E2E)",
}
COLORS = {"dns_ms": "cyan", "connect_ms": "cyan", "tls_ms": "cyan",
          "network_client_ms": "white"}


def label(name: str) -> str:
    if name in LABELS:
        return LABELS[name]
    if name.startswith("gw_"):
        return "gateway " + name[3:].removesuffix("_ms")
    return name


def _color(name: str) -> str:
    if name in COLORS:
        return COLORS[name]
    return "magenta" if name.startswith("gw_") else "green"


def fmt_ms(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_p50(p: PhaseStats | None) -> str:
    if p is None:
        return "-"
    s = fmt_ms(p.summary.get("p50"))
    if p.median_lo is not None and p.median_hi is not None:
        s += f" [{p.median_lo:.2f}, {p.median_hi:.2f}]"
    return s


def fmt_diff(d: PhaseDifference | None) -> Text:
    if d is None or d.diff_ms is None:
        return Text("-", style="dim")
    ci = f" [{d.lo_ms:+.2f}, {d.hi_ms:+.2f}]" if d.lo_ms is not None and d.hi_ms is not None else ""
    if d.verdict == "higher":
        return Text(f"{d.diff_ms:+.2f}{ci}", style="red")
    if d.verdict == "lower":
        return Text(f"{d.diff_ms:+.2f}{ci}", style="green")
    # the interval is in the JSON; here the point is that no cost or saving can be claimed
    return Text(f"{d.diff_ms:+.2f} not significant", style="dim")


def _bar(offset: float, width: float, scale: float, style: str) -> Text:
    """A waterfall segment: starts where the previous phases ended, on a scale shared by all targets."""
    if scale <= 0:
        return Text("")
    start = int(round(offset / scale * BAR_WIDTH))
    cells = width / scale * BAR_WIDTH
    body = "█" * int(round(cells)) if cells >= 0.5 else ("▏" if width > 0 else "")
    return Text(" " * min(start, BAR_WIDTH)) + Text(body, style=style)


def waterfall(tr: TargetResult, res: SplitResult, scale: float) -> Table:
    cfg = res.config
    mode = "new connection per request" if cfg["new_connection"] else f"keep-alive, {cfg['concurrency']} conn"
    where = "" if tr.url == tr.name else f"  {tr.url}"
    title = (f"[bold]{tr.name}[/bold]{where}  {tr.api}  {'stream' if cfg['stream'] else 'no-stream'}  "
             f"{mode}  ok {tr.num_ok}/{tr.num_ok + tr.num_error}")
    t = Table(title=title, title_justify="left", box=None, pad_edge=False, show_edge=False)
    t.add_column("phase")
    t.add_column("mean ms", justify="right")
    t.add_column("p50 ms [95% CI]", justify="right")
    t.add_column("p99 ms", justify="right")
    t.add_column("seen", justify="right")
    t.add_column("waterfall (mean per request)", no_wrap=True)
    offset = 0.0
    for name in res.waterfall_phases:
        p = find_phase(tr, name)
        if p is None or p.waterfall_mean_ms is None:
            continue
        seen = "" if p.count == tr.num_ok else f"{p.count}/{tr.num_ok}"
        t.add_row(label(name), fmt_ms(p.waterfall_mean_ms), fmt_p50(p), fmt_ms(p.summary.get("p99")), seen,
                  _bar(offset, max(p.waterfall_mean_ms, 0.0), scale, _color(name)))
        offset += max(p.waterfall_mean_ms, 0.0)
    for name in res.metric_phases:
        p = find_phase(tr, name)
        if p is not None:
            t.add_row(Text(label(name), style="bold"), fmt_ms(p.summary.get("mean")), fmt_p50(p),
                      fmt_ms(p.summary.get("p99")), str(p.count), "")
    return t


def errors_text(tr: TargetResult) -> Text | None:
    if not tr.errors:
        return None
    parts = ", ".join(f"{k} x{v}" for k, v in sorted(tr.errors.items(), key=lambda kv: -kv[1]))
    return Text(f"  {tr.name}: {tr.num_error} of {tr.num_ok + tr.num_error} requests failed "
                f"(excluded from the figures): {parts}", style="bold red")


def side_by_side(res: SplitResult) -> Table:
    base = res.targets[0]
    t = Table(title="side by side: p50 ms [95% CI]; difference of medians vs "
                    f"{base.name} [95% CI]", title_justify="left")
    t.add_column("phase")
    for tr in res.targets:
        t.add_column(tr.name, justify="right")
    for tr in res.targets[1:]:
        t.add_column(f"{tr.name} - {base.name}", justify="right")
    diffs = {(d.candidate, d.phase): d for d in res.differences}
    for name in [*res.waterfall_phases, *res.metric_phases]:
        cells: list[str | Text] = [label(name)]
        cells += [fmt_p50(find_phase(tr, name)) for tr in res.targets]
        cells += [fmt_diff(diffs.get((tr.name, name))) for tr in res.targets[1:]]
        t.add_row(*cells)
    return t


def render(res: SplitResult, console: Console) -> None:
    means = [p.waterfall_mean_ms or 0.0 for tr in res.targets for p in tr.phases if p.waterfall_mean_ms]
    totals = [sum(max(p.waterfall_mean_ms or 0.0, 0.0) for p in tr.phases if p.waterfall_mean_ms is not None)
              for tr in res.targets]
    scale = max(totals) if totals and means else 0.0
    blocks: list[Table | Text] = []
    for tr in res.targets:
        blocks.append(waterfall(tr, res, scale))
        if (err := errors_text(tr)) is not None:
            blocks.append(err)
        blocks.append(Text(""))
    if len(res.targets) > 1:
        blocks.append(side_by_side(res))
    for name, parts in res.unattributed_parts.items():
        blocks.append(Text(f"  {name}: Server-Timing parts not attributed (overlap unknown): {', '.join(parts)}",
                           style="dim"))
    blocks.append(Text("  TTFT/E2E from request start (incl. DNS/connect/TLS when paid); ITL = every gap; "
                       "TPOT = (E2E - TTFT)/(tokens - 1) (vLLM definitions). Waterfall rows sum to mean total.",
                       style="dim"))
    console.print(Group(*blocks))
