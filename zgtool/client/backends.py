"""One attempt through an official SDK (anthropic or openai), with the SDK's own retries off.

The SDKs are imported lazily (they take ~1.5 s to import) and their exceptions are
mapped to a `Failure` here, at one boundary; nothing above this file knows SDK types.
Headers are read through the SDKs' raw-response APIs (`with_raw_response`,
`with_streaming_response`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from zgtool.client.retry import CONNECT, CONNECTION_LOST, STATUS, TIMEOUT, TLS_VERIFY, Failure
from zgtool.targets import Target
from zgtool.tlsverify import CERT_HINT, is_cert_failure

TextCallback = Callable[[str], None]
BAD_RESPONSE = "bad_response"  # the server answered something the SDK could not parse: never retried


class AttemptFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class Reply:
    text: str
    status: int
    headers: dict[str, str]
    model: str | None = None
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def request_id(self) -> str | None:
        return self.headers.get("request-id") or self.headers.get("x-request-id")


class Backend(Protocol):
    api: str

    def send(self, *, model: str, messages: list[dict[str, Any]], system: str | None, max_tokens: int,
             stream: bool, on_text: TextCallback | None, timeout_s: float,
             headers: dict[str, str]) -> Reply: ...

    def close(self) -> None: ...


def _headers(h: Any) -> dict[str, str]:
    try:
        return {str(k).lower(): str(v) for k, v in h.items()}
    except Exception:
        return {}


def _error_type(body: Any) -> str | None:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("type"), str):
            if err.get("code") == "overloaded":         # OpenAI shape of an overload (529)
                return "overloaded_error"
            return err["type"]
        if isinstance(body.get("type"), str) and body.get("type") != "error":
            return body["type"]
    return None


def server_message(status: int, body: Any, fallback: str) -> str:
    """The server's own error message: error.message of a JSON error, the title/text of an HTML page
    (a proxy's 502 page), never the whole page."""
    if isinstance(body, dict):
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else body.get("message")
        if isinstance(msg, str) and msg:
            return f"{status}: {msg}"
    text = body if isinstance(body, str) else fallback
    if "<" in text and re.search(r"(?is)<(html|!doctype|body|title|h1)\b", text):
        title = re.search(r"(?is)<title[^>]*>(.*?)</title>", text) or re.search(r"(?is)<h1[^>]*>(.*?)</h1>", text)
        text = title.group(1) if title else re.sub(r"(?s)<[^>]+>", " ", text)
        text = f"{status}: {html.unescape(' '.join(text.split()))} (an HTML page)"
    return " ".join(text.split())[:200]


def failure_from(exc: BaseException, sdk: Any, *, delivered: bool = False, partial: str = "",
                 headers: dict[str, str] | None = None) -> Failure:
    """SDK or transport exception -> Failure. Unknown exceptions are programming errors: re-raised."""
    http: Any
    try:  # the SDKs moved from httpx to httpx2; support whichever this install uses
        import httpx2 as http
    except ImportError:  # pragma: no cover - older SDKs
        import httpx as http

    def fail(kind: str, message: str, *, status: int | None = None, error_type: str | None = None,
             hdrs: dict[str, str] | None = None, timed_out: bool = False) -> Failure:
        return Failure(kind, message[:300], status=status, error_type=error_type,
                       headers=hdrs if hdrs is not None else dict(headers or {}),
                       content_delivered=delivered, partial_text=partial, timed_out=timed_out)

    def named(e: BaseException) -> str:
        return f"{type(e).__name__}: {e}"

    if isinstance(exc, sdk.APIStatusError):
        h = _headers(exc.response.headers) if exc.response is not None else None
        return fail(STATUS, server_message(exc.status_code, exc.body, str(exc.message)), status=exc.status_code,
                    error_type=_error_type(exc.body), hdrs=h)
    if is_cert_failure(exc):
        return fail(TLS_VERIFY, f"the TLS certificate did not verify ({CERT_HINT})")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__
        if isinstance(cause, http.ConnectError | http.ConnectTimeout):
            return fail(CONNECT, named(cause), timed_out=isinstance(cause, http.ConnectTimeout))
        kind = TIMEOUT if isinstance(exc, sdk.APITimeoutError) else CONNECTION_LOST
        return fail(kind, named(cause) if cause is not None else str(exc))
    if isinstance(exc, sdk.APIError):  # an error object inside a 200 stream (openai)
        return fail(STATUS, str(exc.message), error_type=_error_type(exc.body) or "api_error")
    if isinstance(exc, http.ConnectError | http.ConnectTimeout):
        return fail(CONNECT, named(exc), timed_out=isinstance(exc, http.ConnectTimeout))
    if isinstance(exc, http.TimeoutException):
        return fail(TIMEOUT, named(exc))
    if isinstance(exc, http.TransportError):
        return fail(CONNECTION_LOST, named(exc))
    if isinstance(exc, ValueError):  # JSON / validation errors on a garbled answer
        return fail(BAD_RESPONSE, named(exc))
    raise exc


def _sdk_spelled(headers: Mapping[str, str]) -> dict[str, Any]:
    """The target's headers with the key headers spelled as the SDKs spell their own (Authorization,
    X-Api-Key), so that one given in another case replaces the SDK's instead of going beside it."""
    canonical = {"authorization": "Authorization", "x-api-key": "X-Api-Key"}
    return {canonical.get(k.lower(), k): v for k, v in headers.items()}


class AnthropicBackend:
    api = "anthropic"

    def __init__(self, target: Target, timeout_s: float, verify: bool | str = True) -> None:
        import anthropic

        self._sdk_mod = anthropic
        default_headers: dict[str, Any] = _sdk_spelled(target.headers)
        # a key given as a header (-H) replaces the key_env's, as Target.auth_headers() has it
        key = None if {"X-Api-Key", "Authorization"} & set(default_headers) else target.api_key()
        if not key:  # keyless local engines: send no auth header at all rather than a fake key
            default_headers.setdefault("X-Api-Key", anthropic.omit)
            default_headers.setdefault("Authorization", anthropic.omit)
        self._sdk = anthropic.Anthropic(base_url=target.api_root_url, api_key=key or None, max_retries=0,
                                        timeout=timeout_s, default_headers=default_headers,
                                        http_client=_http_client(anthropic, verify))

    def close(self) -> None:
        self._sdk.close()

    def send(self, *, model: str, messages: list[dict[str, Any]], system: str | None, max_tokens: int,
             stream: bool, on_text: TextCallback | None, timeout_s: float,
             headers: dict[str, str]) -> Reply:
        kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                                  "extra_headers": headers, "timeout": timeout_s}
        if system:
            kwargs["system"] = system
        try:
            if stream:
                return self._stream(kwargs, on_text)
            raw = self._sdk.messages.with_raw_response.create(**kwargs)
            msg = raw.parse()
        except AttemptFailed:
            raise
        except Exception as exc:
            raise AttemptFailed(failure_from(exc, self._sdk_mod)) from exc
        text = "".join(getattr(b, "text", "") for b in msg.content if getattr(b, "type", "") == "text")
        if on_text is not None and text:
            on_text(text)
        return Reply(text, raw.status_code, _headers(raw.headers), msg.model, msg.stop_reason,
                     msg.usage.input_tokens, msg.usage.output_tokens)

    def _stream(self, kwargs: dict[str, Any], on_text: TextCallback | None) -> Reply:
        with self._sdk.messages.with_streaming_response.create(stream=True, **kwargs) as resp:
            headers = _headers(resp.headers)
            parts: list[str] = []
            model = stop_reason = None
            input_tokens = output_tokens = None
            done = False
            try:
                for ev in resp.parse():
                    kind = getattr(ev, "type", None)
                    if kind == "message_start":
                        model = ev.message.model
                        input_tokens = ev.message.usage.input_tokens
                    elif kind == "content_block_delta" and getattr(ev.delta, "type", "") == "text_delta":
                        parts.append(ev.delta.text)
                        if on_text is not None:
                            on_text(ev.delta.text)
                    elif kind == "message_delta":
                        stop_reason = ev.delta.stop_reason
                        output_tokens = ev.usage.output_tokens
                    elif kind == "message_stop":
                        done = True
            except Exception as exc:
                raise AttemptFailed(failure_from(exc, self._sdk_mod, delivered=bool(parts),
                                                 partial="".join(parts), headers=headers)) from exc
            if not done:
                raise AttemptFailed(Failure(CONNECTION_LOST, "stream ended before message_stop",
                                            status=resp.status_code, headers=headers,
                                            content_delivered=bool(parts), partial_text="".join(parts)))
            return Reply("".join(parts), resp.status_code, headers, model, stop_reason, input_tokens,
                         output_tokens)


