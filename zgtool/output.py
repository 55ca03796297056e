"""Shared output helpers: JSON to stdout / file, a Rich console. Rendering only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def emit_result(result: dict[str, Any], *, as_json: bool, out: Path | None) -> None:
    """Write the result to -o FILE and/or stdout (--json)."""
    from zgtool.results import write_result

    if out is not None:
        write_result(result, out)
        if not as_json:
            err_console.print(f"[dim]result written to {out}[/dim]")
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
