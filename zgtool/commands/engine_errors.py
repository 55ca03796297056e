"""Engine errors met at the command line (`generate`, `verify`'s model check, `serve`'s start-up) ->
the CLI's one error tree, so each gets its exit code (zgtool.errors). The one table: docs/errors.md
prints it and tests/structure/test_error_mapping.py checks both agree."""

from __future__ import annotations

from zgtool.engine.errors import EngineError, ModelLoadError, ModelUnavailable
from zgtool.engine.server.errors import ListenFailed, ModelLoadFailed, ServerNotStarted, ServeStartupError
from zgtool.errors import ExitCode, MissingCapability, UsageError, ZgError

# an engine error class (nearest listed base for the others) -> the exit code the CLI gives it
ENGINE_EXIT: dict[type[Exception], ExitCode] = {
    EngineError: ExitCode.USAGE,                     # a bad model argument, prompt or setting
    ModelLoadError: ExitCode.USAGE,
    ModelUnavailable: ExitCode.MISSING_CAPABILITY,   # the packaged model's package is missing here
    ServeStartupError: ExitCode.USAGE,
    ListenFailed: ExitCode.USAGE,                    # the host/port cannot be bound
    ModelLoadFailed: ExitCode.USAGE,                 # ... MISSING_CAPABILITY when exc.missing
    ServerNotStarted: ExitCode.MISSING_CAPABILITY,
}
_CLASS = {ExitCode.USAGE: UsageError, ExitCode.MISSING_CAPABILITY: MissingCapability}


def engine_exit_code(exc: Exception) -> ExitCode:
    if isinstance(exc, ModelLoadFailed) and exc.missing:
        return ExitCode.MISSING_CAPABILITY
    return next(ENGINE_EXIT[c] for c in type(exc).__mro__ if c in ENGINE_EXIT)


def cli_error(exc: Exception) -> ZgError:
    """The CLI error (one line, its exit code) for an engine or server start-up error."""
    return _CLASS[engine_exit_code(exc)](str(exc))
