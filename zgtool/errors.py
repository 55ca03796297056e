"""One error tree for the CLI, mapped once to exit codes.

    ZgError                      -> ExitCode.USAGE unless overridden
    ├── UsageError               -> 2  bad flag, unknown target, malformed URL or policy
    ├── VerdictFailed            -> 1  a gate or verdict failed
    ├── TargetUnreachable        -> 3  DNS failure, refused port, timeout, not HTTP
    ├── MissingCapability        -> 4  no capture privilege, no GPU/NVML, no k6, no nginx
    └── MeasurementUnreliable    -> 5  the load generator fell behind or nothing succeeded:
                                       the run cannot judge the system (never a pass)
    any other exception          -> 1  a bug: "please report", traceback with --debug
    Ctrl-C (SIGINT)              -> 130, one line, also when the command drained and returned

Engine errors (zgtool.engine.errors) are mapped to HTTP statuses in the server and, met at the
command line, to this tree by zgtool.commands.engine_errors. The HTTP kit's own errors
(zgtool.http.errors.KitError: a bad keys or TOML file) are mapped here: exit 2, one line, like a
UsageError. docs/errors.md has every class's row (a test keeps it equal to the code).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    VERDICT_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    MISSING_CAPABILITY = 4
    UNRELIABLE = 5
    BUG = 1                 # an exception outside this tree: a traceback under --debug, "please report"
    INTERRUPTED = 130


class ZgError(Exception):
    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(ZgError):
    exit_code = ExitCode.USAGE


class VerdictFailed(ZgError):
    exit_code = ExitCode.VERDICT_FAILED


class TargetUnreachable(ZgError):
    exit_code = ExitCode.UNREACHABLE


class MissingCapability(ZgError):
    exit_code = ExitCode.MISSING_CAPABILITY


class MeasurementUnreliable(ZgError):
    exit_code = ExitCode.UNRELIABLE


_interrupted: list[int] = []


def mark_interrupted(signum: int = 2) -> None:
    """Record a Ctrl-C that a command handled itself (uvicorn's drain, a watch loop's
    summary), so the process still exits 130 when the command returns normally."""
    _interrupted.append(signum)


def was_interrupted() -> bool:
    return bool(_interrupted)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The one place outcomes become exit codes. Anything outside the tree is a bug (1)."""
    if isinstance(exc, ZgError):
        return exc.exit_code
    if is_kit_error(exc):
        return ExitCode.USAGE
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return ExitCode.BUG


def is_kit_error(exc: BaseException) -> bool:
    """The HTTP kit's own error (a bad keys or TOML file): bad input, exit 2 with its one line."""
    from zgtool.http.errors import KitError

    return isinstance(exc, KitError)


def user_message(exc: BaseException) -> str | None:
    """The one line to show for an error of the tree or of the kit; None for anything else (a bug)."""
    if isinstance(exc, ZgError):
        return exc.message
    if is_kit_error(exc):
        return str(exc)
    return None
