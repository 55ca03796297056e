"""Shared output helpers: JSON to stdout / file, a Rich console. Rendering only."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def emit_result(result: dict[str, Any], *, as_json: bool, out: Path | None,
                render: Callable[[], None] | None = None) -> None:
    """Write the result to -o FILE, then `render` it (the human tables), then stdout (--json). The file comes
    first: a reader that leaves early (`zgtool ... -o run.json | head`) ends the command at the next print,
    and a measurement's file must not be lost to that."""
    from zgtool.results import write_result

    if out is not None:
        write_result(result, out)
    if render is not None:
        render()
    if out is not None and not as_json:
        err_console.print(f"[dim]result written to {out}[/dim]")
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
