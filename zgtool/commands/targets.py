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
        """List named targets from zgtool.toml and the built-ins (api, local).

        A narrow terminal lists each target as lines of its own (no URL is ever cut).

        Examples:
          zgtool targets
          zgtool targets --config ./zgtool.toml --json
        """
        from zgtool.output import console
        from zgtool.tables import whole_table
        from zgtool.targets import load_targets

        ts = load_targets(config)
        if as_json:
            typer.echo(json.dumps([t.public() for t in ts.values()], indent=2))
            return
        rows = [(t.name, t.url, t.api, t.model, t.key_env or "-") for t in ts.values()]
        console.print(whole_table("targets", ("name", "url", "api", "model", "key env var"), rows, console.width))
