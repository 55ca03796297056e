"""`zgtool targets`: list named targets (keys are never shown, only their env var)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("targets")
    def targets_cmd(
        config: Path = typer.Option(None, "--config", help="zgtool.toml to read (default ./zgtool.toml, then ~/.config/zgtool)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List named targets from zgtool.toml and the built-ins (api, local)."""
        from rich.table import Table

        from zgtool.output import console
        from zgtool.targets import load_targets

        ts = load_targets(config)
        if as_json:
            typer.echo(json.dumps([t.public() for t in ts.values()], indent=2))
            return
        table = Table(title="targets")
        for col in ("name", "url", "api", "model", "key env var"):
            table.add_column(col)
        for t in ts.values():
            table.add_row(t.name, t.url, t.api, t.model, t.key_env or "-")
        console.print(table)
