"""The one mapping from engine and server errors to HTTP status + error type (bodies: zgtool.http.errors).

    status  error.type                 raised for
    400     invalid_request_error      bad JSON/UTF-8, wrong types, missing fields, max_tokens
                                       out of range, prompt longer than the context,
                                       unsupported parameters (named in ``param``),
                                       non-text content blocks (InvalidRequest,
                                       ContextLengthExceeded)
    400     content_policy_violation   safety policy hit (input, or output in a non-stream
                                       answer); carries "suggestion": "rephrase"
    401     authentication_error       missing or unknown API key (keys configured)
    403     permission_error           a non-admin key on /admin/*
    404     not_found_error            unknown route, unknown model (ModelNotFound)
    405     invalid_request_error      wrong method on a known route (Allow header set)
    408     timeout_error              headers or body not received within the read timeouts
    413     request_too_large          body over --max-body-bytes
    429     rate_limit_error           tier concurrency / requests/min / tokens/min exceeded
    431     invalid_request_error      request headers over --max-header-bytes / --max-headers
    500     api_error                  an unexpected server bug (logged with a traceback); the
                                       HTTP kit's own KitError (its ``status``: a bad keys file)
    529     overloaded_error           KV pool and waiting queue saturated (Overloaded), or
                                       the server is shutting down (EngineStopped); retry-after set

Anthropic routes answer ``{"type":"error","error":{"type","message"},"request_id"}``;
OpenAI routes answer ``{"error":{"message","type","param","code"}}`` with OpenAI's own
types (see zgtool.http.errors).
"""

from __future__ import annotations

from zgtool.engine.api.common import ParamError
from zgtool.engine.errors import (
    ContextLengthExceeded,
    EngineError,
    EngineStopped,
    InvalidRequest,
    ModelLoadError,
    ModelNotFound,
    ModelUnavailable,
    Overloaded,
    SequenceFault,
)
from zgtool.http.errors import ApiError, KitError

HttpError = ApiError          # the engine's name for the kit's error answer
RETRY_AFTER_OVERLOADED_S = 1

# Every class of the engine's error tree -> (HTTP status, Anthropic error type): the one table.
# to_http_error answers with it; docs/errors.md prints it (tests/structure/test_error_mapping.py
# checks every class has exactly one row, here and there).
ENGINE_HTTP: dict[type[EngineError], tuple[int, str]] = {
    EngineError: (500, "api_error"),
    InvalidRequest: (400, "invalid_request_error"),
    ParamError: (400, "invalid_request_error"),
    ContextLengthExceeded: (400, "invalid_request_error"),
    ModelNotFound: (404, "not_found_error"),
    ModelLoadError: (500, "api_error"),
    ModelUnavailable: (500, "api_error"),
    Overloaded: (529, "overloaded_error"),
    SequenceFault: (500, "api_error"),
    EngineStopped: (529, "overloaded_error"),
}


def engine_http(exc: EngineError) -> tuple[int, str]:
    """The (status, error type) of an engine error: its class's row, or its nearest listed base's."""
    return next(ENGINE_HTTP[c] for c in type(exc).__mro__ if c in ENGINE_HTTP)


class ServeStartupError(Exception):
    """`zgtool serve` could not start; the serve command maps each kind to an exit code."""


class ListenFailed(ServeStartupError):
    """The host/port cannot be bound."""


class ModelLoadFailed(ServeStartupError):
    """The model cannot be loaded: ``missing`` when it is absent or unsupported here (a missing
    capability), otherwise a bad model argument."""

    def __init__(self, message: str, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


class ServerNotStarted(ServeStartupError):
    """uvicorn returned without serving (its log says why)."""


def content_policy(message: str) -> HttpError:
    return HttpError(400, "content_policy_violation", message, extra={"suggestion": "rephrase"})


def not_found(message: str) -> HttpError:
    return HttpError(404, "not_found_error", message)


def overloaded(message: str, retry_after_s: int = RETRY_AFTER_OVERLOADED_S) -> HttpError:
    return HttpError(529, "overloaded_error", message,
                     headers=[(b"retry-after", str(max(1, retry_after_s)).encode())])


def to_http_error(exc: BaseException) -> HttpError:
    """Every exception a handler can raise becomes an HttpError here, and only here."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, EngineError):
        status, kind = engine_http(exc)
        if isinstance(exc, ContextLengthExceeded):
            return HttpError(status, kind, str(exc), code="context_length_exceeded")
        if isinstance(exc, InvalidRequest):
            return HttpError(status, kind, str(exc), param=getattr(exc, "param", None),
                             code=getattr(exc, "code", None))
        if isinstance(exc, ModelNotFound):
            return HttpError(status, kind, str(exc), code="model_not_found", param="model")
        if isinstance(exc, Overloaded):
            return overloaded(str(exc) or "Overloaded")
        if isinstance(exc, EngineStopped):
            return overloaded("the server is shutting down; retry on another replica")
        return HttpError(status, kind, f"engine error: {exc}")
    if isinstance(exc, KitError):  # the kit's own error (a bad keys file met while serving)
        return HttpError(exc.status, None, str(exc))
    return HttpError(500, "api_error", f"internal server error ({type(exc).__name__}); see the server log")
