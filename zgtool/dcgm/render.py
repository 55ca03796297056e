"""Rich rendering for `dcgm watch` (table + sparklines + alerts) and `defrag` (before/after)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from zgtool.dcgm.watch import GpuTimeline, WatchState

BARS = "▁▂▃▄▅▆▇█"
GIB = 1024**3


def sparkline(values: list[float], lo: float | None = None, hi: float | None = None) -> str:
    """Unicode bars; fixed lo/hi for percentages so 5% never looks like a full bar."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    if hi <= lo:
        return BARS[0] * len(values) if hi == 0 else BARS[len(BARS) // 2] * len(values)
    span = hi - lo
    out = []
    for v in values:
        frac = min(max((v - lo) / span, 0.0), 1.0)
        out.append(BARS[min(int(frac * len(BARS)), len(BARS) - 1)])
    return "".join(out)


def _cell(tl: GpuTimeline, name: str, fmt: str, width: int, lo: float | None, hi: float | None,
          scale: float = 1.0) -> Text:
    """The last value, and under it the recent history as a sparkline."""
    last = tl.last().get(name)
    if last is None:
        return Text("-", style="dim")
    spark = sparkline([v * scale for v in tl.recent(name, width)], lo, hi)
    return Text.assemble((fmt.format(last * scale).strip(), "bold"), "\n", (spark, "cyan"))


def _fb_cell(tl: GpuTimeline, width: int) -> Text:
    last = tl.last()
    if "fb_used_bytes" not in last:
        return Text("-", style="dim")
    used = last["fb_used_bytes"] / GIB
    total = last.get("fb_total_bytes")
    head = f"{used:.1f}/{total / GIB:.1f} GiB" if total else f"{used:.1f} GiB"
    spark = sparkline(tl.recent("fb_used_pct", width), 0, 100) if total else ""
    return Text.assemble((head, "bold"), "\n", (spark, "cyan"))


GPU_COLUMNS = (   # header, series that fill it
    ("util%", ("gpu_util_pct",)), ("copy%", ("mem_copy_util_pct",)),
    ("FB used", ("fb_used_bytes",)), ("MHz", ("sm_clock_mhz",)), ("W", ("power_w",)),
)
LABEL_WIDTH = 18
ALERTS_WIDTH = 9


def _has(state: WatchState, names: tuple[str, ...]) -> bool:
    return any(n in tl.series or n in tl.last() for tl in state.gpus.values() for n in names)


def watch_table(state: WatchState, width: int | None = None, max_width: int = 80) -> Group:
    """The live table. Columns no source filled (the engine on a CPU has no GPU util, clocks or
    power) are left out, and the sparklines share what is left of `max_width`."""
    has_engine = _has(state, ("kv_util_pct", "running"))
    gpu_cols = [(head, names) for head, names in GPU_COLUMNS if _has(state, names)]
    if width is None:
        n_spark = len(gpu_cols) + (1 if has_engine else 0)
        n_cols = n_spark + 2 + (1 if has_engine else 0)
        fb_text = 8 if any(n == ("fb_used_bytes",) for _, n in gpu_cols) else 0    # "71.0/79.6 GiB" > a spark
        spare = max_width - LABEL_WIDTH - ALERTS_WIDTH - fb_text - (14 if has_engine else 0) - 3 * n_cols
        width = max(4, min(20, spare // max(1, n_spark)))
    title = f"{state.source.get('kind')} {state.source.get('url') or state.source.get('host', '')}"
    table = Table(title=f"GPU golden metrics — {title} — {state.ticks} samples, {state.elapsed_s:.0f}s",
                  title_justify="left", expand=False, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("GPU" if gpu_cols else "device", no_wrap=True, max_width=LABEL_WIDTH, overflow="ellipsis")
    for head, _ in gpu_cols:
        table.add_column(head, justify="right", no_wrap=True)
    if has_engine:
        table.add_column("KV %", justify="right", no_wrap=True)
        table.add_column("run/wait/batch", justify="right")
    table.add_column("alerts", no_wrap=True, min_width=ALERTS_WIDTH)
    alerts: dict[str, list[Any]] = {}
    for a in state.evaluator.active():
        alerts.setdefault(a.key, []).append(a)
    cells = {
        "gpu_util_pct": lambda tl: _cell(tl, "gpu_util_pct", "{:5.1f}", width, 0, 100),
        "mem_copy_util_pct": lambda tl: _cell(tl, "mem_copy_util_pct", "{:5.1f}", width, 0, 100),
        "fb_used_bytes": lambda tl: _fb_cell(tl, width),
        "sm_clock_mhz": lambda tl: _cell(tl, "sm_clock_mhz", "{:6.0f}", width, 0, None),
        "power_w": lambda tl: _cell(tl, "power_w", "{:6.1f}", width, 0, None),
    }
    for tl in state.gpus.values():
        label = Text(tl.key, style="bold", no_wrap=True, overflow="ellipsis")
        if tl.model:
            label.append(f"\n{tl.model.removeprefix('NVIDIA ')}" + (f" {tl.mig}" if tl.mig else ""), style="dim")
        row: list[Any] = [label, *(cells[names[0]](tl) for _, names in gpu_cols)]
        if has_engine:
            last = tl.last()
            row.append(_cell(tl, "kv_util_pct", "{:5.1f}", width, 0, 100))
            row.append(Text("/".join(_int(last.get(k)) for k in ("running", "waiting", "batch_size"))))
        row.append(_alert_cell(alerts.get(tl.key, [])))
        table.add_row(*row)
    parts: list[Any] = [table]
    if not gpu_cols and state.gpus:
        parts.append(Text("no GPU metrics from this source (CPU engine?): GPU columns hidden", style="dim"))
    for a in state.evaluator.active():
        if a.state != "firing":
            parts.append(Text(f"{a.key}: ({a.rule} pending)", style="yellow"))
    for a in state.evaluator.firing():
        parts.append(Text(f"ALERT {a.rule} on {a.key} (since {a.pending_since_s:.0f}s, peak "
                          f"{a.peak_value:.1f}): {a.message}", style="bold red"))
    if state.errors:
        parts.append(Text(f"{len(state.errors)} failed reads; last: {state.errors[-1]['error']}", style="yellow"))
    return Group(*parts)


def _alert_cell(active: list[Any]) -> Text:
    """'ok', or how many rules fire / are pending; the names follow under the table."""
    if not active:
        return Text("ok", style="green")
    firing = sum(1 for a in active if a.state == "firing")
    if firing:
        return Text(f"{firing} firing", style="bold red")
    return Text(f"{len(active)} pending", style="yellow")


def _int(v: float | None) -> str:
    return "-" if v is None else str(int(v))


# --- defrag ---------------------------------------------------------------------------

_DEFRAG_ORDER = (
    "total_blocks", "used_blocks", "free_blocks", "cached_blocks", "largest_free_run", "fragmentation",
    "reserved_bytes", "allocated_bytes", "inactive_split_bytes",
)


def flat_scalars(report: Any, prefix: str = "") -> dict[str, Any]:
    """Nested report dict -> {dotted.key: scalar}, so any engine report shape renders."""
    out: dict[str, Any] = {}
    if isinstance(report, dict):
        for k, v in report.items():
            out.update(flat_scalars(v, f"{prefix}{k}."))
    elif isinstance(report, int | float | str | bool) or report is None:
        out[prefix.rstrip(".")] = report
    return out


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if key.endswith("bytes") and isinstance(v, int | float):
        return f"{v / 2**20:,.1f} MiB"
    if "fragmentation" in key and isinstance(v, float):
        return f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.3f}"


def defrag_table(data: dict[str, Any]) -> Group:
    before = flat_scalars(data.get("before") or {})
    after = flat_scalars(data.get("after") or {})
    keys = sorted(set(before) | set(after), key=lambda k: (_rank(k), k))
    title = "KV pool — dry run (nothing changed)" if data.get("dry_run") else "KV pool — before / after defrag"
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_column("delta", justify="right")
    for k in keys:
        b, a = before.get(k), after.get(k)
        delta = ""
        if isinstance(b, int | float) and isinstance(a, int | float) and not isinstance(b, bool):
            d = a - b
            delta = "" if d == 0 else (_fmt(k, d) if not isinstance(d, int) else f"{d:+,}")
        table.add_row(k, _fmt(k, b), _fmt(k, a), delta)
    parts: list[Any] = [table]
    actions = data.get("actions") or []
    if actions:
        parts.append(Text("actions:", style="bold"))
        for act in actions:
            parts.append(Text(f"  • {act if isinstance(act, str) else _action_text(act)}"))
    elif not data.get("dry_run"):
        parts.append(Text("actions: none were needed", style="dim"))
    return Group(*parts)


def _rank(key: str) -> int:
    leaf = key.rsplit(".", 1)[-1]
    for i, name in enumerate(_DEFRAG_ORDER):
        if leaf == name or leaf.endswith(name):
            return i
    return len(_DEFRAG_ORDER)


def _action_text(act: Any) -> str:
    if isinstance(act, dict):
        head = act.get("action") or act.get("name") or act.get("type") or ""
        rest = ", ".join(f"{k}={v}" for k, v in act.items() if k not in ("action", "name", "type"))
        return f"{head}: {rest}" if head and rest else head or rest
    return str(act)
