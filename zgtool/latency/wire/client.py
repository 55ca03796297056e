"""One instrumented request: httpcore trace hooks + SSE parsing -> RequestSample.

Phases come from the real client's own instrumentation: httpcore's `trace` extension, and
for connect_ms/ttfb_ms the tighter marks of the network stream plugged into httpcore
(transport.py). DNS is inside httpcore's connect_tcp, so it is timed separately with
getaddrinfo and the request then goes to the resolved address with Host and SNI kept.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

import httpcore

from zgtool.latency.attribution.adapters import Evidence, attach
from zgtool.latency.attribution.adapters.base import PROVIDER_PREFIX
from zgtool.latency.attribution.servertiming import timing_from_headers
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.wire.decode import DecodeError, coding_of, decoded
from zgtool.latency.wire.pktclock import CURRENT
from zgtool.latency.wire.resolve import fill_points
from zgtool.latency.wire.stream_reader import Points, anthropic_prompt_tokens, read_stream
from zgtool.latency.wire.transport import MARKS, make_pool
from zgtool.targets import Target

_CONNECT = ("connection.connect_tcp.started", "connection.connect_tcp.complete")
_TLS = ("connection.start_tls.started", "connection.start_tls.complete")
_SEND_START = "http11.send_request_headers.started"
_SEND_DONE = "http11.send_request_body.complete"
_HEADERS_DONE = "http11.receive_response_headers.complete"
_BODY_DONE = "http11.receive_response_body.complete"
_ERROR_BODY_LIMIT = 64 * 1024
ERROR_DETAIL_CHARS = 300


class _Trace:
    """httpcore trace callback: the first timestamp of every event name (a retry keeps the first)."""

    __slots__ = ("t", "local_port")

    def __init__(self) -> None:
        self.t: dict[str, int] = {}
        self.local_port: int | None = None

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        now = perf_counter_ns()  # first thing: everything below is our own overhead
        self.t.setdefault(name, now)
        if name == "connection.connect_tcp.complete":
            try:
                self.local_port = int(info["return_value"].get_extra_info("client_addr")[1])
            except Exception:  # a backend without client_addr: the port is only informational
                self.local_port = None


# zgtool's engine echoes the trace id of the traceparent it received (engine/server/tracing.py); none arrived: no echo.
# LiteLLM passes the engine's answer headers on under its llm_provider- prefix (streams included), so the echo is read
# there too: without it, a traceparent that LiteLLM forwarded looked dropped.
TRACE_ECHO_HEADER = b"x-zgtool-trace-id"
TRACE_ECHO_HEADERS = frozenset((TRACE_ECHO_HEADER, PROVIDER_PREFIX.encode() + TRACE_ECHO_HEADER))


def trace_headers() -> tuple[str, list[tuple[bytes, bytes]]]:
    """A fresh W3C trace context (version 00, sampled): (trace id, [traceparent, tracestate])."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, [(b"traceparent", f"00-{trace_id}-{span_id}-01".encode()),
                      (b"tracestate", f"zgtool={span_id}".encode())]


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def api_path(target: Target) -> str:
    """The request path for the target's API, honouring a base URL that already ends in /v1."""
    from urllib.parse import urlsplit

    base = urlsplit(target.url).path.rstrip("/")
    tail = "/messages" if target.api == "anthropic" else "/chat/completions"
    return base + tail if base.endswith("/v1") else base + "/v1" + tail


def request_body(target: Target, cfg: SplitConfig) -> bytes:
    body: dict[str, Any] = {"model": target.model, "max_tokens": cfg.max_tokens,
                            "messages": [{"role": "user", "content": cfg.prompt}], "stream": cfg.stream}
    if target.api == "openai" and cfg.stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def request_bodies(target: Target, cfg: SplitConfig) -> tuple[tuple[bytes, bytes], ...]:
    """With a workload: (body, content-length) per spec, encoded once here so no JSON is encoded inside
    the timed window; empty without one (every request sends request_body)."""
    if cfg.workload is None:
        return ()
    from zgtool.workload.bodies import encoded_bodies

    return tuple((b, str(len(b)).encode()) for b in encoded_bodies(target.api, target.model, cfg.workload,
                                                                     cfg.stream, limit=cfg.num_requests))


