"""Request bodies: read with a byte limit, decode JSON so bad input is a 400, never a 500.

``read_body`` raises ``ApiError`` 413 (over the limit, declared or actual), 400 (a
content-length that is not a number) and ``ClientGone`` when the client leaves
mid-body. ``load_json_object`` turns every malformed body into ``ApiError`` 400: bad
UTF-8, bad JSON, nesting past the recursion limit, integers over Python's 4,300-digit
limit, and lone surrogate escapes (``"\\ud800"``), which json accepts but no tokenizer
can encode.

Fast path: orjson decodes a well-formed body (several times faster than json on the
request path); anything it refuses, and any body with a 19+ digit run (orjson turns integers
past 64 bits into floats), goes through the json path, so what is accepted and every error
message are json's. ``dumps`` encodes answers with orjson (compact, UTF-8), json if it refuses.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from zgtool.http.errors import ApiError

_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_LONG_DIGITS = re.compile(rb"\d{19}")
_DIGITS = b"0123456789"


class ClientGone(Exception):
    """The client disconnected before the request (or its answer) completed."""


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", message, param=param)


async def read_body(receive: Any, limit: int, content_length: bytes | None = None) -> bytes:
    """The whole body from an ASGI ``receive``, at most ``limit`` bytes."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise bad_request("content-length is not an integer") from None
        if declared > limit:
            raise ApiError(413, "request_too_large",
                           f"request body is {declared} bytes; this server accepts at most {limit} bytes")
    msg = await receive()
    if msg["type"] == "http.request" and not msg.get("more_body", False):    # the whole body in one message
        body: bytes = msg.get("body", b"")
        if len(body) > limit:
            raise ApiError(413, "request_too_large",
                           f"request body exceeds {limit} bytes; this server accepts at most {limit} bytes")
        return body
    chunks: list[bytes] = []
    size = 0
    while True:
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "request_too_large",
                               f"request body exceeds {limit} bytes; this server accepts at most {limit} bytes")
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        msg = await receive()


def _find_surrogate(obj: Any, path: str) -> str | None:
    if isinstance(obj, str):
        return path if _LONE_SURROGATE.search(obj) else None
    if isinstance(obj, dict):
        for k, v in obj.items():
            if _LONE_SURROGATE.search(k):
                return path or "(a key)"
            hit = _find_surrogate(v, f"{path}.{k}" if path else str(k))
            if hit is not None:
                return hit
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            hit = _find_surrogate(v, f"{path}.{i}" if path else str(i))
            if hit is not None:
                return hit
    return None


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes of an answer (orjson; json for what orjson refuses, e.g. lone surrogates)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def load_json(body: bytes) -> Any:
    """Decode JSON from request bytes; every malformed body is ApiError 400."""
    if not body:
        raise bad_request("request body is empty; send a JSON object")
    # the regexes only run on bodies that could match: 19+ digits in all, a backslash
    if (len(body) - len(body.translate(None, _DIGITS)) < 19 or _LONG_DIGITS.search(body) is None):
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass     # json below accepts it (NaN, 1e400, lone surrogates: checked below) or says why not
        else:
            if b"\\" not in body or _SURROGATE_ESCAPE.search(body) is None:
                return obj
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError as exc:       # json's C scanner stops at the interpreter's recursion limit
        raise bad_request("request body nests arrays/objects too deeply") from exc
    except ValueError as exc:           # an integer literal over 4,300 digits
        raise bad_request(f"request body is not acceptable JSON: {str(exc)[:200]}") from exc
    if _SURROGATE_ESCAPE.search(body):
        try:
            where = _find_surrogate(obj, "")
        except RecursionError:
            where = "(deeply nested value)"
        if where is not None:
            raise bad_request(f"{where}: contains a lone UTF-16 surrogate escape; send valid Unicode text",
                              param=where)
    return obj


def load_json_object(body: bytes) -> dict[str, Any]:
    obj = load_json(body)
    if not isinstance(obj, dict):
        raise bad_request(f"request body must be a JSON object, not {type_name(obj)}")
    return obj


def type_name(value: Any) -> str:
    """How a JSON value's type is named in error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
