"""uvicorn's httptools protocol plus the limits uvicorn lacks: read deadlines, header caps,
a write (stalled-reader) timeout, API-shaped protocol errors and close-delimited streams
for HTTP/1.0 clients. (TLS handshakes are bounded by run.ZgServer.)

- Deadlines: headers within ``header_timeout_s`` of the connection or of a request's first
  byte, body within ``body_timeout_s`` of the headers; a miss answers 408 and closes. One
  loop timer per connection, no task: arming a later deadline only moves a due time (the
  timer re-arms itself for the rest when it fires early), so a keep-alive request creates
  no timer of its own.
- Header caps: more than ``max_header_bytes`` of request line + headers, or more than
  ``max_headers`` fields, answers 431 before the parser has buffered more than one read.
- Write timeout: when the transport stays paused (the client stopped reading) for
  ``write_timeout_s``, the request is aborted through the disconnect hook (its KV blocks
  are freed) and the connection is dropped.
- Malformed HTTP answers 400 in the API's error shape instead of uvicorn's plain text, after
  the answers of the requests pipelined before it (pipelining.py), then closes.
- A complete answer leaves in one transport write; the app can hand it over without the
  two ASGI sends (``CYCLE`` in the scope, its respond(): head formatted from pre-checked header
  names, values checked in one pass over the head), and take a complete body without receive().
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import urllib.parse
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, cast

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from zgtool import __version__
from zgtool.engine.server.idle import IdlePool
from zgtool.engine.server.pipelining import InOrderErrors
from zgtool.http.errors import ApiError, error_body

# ASGI scope key (an extension of ours): a callable run once if the client goes away
# before the response completes (or stops reading past the write timeout).
DISCONNECT_HOOK = "zgtool.on_disconnect"
# ASGI scope key (an extension of ours): the request's cycle (_OneWriteCycle), whose
# - ``respond(status, headers, body) -> bool`` writes a complete answer (content-length added) in
#   one write, or returns False (nothing written) when the app must use the ASGI sends instead;
# - ``write_chunk(body) -> bool`` writes one non-final piece of a started chunked answer at once,
#   or returns False (nothing written) when the app must use the ASGI send (a paused writer must
#   be drained, HTTP/1.0 is close-delimited, ...);
# - ``start_chunked(status, headers)`` and ``end_chunked(body) -> bool`` start and end a stream
#   the same way (False: use the ASGI send);
# - ``whole_body(limit) -> bytes | None`` takes the complete request body at once, or returns None
#   (nothing taken) when the app must use receive().
# The app pops it from the scope (scope -> cycle -> scope would be a reference cycle).
CYCLE = "zgtool.cycle"
log = logging.getLogger("zgtool.serve")
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str, api: str = "anthropic") -> bytes:
    """A complete HTTP/1.1 error answer in the API's shape that closes the connection."""
    rid = secrets.token_hex(8)
    body = error_body(ApiError(status, None, message), api, "req_" + rid)
    return b"".join([
        b"HTTP/1.1 ", str(status).encode(), b" ", _REASONS.get(status, b"Error"), b"\r\n",
        b"server: zgtool-engine/", __version__.encode(), b"\r\n",
        b"request-id: req_", rid.encode(), b"\r\nx-request-id: inference-", rid.encode(), b"\r\n",
        b"content-type: application/json\r\nconnection: close\r\n",
        b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body,
    ])


class _Collect:
    """Stands in for the transport while uvicorn formats a complete answer."""

    __slots__ = ("parts", "closed")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closed = True


# Header names respond() writes as given: lowercase, valid tokens, and none that changes how
# the connection is framed (content-length, transfer-encoding, connection take the ASGI path).
PLAIN_HEADER_NAMES = frozenset({
    b"server", b"date", b"request-id", b"x-request-id", b"server-timing", b"x-gpu-load-hint", b"content-type",
    b"retry-after", b"allow", b"cache-control", b"x-accel-buffering",
    b"anthropic-ratelimit-requests-limit", b"anthropic-ratelimit-requests-remaining",
    b"anthropic-ratelimit-requests-reset", b"anthropic-ratelimit-tokens-limit",
    b"anthropic-ratelimit-tokens-remaining", b"anthropic-ratelimit-tokens-reset",
    b"x-ratelimit-concurrency-limit", b"x-ratelimit-concurrency-remaining",
    b"x-zgtool-trace-id", b"x-zgtool-parent-span-id",
})
# what uvicorn refuses in a header value (its HEADER_VALUE_RE), CR and LF included
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F])


def _has_length(message: Any) -> bool:
    # ASGI header names are lowercase (ours are); a mixed-case one just takes uvicorn's two writes
    for k, _ in message.get("headers", ()):
        if k == b"content-length":
            return True
    return False


