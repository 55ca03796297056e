"""The Typer app: wiring only. Each command's logic lives in zgtool/commands/<name>.py.

Command modules import nothing heavy at module level (no torch), so `zgtool --help`
stays fast.
"""

from __future__ import annotations

import sys

import typer

from zgtool import __version__
from zgtool.errors import ExitCode, ZgError, exit_code_for

app = typer.Typer(
    name="zgtool",
    help="What does the gateway layer in front of your LLM cost, and where does every millisecond go?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zgtool {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    if debug:
        import os

        os.environ["ZGTOOL_DEBUG"] = "1"


def _register_all() -> None:
    from zgtool.commands import REGISTRY

    for register in REGISTRY:
        register(app)


def main() -> None:
    import os

    _register_all()
    try:
        app(standalone_mode=False)
    except ZgError as exc:
        if os.environ.get("ZGTOOL_DEBUG"):
            raise
        typer.secho(f"zgtool: {exc.message}", err=True, fg="red")
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        typer.secho("zgtool: interrupted", err=True, fg="red")
        sys.exit(int(ExitCode.INTERRUPTED))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.secho("zgtool: aborted", err=True, fg="red")
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:  # click usage errors and friends
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(int(ExitCode.USAGE))
        if os.environ.get("ZGTOOL_DEBUG"):
            raise
        typer.secho(f"zgtool: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", err=True, fg="red")
        sys.exit(int(exit_code_for(exc)))
