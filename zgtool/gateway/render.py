"""Terminal rendering of a running stack: one table of endpoints (rendering only)."""

from __future__ import annotations

from typing import Any

from zgtool.gateway.catalog import LABELS

_LABEL = {
    "direct": "engine (direct)",
    "nginx": "nginx -> engine",
    "nginx-buffered": "nginx (buffered) -> engine",
    "pygw": "pygw -> engine",
    "stack": "nginx -> pygw -> engine",
}


def print_endpoints(stack: Any, *, console: Any = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from zgtool.output import console as default_console

    con = console or default_console
    cfg = stack.config
    table = Table(title="zgtool endpoints", title_justify="left")
    table.add_column("path")
    table.add_column("url")
    table.add_column("via")
    for name, url in stack.urls.items():
        via = _LABEL.get(name) or LABELS.get(name, name).format(up="engine")
        if cfg.upstream:
            via = via.replace("engine (direct)", "upstream").replace("engine", "upstream")
        if name in ("nginx", "stack"):
            via += f"  ({cfg.nginx_mode})"
        table.add_row(name, url, via)
    con.print(table)
    parts = ", ".join(f"{c.name} pid {c.pid}" for c in stack.children)
    con.print(f"[dim]{escape(parts)}; logs and configs in {escape(str(stack.run_dir))}[/dim]")
    con.print("[dim]Ctrl-C stops every part.[/dim]")
