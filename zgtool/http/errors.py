"""One error answer for both APIs: ``ApiError`` and the Anthropic / OpenAI body shapes.

    status  Anthropic error.type        OpenAI (type, code)
    400     invalid_request_error       invalid_request_error, <ApiError.code or null>
    400     content_policy_violation    invalid_request_error, content_policy_violation
    401     authentication_error        authentication_error, invalid_api_key
    403     permission_error            permission_error, permission_denied
    404     not_found_error             invalid_request_error, not_found (model_not_found via code)
    408     timeout_error               timeout_error, request_timeout
    413     request_too_large           invalid_request_error, request_too_large
    431     invalid_request_error       invalid_request_error, request_header_fields_too_large
    429     rate_limit_error            rate_limit_error, rate_limit_exceeded
    500     api_error                   server_error, internal_error
    504     timeout_error               timeout_error, upstream_timeout
    529     overloaded_error            server_error, overloaded

Anthropic: ``{"type":"error","error":{"type","message",...},"request_id"}``.
OpenAI:    ``{"error":{"message","type","param","code",...}}``.
"""

from __future__ import annotations

import json
from typing import Any

# Anthropic error type for a status (the API's catch-all for other 4xx is invalid_request_error).
STATUS_TYPE: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large",
    429: "rate_limit_error", 431: "invalid_request_error", 500: "api_error", 502: "api_error",
    503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error",
}

# Anthropic error type -> (OpenAI type, OpenAI code)
OPENAI_ERROR: dict[str, tuple[str, str | None]] = {
    "invalid_request_error": ("invalid_request_error", None),
    "content_policy_violation": ("invalid_request_error", "content_policy_violation"),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "permission_error": ("permission_error", "permission_denied"),
    "not_found_error": ("invalid_request_error", "not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "api_error": ("server_error", "internal_error"),
    "overloaded_error": ("server_error", "overloaded"),
    "timeout_error": ("timeout_error", "request_timeout"),
}


class KitError(Exception):
    """An error of the kit itself, not an answer to send: its callers map it once (the CLI in
    zgtool/errors.py: exit 2, one line; the engine's server in engine/server/errors.py: ``status``).
    The kit never raises the CLI's errors."""

    status = 500    # met while serving, it is the server's own configuration that is wrong


class ConfigError(KitError):
    """A file the kit reads (TOML, keys.toml) is missing, unreadable or malformed: one line naming
    the file and the problem."""


def type_for_status(status: int) -> str:
    """The Anthropic error type for an HTTP status."""
    return STATUS_TYPE.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


class ApiError(Exception):
    """An error answer: status, Anthropic error type, message, optional OpenAI ``code`` and
    ``param``, extra response headers and extra body fields."""

    def __init__(
        self, status: int, error_type: str | None, message: str, *,
        headers: list[tuple[bytes, bytes]] | None = None, extra: dict[str, Any] | None = None,
        code: str | None = None, param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type or type_for_status(status)
        self.message = message
        self.headers = headers or []
        self.extra = extra or {}
        self.code = code
        self.param = param


def error_payload(err: ApiError, api: str, request_id: str) -> dict[str, Any]:
    """The body of ``err`` in the ``api``'s shape ("anthropic" or "openai")."""
    if api == "openai":
        typ, code = OPENAI_ERROR.get(err.error_type, ("server_error" if err.status >= 500 else
                                                      "invalid_request_error", None))
        return {"error": {"message": err.message, "type": typ, "param": err.param,
                          "code": err.code or code, **err.extra}}
    return {"type": "error", "error": {"type": err.error_type, "message": err.message, **err.extra},
            "request_id": request_id}


def error_body(err: ApiError, api: str, request_id: str) -> bytes:
    return json.dumps(error_payload(err, api, request_id), separators=(",", ":")).encode()


def parse_error_body(body: bytes, status: int) -> ApiError:
    """An upstream error body of either shape (or plain text) back into an ApiError."""
    try:
        err = json.loads(body)["error"]
        etype = str(err.get("type") or type_for_status(status))
        if etype not in OPENAI_ERROR:       # an OpenAI-shaped body: its type is not an Anthropic one
            etype = type_for_status(status)
        return ApiError(status, etype, str(err.get("message", "")), code=err.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body[:500].decode(errors="replace")
        return ApiError(status, type_for_status(status), text or f"upstream answered {status}")
