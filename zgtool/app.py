"""The Typer app: wiring only. Each command's logic lives in zgtool/commands/<name>.py.

Command modules import nothing heavy at module level (no torch), so `zgtool --help`
stays fast.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

import typer

from zgtool import __version__
from zgtool.errors import (
    ExitCode,
    UsageError,
    ZgError,
    exit_code_for,
    mark_interrupted,
    user_message,
    was_interrupted,
)

app = typer.Typer(
    name="zgtool",
    help="What does the gateway layer in front of your LLM cost, and where does every millisecond go?",
    epilog=("Examples:\n\n  zgtool verify --quick\n\n"
            "  zgtool latency-split http://127.0.0.1:8000 http://127.0.0.1:8080 -n 100\n\n"
            "  zgtool gate split.json"),
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
        os.environ["ZGTOOL_DEBUG"] = "1"


def _register_all() -> None:
    from zgtool.commands import REGISTRY

    for register in REGISTRY:
        register(app)


def _say(message: str) -> None:
    typer.secho(f"zgtool: {message}", err=True, fg="red")


def _on_sigint(signum: int, frame: object) -> None:
    mark_interrupted(signum)
    raise KeyboardInterrupt


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def url_shorthand(args: list[str]) -> list[str]:
    """URLs where latency-split takes them, for the two groups whose first word is a subcommand (click would
    call a URL an unknown subcommand): `zgtool probe URL ...` is `zgtool probe --target URL ...`, and
    `zgtool bench URL [URL] ...` is `zgtool bench --direct URL [--gateway URL] ...`."""
    i = next((k for k, a in enumerate(args) if not a.startswith("-")), None)
    if i is None or i + 1 >= len(args) or "://" not in args[i + 1]:
        return args
    if args[i] == "probe":
        return [*args[:i + 1], "--target", args[i + 1], *args[i + 2:]]
    if args[i] == "bench":
        flags = ["--direct", args[i + 1]]
        rest = args[i + 2:]
        if rest and "://" in rest[0]:
            flags += ["--gateway", rest[0]]
            rest = rest[1:]
        if rest and "://" in rest[0]:
            raise UsageError(f"bench takes two URLs at most, the engine's and one gateway's (--direct, --gateway), "
                             f"not also {rest[0]}: bench each further gateway in a run of its own")
        return [*args[:i + 1], *flags, *rest]
    return args


def _run(args: list[str]) -> int:
    """Parse and invoke; every outcome becomes an exit code here, nowhere else.

    The click tree is driven directly (not `app(standalone_mode=...)`) because typer turns
    Ctrl-C into a silent `Exit(130)` and, outside standalone mode, returns exit codes
    instead of raising them.
    """
    from typer._click.exceptions import ClickException  # typer >= 0.26 vendors click

    from zgtool.cli_coerce import install
    from zgtool.plainhelp import plain_help

    command = install(plain_help(typer.main.get_command(app)))
    try:
        with command.make_context("zgtool", url_shorthand(args)) as ctx:
            command.invoke(ctx)
        code = 0
    except typer.Exit as exc:
        code = int(exc.exit_code)
    except ClickException as exc:       # usage errors: click's Usage:/Try --help/Error: lines
        exc.show()
        return int(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort, EOFError):
        mark_interrupted()
        code = int(ExitCode.INTERRUPTED)
    except BrokenPipeError:             # `zgtool ... | head`: the reader left; say nothing more
        _silence_stdout()
        return 1
    except ZgError as exc:
        if os.environ.get("ZGTOOL_DEBUG"):
            traceback.print_exc()
        _say(exc.message)
        return int(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the one place a bug becomes an exit code
        message = user_message(exc)   # the HTTP kit's own errors (a bad keys file): exit 2, one line
        if message is not None:
            if os.environ.get("ZGTOOL_DEBUG"):
                traceback.print_exc()
            _say(message)
            return int(exit_code_for(exc))
        if os.environ.get("ZGTOOL_DEBUG"):
            traceback.print_exc()
            _say(f"bug: {type(exc).__name__}: {exc}; please report it")
        else:
            _say(f"bug: {type(exc).__name__}: {exc}; please report it (rerun with --debug for the traceback)")
        return int(exit_code_for(exc))
    if was_interrupted():
        _say("interrupted")
        return int(ExitCode.INTERRUPTED)
    return code


def main(args: list[str] | None = None) -> None:
    _register_all()
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:     # not when the parent ignores SIGINT (nohup, &)
        signal.signal(signal.SIGINT, _on_sigint)
    code = _run(list(sys.argv[1:] if args is None else args))
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    sys.exit(code)