class _OneWriteCycle(RequestResponseCycle):
    """A complete answer (a start with content-length, then one final body) goes out in ONE
    transport write: one syscall and one TCP segment instead of two, so the client wakes once
    (uvicorn writes the head and the body separately). Streams pass through unchanged."""

    _held: Any = None

    async def send(self, message: Any) -> None:
        held = self._held
        if held is None:
            if (message["type"] == "http.response.start" and not self.response_started
                    and not self.disconnected and _has_length(message)):
                self._held = message      # no await between the app's two sends: nothing sees it
                return
            await super().send(message)
            return
        self._held = None
        if message["type"] != "http.response.body" or message.get("more_body", False):
            await super().send(held)
            await super().send(message)
            return
        transport = self.transport
        out = _Collect()
        self.transport = out  # type: ignore[assignment]
        try:
            await super().send(held)
            await super().send(message)
        finally:
            self.transport = transport
            if out.parts:
                transport.write(b"".join(out.parts))
            if out.closed:
                transport.close()


    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a complete answer (status line, headers, content-length, body) at once, as
        uvicorn's two sends would, without formatting it twice. False, with nothing written,
        when this answer needs uvicorn's general path (an unusual header, a paused writer,
        HEAD, a response already started)."""
        plain = PLAIN_HEADER_NAMES
        parts: list[bytes] = []
        add = parts.extend
        for name, value in headers:
            if name not in plain:
                return False
            add((name, b": ", value, b"\r\n"))
        return self.respond_lines(status, b"".join(parts), len(headers), body)

    def respond_lines(self, status: int, lines: bytes, num_lines: int, body: bytes) -> bool:
        """respond() for headers already formatted: ``num_lines`` lines of ``name: value\r\n``,
        every name one of PLAIN_HEADER_NAMES (the caller's promise: the app formats its usual
        answer's head in one step). Values are still checked, as respond() checks them."""
        if self.response_started or self._held is not None or self.flow.write_paused or self.access_log:
            return False
        if self.disconnected:
            return True           # uvicorn's send drops it silently too
        if self.scope["method"] == "HEAD":
            return False
        parts = [STATUS_LINE[status]]
        add = parts.extend
        for name, value in self.default_headers:
            add((name, b": ", value, b"\r\n"))
        parts.append(lines)
        add((b"content-length: ", str(len(body)).encode(), b"\r\n"))
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        head = b"".join(parts)
        # the only control bytes are the CRLFs ending our lines: a value with CR, LF or another
        # control byte is refused, as uvicorn refuses it (one C pass, not a regex per value)
        count = len(self.default_headers) + num_lines + (3 if self.keep_alive else 4)
        if len(head) - len(head.translate(None, _CONTROL_BYTES)) != 2 * count:
            return False
        self.response_started = True
        self.waiting_for_100_continue = False
        self.response_complete = True
        self.transport.write(head + body)
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True

    def start_chunked(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """uvicorn's ``http.response.start`` for an answer without content-length (a stream): the
        head, ``transfer-encoding: chunked`` added, in one write, without a message dict and its
        coroutine. False, with nothing written, where uvicorn's send must run: already started, a
        paused writer, a gone client, HEAD, 204/304, HTTP/1.0 (close-delimited), an unusual header
        name or a value with a control byte."""
        if (self.response_started or self._held is not None or self.flow.write_paused or self.disconnected
                or self.access_log or self.chunked_encoding is not None or status in (204, 304)
                or self.scope["method"] == "HEAD"):
            return False
        parts = [STATUS_LINE[status]]
        add = parts.extend
        for name, value in self.default_headers:
            add((name, b": ", value, b"\r\n"))
        plain = PLAIN_HEADER_NAMES
        for name, value in headers:
            if name not in plain:
                return False
            add((name, b": ", value, b"\r\n"))
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"transfer-encoding: chunked\r\n\r\n")
        head = b"".join(parts)
        count = len(self.default_headers) + len(headers) + (3 if self.keep_alive else 4)
        if len(head) - len(head.translate(None, _CONTROL_BYTES)) != 2 * count:
            return False
        self.response_started = True
        self.waiting_for_100_continue = False
        self.chunked_encoding = True
        self.transport.write(head)
        return True

    def end_chunked(self, body: bytes) -> bool:
        """The last piece of a started chunked answer and its terminating chunk in one write, then
        the answer is complete, as uvicorn's send with ``more_body`` False. False, with nothing
        written, where that send must run instead (see write_chunk)."""
        if (not self.response_started or self.response_complete or not self.chunked_encoding
                or self.flow.write_paused or self.disconnected or self._held is not None):
            return False
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n")
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True

    def whole_body(self, limit: int) -> bytes | None:
        """The complete request body, taken as receive() would take it in one message; None, with
        nothing taken, where receive() must run: the body is still arriving or over ``limit``, a
        100 Continue is owed, the client left or the answer is already complete."""
        if self.more_body or self.waiting_for_100_continue or self.disconnected or self.response_complete:
            return None
        if len(self.body) > limit:
            return None
        body = bytes(self.body)
        self.body = bytearray()
        self.flow.resume_reading()
        self.message_event.clear()
        return body

    def write_chunk(self, body: bytes) -> bool:
        """One ``more_body`` piece of a started chunked answer, framed and written as uvicorn's
        send frames it (``%x CRLF body CRLF``) without a message dict and two coroutine frames per
        token. False, with nothing written, where the ASGI send must run instead: not started or
        already complete, not chunked (HTTP/1.0, HEAD), a paused writer or a gone client."""
        if (not self.response_started or self.response_complete or not self.chunked_encoding
                or self.flow.write_paused or self.disconnected or self._held is not None):
            return False
        if body:
            self.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        return True


class _Http10Cycle(_OneWriteCycle):
    """HTTP/1.0 has no chunked encoding: an answer without content-length is close-delimited."""

    def start_chunked(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        return False          # send() below makes it close-delimited

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers = list(message.get("headers", []))
            if not any(k.lower() == b"content-length" for k, _ in headers):
                self.chunked_encoding = False         # keeps uvicorn from adding transfer-encoding
                self.keep_alive = False
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
                self._close_delimited = True
        elif message["type"] == "http.response.body" and getattr(self, "_close_delimited", False):
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


class DeadlineHttpToolsProtocol(InOrderErrors):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    idle_pool: IdlePool | None = None     # per server (protocol_class): idle keep-alive connections
    _idle = False                         # answered, waiting for its next request (in the idle pool)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: TimerHandle | None = None    # the connection's deadline timer
        self._due: float | None = None               # loop time of the deadline in force (None: none)
        self._what = ""
        self._write_timer: TimerHandle | None = None
        self._in_head = True
        # Header bytes come from the parser's own callbacks (request line and every field of the
        # message being parsed), never from read sizes: a read that holds a whole request, or
        # several pipelined ones, also holds bodies (issue 22: 42 KB prompts got 431).
        self._head_bytes = 0      # url + header fields of the current message, from the callbacks
        self._raw_head_bytes = 0  # whole reads spent inside one head (a field the parser still buffers)
        self._boundary_in_read = False  # a message began or its head completed during this read

    # -- connection ----------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # uvloop already sets it; some pseudo-sockets refuse setsockopt
                pass
        # A connection that never sends a complete request line is bounded too.
        self._arm(self.header_timeout_s, "headers")
        if self.idle_pool is not None:
            self.idle_pool.make_room(len(self.connections))

    def on_response_complete(self) -> None:
        """uvicorn's (the next pipelined request starts, else the connection waits idle), with the
        keep-alive deadline on the connection's one timer instead of a new timer per answer."""
        if self._held_error is not None and not self.pipeline:
            InOrderErrors.on_response_complete(self)    # the held protocol error goes out now
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle = True
        self._arm(self.timeout_keep_alive, "keep-alive")
        if self.idle_pool is not None:
            self.idle_pool.add(self, self.client[0] if self.client else "")

    def _unset_keepalive_if_required(self) -> None:
        # busy again (or gone): out of the idle pool; the keep-alive deadline stays in force until
        # the next request's first byte arms the header deadline in its place (on_message_begin)
        if self._idle:
            self._idle = False
            if self.idle_pool is not None:
                self.idle_pool.discard(self)

    def _arm(self, seconds: float, what: str) -> None:
        due = self.loop.time() + seconds
        self._due = due
        self._what = what
        timer = self._deadline
        if timer is not None:
            if timer.when() <= due:
                return        # it fires first and re-arms itself for the rest
            timer.cancel()
        self._deadline = self.loop.call_at(due, self._check_deadline)

    def _disarm(self) -> None:
        self._due = None      # a pending timer finds nothing due and stops

    def _cancel_deadline(self) -> None:
        self._due = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _check_deadline(self) -> None:
        self._deadline = None
        due = self._due
        if due is None:
            return
        if self.loop.time() < due:
            self._deadline = self.loop.call_at(due, self._check_deadline)
            return
        self._due = None
        self._expired(self._what)

    def _api(self) -> str:
        return "openai" if getattr(self, "url", b"").startswith(b"/v1/chat") else "anthropic"

    def _expired(self, what: str) -> None:
        if self.transport.is_closing():
            return
        if what == "keep-alive":       # idle past --keep-alive-s: closed quietly, as uvicorn does
            self.transport.close()
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(error_response(
                408, f"request {what} not received in time; closing the connection", self._api()))
        if cycle is not None and not cycle.response_complete:
            # The app may be waiting in receive(); disconnected makes it return http.disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        # after the answers of the requests parsed before it, then the close (pipelining.py)
        self._cancel_deadline()
        self.fail_in_order(error_response(status, message, self._api()))

    # -- parsing -------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._held_error is not None:     # a protocol error waits for earlier answers: read no more
            return
        self._unset_keepalive_if_required()
        self._boundary_in_read = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Reject):
                self._reject(cause.status, cause.message)
            else:
                self._reject(400, f"malformed HTTP request: {exc}")
            return
        if self._in_head and not self._boundary_in_read:
            # the whole read went into one unfinished head (a long field the parser buffers):
            # cap it before it can grow; a read that also held a boundary is counted by fields
            self._raw_head_bytes += len(data)
        if self._in_head and max(self._head_bytes, self._raw_head_bytes) > self.max_header_bytes:
            self._reject(431, f"request headers exceed {self.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        # uvicorn's on_message_begin, inlined (one frame; the same scope, tests/engine/server/test_server_protocol_headers.py)
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        self._in_head = True
        self._head_bytes = self._raw_head_bytes = 0
        self._boundary_in_read = True
        self._arm(self.header_timeout_s, "headers")

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url) + 16   # + method, version and CRLF
        self.url += url                     # uvicorn's on_url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4   # ": " and CRLF
        if self._head_bytes > self.max_header_bytes:
            raise _Reject(431, f"request line and headers exceed {self.max_header_bytes} bytes")
        # uvicorn's on_header, inlined: lowercase names, no trailing OWS (RFC 9110 5.5), Expect noted
        name = name.lower()
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Before the request starts: the field count, and the exact head size when the head may
        # have come whole in a read over the cap (data_received caps heads spread over reads).
        if len(self.headers) > self.max_headers:
            raise _Reject(431, f"request has more than {self.max_headers} header fields")
        if self._head_bytes > self.max_header_bytes:
            raise _Reject(431, f"request line and headers exceed {self.max_header_bytes} bytes")
        self._in_head = False
        self._boundary_in_read = True
        self._head_bytes = self._raw_head_bytes = 0
        self._arm(self.body_timeout_s, "body")
        # uvicorn's on_headers_complete, inlined, building our cycle class at once (the same scope
        # and cycle state: tests/engine/server/test_server_protocol_headers.py)
        parser = self.parser
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing = self.cycle
        cycle = (_Http10Cycle if http_version == "1.0" else _OneWriteCycle)(
            scope=scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=self.access_log,
            default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(), on_response=self.on_response_complete)
        self.cycle = cycle
        scope[CYCLE] = cycle  # type: ignore[literal-required]   # set before the app's task first runs
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:                          # pipelined: queued until the answers before it are out
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        self._in_head = True
        self._boundary_in_read = True   # the rest of this read (if any) is a new message's
        self._head_bytes = self._raw_head_bytes = 0

    # -- writing -------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()

    def _write_expired(self) -> None:
        """The client has not read for write_timeout_s: abort its request, drop the connection."""
        self._write_timer = None
        log.warning("client stopped reading for %.1f s; aborting its request", self.write_timeout_s)
        self._call_hook()
        self.transport.abort()

    def _call_hook(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app registered this when it handed the request to the engine: the engine
            # learns of the disconnect now, with no per-request watcher task on the loop.
            # uvicorn types the scope as a TypedDict that does not know our extension key.
            hook = cast("Callable[[], None] | None", cycle.scope.pop(DISCONNECT_HOOK, None))  # type: ignore[misc]
            if hook is not None:
                hook()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self.idle_pool is not None:
            self.idle_pool.discard(self)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._call_hook()
        super().connection_lost(exc)


def protocol_class(header_timeout_s: float, body_timeout_s: float, *, write_timeout_s: float = 30.0,
                   max_header_bytes: int = 32 * 1024, max_headers: int = 100) -> type[DeadlineHttpToolsProtocol]:
    """A subclass carrying this server's limits (uvicorn instantiates it per connection)."""
    return type("ZgHttpProtocol", (DeadlineHttpToolsProtocol,), {
        "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s,
        "write_timeout_s": write_timeout_s, "max_header_bytes": max_header_bytes,
        "max_headers": max_headers, "idle_pool": IdlePool()})
