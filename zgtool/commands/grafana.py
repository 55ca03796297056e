"""`zgtool grafana export`: the shipped Grafana dashboard (engine /metrics, pygw /metrics, dcgm-exporter) as JSON."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    grafana_app = typer.Typer(epilog="""Examples:\n\n  zgtool grafana export -o zgtool-dashboard.json\n""", help="Grafana dashboards for the engine's and pygw's /metrics and dcgm-exporter.",
                              no_args_is_help=True)
    app.add_typer(grafana_app, name="grafana")

    @grafana_app.command("export")
    def export_cmd(
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the dashboard JSON here (default: stdout)."),
        title: str = typer.Option("zgtool engine", "--title", help="Dashboard title."),
    ) -> None:
        """Write the dashboard: requests running/waiting, KV use, TTFT/ITL/E2E/queue quantiles, tokens/s,
        prefix-cache hit rate, finishes and errors, engine stalls, preemptions; pygw's answers, upstream
        latency, own overhead and retries (scrape pygw's /metrics too); and dcgm-exporter's GPU golden metrics. Import it in Grafana (Dashboards > Import) and pick your Prometheus.

        Examples:
          zgtool grafana export -o zgtool-dashboard.json
          zgtool grafana export --title "prod engines" > dashboard.json
        """
        from zgtool.errors import UsageError
        from zgtool.grafana.dashboard import render

        text = render(title)
        if out is None:
            typer.echo(text, nl=False)
            return
        try:
            out.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc}") from exc
        typer.echo(f"wrote {out}")