def ssl_context(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()


@dataclass(frozen=True)
class Endpoint:
    """Everything fixed about requests to one target, computed once before measuring."""

    target: Target
    host: str
    port: int
    scheme: str
    path: str
    family: int
    headers: dict[str, str]
    body: bytes
    stream: bool
    is_ip: bool
    bodies: tuple[tuple[bytes, bytes], ...] = ()   # a workload's (body, content-length); request i: [i % n]

    @classmethod
    def build(cls, target: Target, cfg: SplitConfig, family: int = socket.AF_UNSPEC) -> Endpoint:
        host, port = target.host, target.port
        default_port = 443 if target.scheme == "https" else 80
        host_header = (f"[{host}]" if ":" in host else host) + ("" if port == default_port else f":{port}")
        headers = {"host": host_header, "content-type": "application/json", "accept-encoding": cfg.accept_encoding,
                   "user-agent": "zgtool-latency-split", **target.auth_headers()}
        if cfg.stream:
            headers["accept"] = "text/event-stream"
        return cls(target, host, port, target.scheme, api_path(target), family, headers,
                   request_body(target, cfg), cfg.stream, is_ip_literal(host), request_bodies(target, cfg))

    def url_for(self, ip: str) -> str:
        h = f"[{ip}]" if ":" in ip else ip
        return f"{self.scheme}://{h}:{self.port}{self.path}"


_TRANSPORT_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
                     httpcore.ProxyError, ssl.SSLError, OSError)


