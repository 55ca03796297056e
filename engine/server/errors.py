"""The one mapping from engine and server errors to HTTP status + the API's error body.

    status  error.type                 raised for
    400     invalid_request_error      bad JSON/UTF-8, wrong types, missing fields, max_tokens
                                       out of range, prompt longer than the context,
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
    500     api_error                  an unexpected server bug (logged with a traceback)
    529     overloaded_error           KV pool and waiting queue saturated (Overloaded), or
                                       the server is shutting down (EngineStopped)

Anthropic routes answer ``{"type":"error","error":{"type","message"},"request_id"}``;
OpenAI routes answer ``{"error":{"message","type","param","code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from zgtool.engine.errors import EngineError, EngineStopped, InvalidRequest, ModelNotFound, Overloaded


class HttpError(Exception):
    """An error answer: status, API error type, message, extra headers and fields."""

    def __init__(
        self, status: int, error_type: str, message: str, *,
        headers: list[tuple[bytes, bytes]] | None = None, extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or []
        self.extra = extra or {}


def content_policy(message: str) -> HttpError:
    return HttpError(400, "content_policy_violation", message, extra={"suggestion": "rephrase"})


def not_found(message: str) -> HttpError:
    return HttpError(404, "not_found_error", message)


def to_http_error(exc: BaseException) -> HttpError:
    """Every exception a handler can raise becomes an HttpError here, and only here."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, InvalidRequest):
        return HttpError(400, "invalid_request_error", str(exc))
    if isinstance(exc, ModelNotFound):
        return HttpError(404, "not_found_error", str(exc))
    if isinstance(exc, Overloaded):
        return HttpError(529, "overloaded_error", str(exc) or "Overloaded")
    if isinstance(exc, EngineStopped):
        return HttpError(529, "overloaded_error", "the server is shutting down; retry on another replica")
    if isinstance(exc, EngineError):
        return HttpError(500, "api_error", f"engine error: {exc}")
    return HttpError(500, "api_error", f"internal server error ({type(exc).__name__}); see the server log")


def error_payload(err: HttpError, api: str, request_id: str) -> dict[str, Any]:
    if api == "openai":
        return {"error": {"message": err.message, "type": err.error_type, "param": None,
                          "code": err.error_type, **err.extra}}
    return {"type": "error", "error": {"type": err.error_type, "message": err.message, **err.extra},
            "request_id": request_id}


def error_body(err: HttpError, api: str, request_id: str) -> bytes:
    return json.dumps(error_payload(err, api, request_id), separators=(",", ":")).encode()
