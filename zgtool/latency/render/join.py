"""Terminal rendering of the join (zgtool.latency.attribution.join.join_data): per path, the engine's source and
phases, each hop's self-report, the time outside the engine and the unexplained remainder; then each hop's
self-report beside its externally measured tax. Rendering only."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from zgtool.latency.render.fit import fits


def _cell(stat: dict[str, Any] | None, clip: bool = True) -> str:
    """A median and its interval; a latency's bounds are clipped at 0 (`clip=False` for remainders, which
    can be negative)."""
    if not stat:
        return "-"
    lo, hi = stat.get("lo_ms"), stat.get("hi_ms")
    if lo is None or hi is None:
        note = stat.get("note")
        if note == "within its resolution":
            return f"{stat['median_ms']:.2f} (within its {stat.get('resolution_ms', 1):g} ms resolution)"
        return f"{stat['median_ms']:.2f}" + (f" ({note})" if note else "")
    if clip:
        lo, hi = max(lo, 0.0), max(hi, 0.0)
    return f"{stat['median_ms']:.2f} [{lo:.2f}, {hi:.2f}]"


def _diff_cell(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    if d.get("verdict") == "within its resolution":
        return "within its resolution"
    lo, hi = d.get("lo_ms"), d.get("hi_ms")
    iv = "" if lo is None or hi is None else f" [{lo:+.2f}, {hi:+.2f}]"
    return f"{d['diff_ms']:+.2f}{iv}"


def join_table(join: dict[str, Any], short: dict[str, str]) -> Table:
    t = Table(title="Where each millisecond went (medians, 95% CI)", box=box.SIMPLE_HEAD, title_justify="left")
    t.add_column("path")
    t.add_column("engine source")
    t.add_column("total", justify="right")
    t.add_column("engine total", justify="right")
    t.add_column("engine phases", justify="left")
    t.add_column("hops (self-reported)", justify="left")
    t.add_column("outside engine", justify="right")
    t.add_column("unexplained", justify="right")
    for name, p in join["paths"].items():
        sources = ", ".join(f"{s} ({n})" for s, n in p["engine_sources"].items()) or "none"
        phases = "; ".join(f"{k} {v['median_ms']:.2f}" for k, v in p["engine_phases_ms"].items() if v) or "-"
        hops = "; ".join(f"{h} {v['median_ms']:.2f}" for h, v in p["hops_self_ms"].items() if v) or "-"
        rem = _cell(p["remainder_ms"], clip=False)
        if p["flagged"]:
            rem += f" ! {p['flagged']} below -{p['clock_tolerance_ms']:g}"
        t.add_row(short.get(name, name), sources, _cell(p["total_ms"]), _cell(p["engine_total_ms"]), phases,
                  hops, _cell(p["outside_engine_ms"]), rem)
    return t


def join_list(join: dict[str, Any], short: dict[str, str]) -> Table:
    """The join table turned on its side (one figure a line) for a terminal too narrow for its 8 columns:
    numbers are never cut."""
    t = Table(title="Where each millisecond went (medians, 95% CI)", box=None, title_justify="left",
              show_header=False, pad_edge=False)
    t.add_column("figure", style="dim", no_wrap=True)
    t.add_column("value", overflow="fold")
    for name, p in join["paths"].items():
        t.add_row(Text(short.get(name, name), style="bold"), "")
        sources = ", ".join(f"{s} ({n})" for s, n in p["engine_sources"].items()) or "none"
        phases = "; ".join(f"{k} {v['median_ms']:.2f}" for k, v in p["engine_phases_ms"].items() if v) or "-"
        hops = "; ".join(f"{h} {v['median_ms']:.2f}" for h, v in p["hops_self_ms"].items() if v) or "-"
        rem = _cell(p["remainder_ms"], clip=False)
        if p["flagged"]:
            rem += f" ! {p['flagged']} below -{p['clock_tolerance_ms']:g}"
        for k, v in (("  engine source", sources), ("  total", _cell(p["total_ms"])),
                     ("  engine total", _cell(p["engine_total_ms"])), ("  engine phases", phases),
                     ("  hops (self-reported)", hops), ("  outside engine", _cell(p["outside_engine_ms"])),
                     ("  unexplained", rem)):
            t.add_row(k, v)
    return t


def audit_table(join: dict[str, Any], short: dict[str, str]) -> Table | None:
    if not join["hop_audit"]:
        return None
    t = Table(title="Each hop's self-report beside its measured tax", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("path", "hop", "self-reported", "measured tax", "not in its report"):
        t.add_column(col, justify="left" if col in ("path", "hop") else "right")
    for a in join["hop_audit"]:
        t.add_row(short.get(a["path"], a["path"]), a["hop"], _cell(a["self_ms"]), _diff_cell(a["measured_tax_ms"]),
                  _diff_cell(a["unreported_ms"]))
    return t


def audit_list(join: dict[str, Any], short: dict[str, str]) -> Table:
    """The hop audit on its side, for a terminal too narrow for its columns."""
    t = Table(title="Each hop's self-report beside its measured tax", box=None, title_justify="left",
              show_header=False, pad_edge=False)
    t.add_column("figure", style="dim", no_wrap=True)
    t.add_column("value", overflow="fold")
    for a in join["hop_audit"]:
        t.add_row(Text(f"{short.get(a['path'], a['path'])}: {a['hop']}", style="bold"), "")
        for k, v in (("  self-reported", _cell(a["self_ms"])), ("  measured tax", _diff_cell(a["measured_tax_ms"])),
                     ("  not in its report", _diff_cell(a["unreported_ms"]))):
            t.add_row(k, v)
    return t


def render_join(join: dict[str, Any], short: dict[str, str], width: int | None = None) -> Group:
    table = join_table(join, short)
    blocks: list[Table | Text] = [table if width is None or fits(table, width) else join_list(join, short)]
    if (audit := audit_table(join, short)) is not None:
        blocks.append(audit if width is None or fits(audit, width) else audit_list(join, short))
    starts = {s for p in join["paths"].values() for s in p["engine_ttft_start"]}
    for s in sorted(starts):
        blocks.append(Text(f"  engine TTFT {s}", style="dim"))
    blocks.append(Text("  unexplained = total - DNS/connect/TLS - hops' own reported time - engine total (- the "
                       "engine front, where shown): client, sending, network and what no hop reports of itself; "
                       "! N below -1: N requests whose reported parts exceed their total (clocks or a wrong "
                       "report); measured tax = time outside the engine minus the baseline's (paired by round)",
                       style="dim"))
    return Group(*blocks)