class Session:
    """One worker's client for one target: keep-alive holds one connection, --new-connection none.

    httpcore's ConnectionPool is used directly (httpx's Client is a layer of cookies, auth,
    redirects and URL merging on top of it): the same connection code and trace hooks, less
    client time in every figure.
    """

    def __init__(self, ep: Endpoint, cfg: SplitConfig, ctx: ssl.SSLContext | None) -> None:
        self.ep = ep
        self.new_connection = cfg.new_connection
        self.pool = make_pool(ctx, keepalive=not cfg.new_connection)
        t = cfg.timeout_s
        self.timeouts = {"connect": t, "read": t, "write": t, "pool": t}
        self.headers = [(k.encode(), v.encode()) for k, v in ep.headers.items()]
        self.default_body = (ep.body, str(len(ep.body)).encode())
        self.addr: str | None = ep.host if ep.is_ip else None
        self.url: str | None = ep.url_for(ep.host) if ep.is_ip else None
        self.points = Points()

    def close(self) -> None:
        self.pool.close()

    def measure(self, index: int, worker: int, rnd: int, t_run0_ns: int) -> RequestSample:
        """One request, measured. A request that went out on a kept-alive connection and got no answer byte
        before the connection failed is resent once on a new connection, as a browser does: the server had
        closed the connection after its previous answer (llama-server does after every streamed answer while
        it advertises keep-alive), so the request never reached it. The resent request's figures are its own
        (its connect included) and `resent_after` names the first attempt's error."""
        sample = self._measure(index, worker, rnd, t_run0_ns)
        if sample.ok or sample.new_connection or MARKS.rx_bytes or not (sample.error or "").startswith(
                "transport_error:"):
            return sample
        again = self._measure(index, worker, rnd, t_run0_ns)
        again.resent_after = sample.error
        return again

    def _measure(self, index: int, worker: int, rnd: int, t_run0_ns: int) -> RequestSample:
        ep = self.ep
        sample = RequestSample(index=index, worker=worker, round=rnd, ok=False)
        sample.trace_id, trace = trace_headers()
        # warm-up (rnd -1) sends the default body, so it does not seed a prefix cache with measured prompts
        body, body_len = ep.bodies[index % len(ep.bodies)] if ep.bodies and rnd >= 0 else self.default_body
        headers = [*self.headers, (b"content-length", body_len), *trace]
        ev = Evidence(stream=ep.stream)
        rec = _Trace()
        t0 = perf_counter_ns()
        sample.start_s = (t0 - t_run0_ns) / 1e9
        if not ep.is_ip and (self.new_connection or self.addr is None):
            try:
                infos = socket.getaddrinfo(ep.host, ep.port, ep.family, socket.SOCK_STREAM)
            except OSError as exc:
                sample.error = f"dns_error:{exc.__class__.__name__}"
                sample.total_ms = (perf_counter_ns() - t0) / 1e6
                return sample
            sample.dns_ms = (perf_counter_ns() - t0) / 1e6
            self.addr = str(infos[0][4][0])
            self.url = ep.url_for(self.addr)
        ext: dict[str, Any] = {"trace": rec, "timeout": self.timeouts}
        if ep.scheme == "https" and not ep.is_ip:
            ext["sni_hostname"] = ep.host
        content_ns: list[int] = []
        end_ns: int | None = None
        self.points = Points()
        MARKS.reset(has_body=bool(body))
        MARKS.armed = True
        try:
            resp = self.pool.handle_request(httpcore.Request("POST", self.url or "", headers=headers,
                                                             content=body, extensions=ext))
            try:
                end_ns = self._read(resp, sample, content_ns, rec, ev)
            finally:
                resp.close()
        except httpcore.TimeoutException as exc:
            sample.error = f"timeout:{exc.__class__.__name__}"
        except httpcore.ConnectError:
            sample.error = "connect_error"
        except _TRANSPORT_ERRORS as exc:
            sample.error = f"transport_error:{exc.__class__.__name__}"
        finally:
            MARKS.armed = False
        if end_ns is None:
            end_ns = perf_counter_ns()
        _fill_phases(sample, rec, t0, end_ns, content_ns)
        # socket-level marks are tighter than the trace events around them; the trace is the fallback
        m = MARKS
        if m.first_write_ns is not None:
            sample.first_byte_out_ms = (m.first_write_ns - t0) / 1e6
        if m.reads:
            fill_points(sample, self.points, t0, m, CURRENT.clock)
        if sample.connect_ms is not None and m.connect_start_ns is not None and m.connect_end_ns is not None:
            sample.connect_ms = (m.connect_end_ns - m.connect_start_ns) / 1e6
        sample.ok = sample.error is None
        attach(sample, ev)
        return sample

    def _read(self, resp: httpcore.Response, sample: RequestSample, content_ns: list[int], rec: _Trace,
              ev: Evidence) -> int:
        """Read the answer to its end; returns the body-complete timestamp."""
        ep = self.ep
        sample.status = resp.status
        for k, v in resp.headers:
            if k.lower() in (b"request-id", b"x-request-id") and sample.request_id is None:
                sample.request_id = v.decode("latin-1")
            elif k.lower() in TRACE_ECHO_HEADERS:    # zgtool's engine: the trace id its traceparent carried
                sample.trace_echo = v.decode("latin-1").strip().lower()
        ev.headers = Evidence.from_headers(resp.headers).headers
        # Server-Timing, and the engine's timing under a gateway's name for it (LiteLLM)
        parts = timing_from_headers(resp.headers)
        chunks: Iterable[bytes] = resp.stream  # type: ignore[assignment]
        coding = coding_of(next((v.decode("latin-1") for k, v in resp.headers if k.lower() == b"content-encoding"),
                                None))
        if coding is not None:
            sample.content_encoding = coding
            chunks = decoded(chunks, coding)
        try:
            if resp.status >= 400:
                sample.error, sample.error_detail = _http_error(resp.status, chunks)
            elif ep.stream:
                sample.error, event_parts, sample.output_tokens, sample.input_tokens = read_stream(
                    chunks, ep.target.api, content_ns, self.points, ev, compressed=coding is not None)
                parts.update(event_parts)
            else:
                sample.error, sample.output_tokens, sample.input_tokens = _read_body(chunks, ep.target.api, ev)
        except DecodeError as exc:
            sample.error, sample.error_detail = f"bad_body:{coding}", str(exc)
        sample.server_timing = parts
        ev.server_timing = parts
        if MARKS.last_read_ns is not None:      # when the body's last bytes arrived, not when h11 said so
            return MARKS.last_read_ns
        return rec.t.get(_BODY_DONE) or perf_counter_ns()


