"""`zgtool report html [RESULTS or DIR] -o FILE`: a self-contained HTML report from result files."""

from __future__ import annotations

from pathlib import Path

import typer

HTML_HELP = """Render result files (or folders of them) into one self-contained HTML file.

Inline CSS, inline SVG charts and a few lines of inline JS: no external URL of
any kind, so it opens from disk in any browser. Works with any subset of result
kinds (probe.*, latency_split, bench.k6, gate, dcgm.watch, engine.metrics,
defrag, verify); a section without data says why. Without -o the report goes to
report.html inside the first folder given, else ./report.html.
"""


HTML_EXAMPLES = """

\b
Examples:
  zgtool report html reports/20260101-120000/
  zgtool report html split.json bench.json gate.json -o report.html --title "pygw vs direct"
"""


def _reflow(text: str) -> str:
    # Typer keeps single newlines; one line per paragraph lets the terminal wrap it
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def register(app: typer.Typer) -> None:
    report_app = typer.Typer(help="Reports from zgtool result files.", epilog="""Examples:\n\n  zgtool report html reports/20260101-120000/\n\n  zgtool report html split.json gate.json -o report.html\n""", no_args_is_help=True)

    @report_app.command("html", help=_reflow(HTML_HELP) + HTML_EXAMPLES)
    def html_cmd(
        results: list[Path] = typer.Argument(..., metavar="RESULTS_OR_DIR...",
                                             help="Result JSON files and/or folders of them."),
        out: Path | None = typer.Option(None, "-o", "--output", help="The HTML file to write."),
        title: str = typer.Option("zgtool report", "--title", help="Page title."),
    ) -> None:
        from zgtool.errors import UsageError
        from zgtool.output import console
        from zgtool.report.html import render_files

        if out is None:
            first_dir = next((p for p in results if p.is_dir()), None)
            out = (first_dir / "report.html") if first_dir else Path("report.html")
        if out.is_dir():
            raise UsageError(f"-o {out} is a folder; give a file name such as {out / 'report.html'}")
        page = render_files(list(results), title=title)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(page)
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
        console.print(f"report written to [bold]{out}[/bold] ({len(page) / 1024:.0f} KiB)")

    app.add_typer(report_app, name="report")