class OpenAIBackend:
    api = "openai"

    def __init__(self, target: Target, timeout_s: float, verify: bool | str = True) -> None:
        import openai

        self._sdk_mod = openai
        base = target.base_url if target.base_url.endswith("/v1") else target.base_url + "/v1"
        # The SDK refuses to start without a key; keyless servers (vLLM, the engine) ignore it.
        headers = _sdk_spelled(target.headers)     # an Authorization among them replaces the SDK's own
        self._sdk = openai.OpenAI(base_url=base, api_key=target.api_key() or "unused", max_retries=0,
                                  timeout=timeout_s, default_headers=headers,
                                  http_client=_http_client(openai, verify))

    def close(self) -> None:
        self._sdk.close()

    def send(self, *, model: str, messages: list[dict[str, Any]], system: str | None, max_tokens: int,
             stream: bool, on_text: TextCallback | None, timeout_s: float,
             headers: dict[str, str]) -> Reply:
        msgs = ([{"role": "system", "content": system}] if system else []) + list(messages)
        kwargs: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": max_tokens,
                                  "extra_headers": headers, "timeout": timeout_s}
        try:
            if stream:
                return self._stream(kwargs, on_text)
            raw = self._sdk.chat.completions.with_raw_response.create(**kwargs)
            comp = raw.parse()
        except AttemptFailed:
            raise
        except Exception as exc:
            raise AttemptFailed(failure_from(exc, self._sdk_mod)) from exc
        choice = comp.choices[0] if comp.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        if on_text is not None and text:
            on_text(text)
        usage = comp.usage
        return Reply(text, raw.status_code, _headers(raw.headers), comp.model,
                     choice.finish_reason if choice is not None else None,
                     usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None)

    def _stream(self, kwargs: dict[str, Any], on_text: TextCallback | None) -> Reply:
        with self._sdk.chat.completions.with_streaming_response.create(stream=True, **kwargs) as resp:
            headers = _headers(resp.headers)
            parts: list[str] = []
            model = finish = None
            input_tokens = output_tokens = None
            try:
                for chunk in resp.parse():
                    model = chunk.model or model
                    for choice in chunk.choices:
                        piece = choice.delta.content if choice.delta is not None else None
                        if piece:
                            parts.append(piece)
                            if on_text is not None:
                                on_text(piece)
                        finish = choice.finish_reason or finish
                    if chunk.usage is not None:
                        input_tokens, output_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
            except Exception as exc:
                raise AttemptFailed(failure_from(exc, self._sdk_mod, delivered=bool(parts),
                                                 partial="".join(parts), headers=headers)) from exc
            if finish is None:  # the SDK stops quietly at EOF, so a cut stream looks "complete"
                raise AttemptFailed(Failure(CONNECTION_LOST, "stream ended without a finish_reason",
                                            status=resp.status_code, headers=headers,
                                            content_delivered=bool(parts), partial_text="".join(parts)))
            return Reply("".join(parts), resp.status_code, headers, model, finish, input_tokens,
                         output_tokens)


def make_backend(target: Target, timeout_s: float, verify: bool | str = True) -> Backend:
    """verify: True (system CAs), False (--insecure) or a CA bundle path (--cacert)."""
    if target.api == "anthropic":
        return AnthropicBackend(target, timeout_s, verify)
    return OpenAIBackend(target, timeout_s, verify)


def _http_client(sdk: Any, verify: bool | str) -> Any:
    """The SDK's own default HTTP client with our TLS setting (None: the SDK's default)."""
    return None if verify is True else sdk.DefaultHttpxClient(verify=verify)