def _span_ms(t: dict[str, int], a: str, b: str) -> float | None:
    if a in t and b in t:
        return (t[b] - t[a]) / 1e6
    return None


def _fill_phases(s: RequestSample, rec: _Trace, t0: int, end_ns: int, content_ns: list[int]) -> None:
    t = rec.t
    s.local_port = rec.local_port
    s.connect_ms = _span_ms(t, *_CONNECT)
    s.tls_ms = _span_ms(t, *_TLS)
    s.new_connection = s.connect_ms is not None
    s.send_ms = _span_ms(t, _SEND_START, _SEND_DONE)
    s.ttfb_ms = _span_ms(t, _SEND_START, _HEADERS_DONE)
    s.total_ms = (end_ns - t0) / 1e6
    s.content_events = len(content_ns)
    if content_ns:
        s.ttft_ms = (content_ns[0] - t0) / 1e6
        s.itl_ms = [(b - a) / 1e6 for a, b in zip(content_ns, content_ns[1:], strict=False)]
        n = s.output_tokens if s.output_tokens else len(content_ns)
        if n > 1:
            s.tpot_ms = (s.total_ms - s.ttft_ms) / (n - 1)


def error_detail(raw: bytes) -> str | None:
    """The server's error text on one line, trimmed: the API's error message when the body is JSON, else
    the body itself (an HTML page's tags stripped)."""
    text = raw.decode("utf-8", errors="replace")
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail", doc.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err
        text = err if isinstance(err, str) else json.dumps(err if err is not None else doc)
    elif "<" in text:
        import re

        text = re.sub(r"<[^>]*>", " ", text)
    line = " ".join(text.split())
    if not line:
        return None
    return line if len(line) <= ERROR_DETAIL_CHARS else line[:ERROR_DETAIL_CHARS - 1] + "…"


def _http_error(status: int, chunks: Iterable[bytes]) -> tuple[str, str | None]:
    """(`http_<status>` plus the API's own error type when the body has one, the server's text)."""
    raw = b""
    for chunk in chunks:
        raw += chunk
        if len(raw) > _ERROR_BODY_LIMIT:
            break
    kind = ""
    try:
        doc = json.loads(raw)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            kind = str(err.get("type") or err.get("code") or "")
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return f"http_{status}" + (f":{kind}" if kind else ""), error_detail(raw)


def _read_body(chunks: Iterable[bytes], api: str, ev: Evidence | None = None,
               ) -> tuple[str | None, int | None, int | None]:
    raw = b"".join(chunks)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "bad_body:not_json", None, None
    if not isinstance(doc, dict):
        return "bad_body:not_object", None, None
    if ev is not None:
        ev.note_doc(doc)
    usage = doc.get("usage") or {}
    tokens = usage.get("output_tokens" if api == "anthropic" else "completion_tokens")
    prompt = usage.get("input_tokens" if api == "anthropic" else "prompt_tokens")
    if api == "anthropic" and isinstance(prompt, int):
        prompt = anthropic_prompt_tokens(usage)
    if api == "anthropic" and doc.get("type") != "message":
        return "bad_body:not_a_message", None, None
    if api == "openai" and not doc.get("choices"):
        return "bad_body:no_choices", None, None
    return (None, int(tokens) if isinstance(tokens, int) else None,
            int(prompt) if isinstance(prompt, int) else None)
