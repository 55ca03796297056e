"""pygw: zgtool's Python AI gateway, built the way LiteLLM-like gateways are: an ASGI app
on uvicorn with a pooled httpx client. Per request: read body, auth (virtual keys),
tier limits, parse + translate, moderation, cache lookup, forward (retries only with
--max-retries; W3C traceparent/tracestate passed through unchanged),
re-serialize or stream SSE through unbuffered. HTTP pieces (errors, body, SSE, keys)
come from the shared kit, zgtool.http.

    python -m zgtool.gateway.pygw_main --upstream URL --port P [--redis URL] [--keys F] [--policy F]

A client that hangs up, streaming or not, cancels its upstream request (the engine
aborts it). Shutdown (SIGTERM): stop accepting, let requests finish within --grace-s;
past it, or on a second signal, each stream ends with an overloaded_error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from zgtool.gateway.admin_deny import ADMIN_DENIED_MESSAGE
from zgtool.gateway.policy import KeyPolicy, KeyRing, Policy
from zgtool.gateway.pygw_metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from zgtool.gateway.pygw_metrics import GatewayMetrics, route_of
from zgtool.gateway.state import (
    CachedResponse,
    MemoryCache,
    MemoryLimiter,
    RedisCache,
    RedisLimiter,
    TierUsage,
)
from zgtool.gateway.translate import (
    StreamWatch,
    anthropic_input_text,
    anthropic_models_to_openai,
    anthropic_to_openai,
    include_usage,
    openai_to_anthropic,
    upstream_error_to_openai,
)
from zgtool.http.body import ClientGone, load_json_object, read_body
from zgtool.http.errors import ApiError, error_body, parse_error_body
from zgtool.http.keys import api_key
from zgtool.http.servertiming import server_timing
from zgtool.http.sse import DONE

log = logging.getLogger("pygw")
# With --max-retries N (off by default): what a retry may fix. Never a 500: the upstream ran the
# request and failed on it, and a gateway that resends it multiplies a poison request (issue 22:
# one bad parameter killed every in-flight request, three times over through pygw's retries).
RETRY_STATUSES = frozenset({502, 503, 504, 529})
# An idle upstream connection is dropped before the engine's own idle timeout (--keep-alive-s,
# 5 s by default) can close it under a request being sent: 60 s gave an occasional 502
# ("connection lost while sending") on a tiny request (the isolation fuzzer, issue 22).
UPSTREAM_KEEPALIVE_S = 4.0
# The client key a request came in with, for the engine's fair scheduler (seats shared by key).
TENANT_HEADER = "x-zgtool-tenant"
# An OpenAI client that sets no max_tokens gets the rest of the context from zgtool's engine (as on
# its own OpenAI route): pygw still sends DEFAULT_MAX_TOKENS (an Anthropic upstream needs one) and
# this header, which zgtool's engine reads as "the rest of the context" and other upstreams ignore
DEFAULT_MAX_TOKENS_HEADER = "x-zgtool-max-tokens-default"
# hop-by-hop or rewritten by pygw: never copied from the upstream answer
_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date",
                   b"x-request-id", b"via", b"server-timing", b"content-encoding"})
# W3C trace context, passed through unchanged: pygw records no span of its own, so a child span id
# would name a parent no collector ever sees (zgtool.gateway.propagation: verdict "preserved")
_TRACE_CONTEXT = frozenset({b"traceparent", b"tracestate", b"baggage"})
# client request headers the upstream call carries
_FORWARDED = frozenset({b"anthropic-version", b"anthropic-beta"}) | _TRACE_CONTEXT
_GW_PHASES = ("gw_auth", "gw_ratelimit", "gw_cache", "gw_translate", "gw_moderation", "gw_upstream")


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str
    keys: KeyRing
    policy: Policy
    redis_url: str | None = None
    cache_ttl_s: float = 300.0
    max_retries: int = 0     # off by default: a gateway's retries are a behaviour to measure, not to copy
    retry_base_s: float = 0.1
    max_retry_wait_s: float = 10.0
    max_connections: int = 256
    max_body_bytes: int = 8 * 1024 * 1024      # the engine's own default: refuse here what it would refuse
    grace_s: float = 5.0
    max_tracked_keys: int = 50_000


class _Timer:
    """The gw_* phases of one request, in ms, rendered as Server-Timing metrics. gw_total
    runs from the first body byte read to the response headers, so it also holds the body
    read; for streams gw_upstream ends at the upstream's headers, not its last token."""

    __slots__ = ("t0", "last", "phases", "cache_desc")

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.phases: dict[str, float] = dict.fromkeys(_GW_PHASES, 0.0)
        self.cache_desc = "MISS"

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] += (now - self.last) * 1e3
        self.last = now

    def header(self) -> str:
        total = (time.perf_counter() - self.t0) * 1e3
        return server_timing({**self.phases, "gw_total": total}, {"gw_cache": self.cache_desc})


class _Sender:
    """The ASGI send of one request, remembering whether the answer has started, and its status."""

    __slots__ = ("send", "started", "status")

    def __init__(self, send: Any) -> None:
        self.send = send
        self.started = False
        self.status = 0

    async def __call__(self, msg: dict) -> None:
        if msg["type"] == "http.response.start":
            self.started = True
            self.status = int(msg["status"])
        await self.send(msg)


def _front(path: str, headers: list[tuple[bytes, bytes]]) -> str:
    """Which API's shape the client speaks: /v1/chat/* is OpenAI; GET /v1/models is OpenAI
    unless the client sends anthropic-version (as the anthropic SDK always does)."""
    if path.startswith("/v1/chat"):
        return "openai"
    if path == "/v1/models" or path.startswith("/v1/models/"):
        return "anthropic" if any(k == b"anthropic-version" for k, _ in headers) else "openai"
    return "anthropic"


class Gateway:
    """The ASGI application."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        parts = urlsplit(cfg.upstream)
        self.backend = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        self.client: httpx.AsyncClient | None = None
        self.redis: Any = None
        self.limiter: Any = MemoryLimiter(cfg.max_tracked_keys)
        self.cache: Any = MemoryCache(cfg.cache_ttl_s)
        self.tiers = TierUsage()
        self.created = int(time.time())
        self.draining = False
        self.aborting = False
        self._active: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics = GatewayMetrics()

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        limits = httpx.Limits(max_connections=self.cfg.max_connections,
                              max_keepalive_connections=self.cfg.max_connections,
                              keepalive_expiry=UPSTREAM_KEEPALIVE_S)
        timeout = httpx.Timeout(connect=5.0, read=3600.0, write=60.0, pool=60.0)
        self.client = httpx.AsyncClient(base_url=self.cfg.upstream, limits=limits, timeout=timeout)
        if self.cfg.redis_url:
            import redis.asyncio as aioredis

            self.redis = aioredis.Redis.from_url(self.cfg.redis_url)
            self.limiter = RedisLimiter(self.redis)
            self.cache = RedisCache(self.redis, self.cfg.cache_ttl_s)

    async def shutdown(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    def abort_requests(self) -> None:
        """Grace is over: end every request still running (streams get an error event)."""
        self.aborting = True
        for task in list(self._active):
            task.cancel()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await self.startup()
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        rid = "gateway-" + os.urandom(12).hex()
        front = _front(path, scope["headers"])
        out = _Sender(send)
        task = asyncio.current_task()
        if task is not None:
            self._active.add(task)
        try:
            if path == "/health" and method == "GET":
                await _respond(out, 200, b'{"status":"ok"}', [(b"x-request-id", rid.encode())])
            elif path == "/metrics" and method == "GET":
                await _respond(out, 200, self.metrics.render(), [(b"content-type", METRICS_CONTENT_TYPE)],
                               content_type=False)
            elif path in ("/v1/messages", "/v1/chat/completions") and method == "POST":
                await self.handle(scope, receive, out, front, rid)
            elif (path, method) in (("/v1/models", "GET"), ("/v1/messages/count_tokens", "POST")) or (
                    method == "GET" and path.startswith("/v1/models/")):
                await self.forward_plain(scope, receive, out, front, rid)
            elif path.startswith("/admin/"):
                await self.forward_admin(scope, receive, out, rid)
            else:
                raise ApiError(404, "not_found_error", f"no route for {method} {path}")
        except ApiError as err:
            if not out.started:
                await self.error(out, front, err, rid)
        except ClientGone:
            return
        except asyncio.CancelledError:  # shutdown past grace: answer what has not started, then end cleanly
            if task is not None:
                task.uncancel()
            if not out.started:
                with contextlib.suppress(Exception):
                    await self.error(out, front, _shutting_down(), rid)
        except Exception:  # the API's own error shape, never a traceback on the wire
            log.exception("pygw internal error on %s %s", method, path)
            if not out.started:
                await self.error(out, front, ApiError(500, "api_error", "internal gateway error"), rid)
        finally:
            self._active.discard(task)  # type: ignore[arg-type]
            self.metrics.requests.labels(route_of(path), str(out.status)).inc()

    async def error(self, send: Any, front: str, err: ApiError, rid: str) -> None:
        body = error_body(err, front, rid)
        await _respond(send, err.status, body, [(b"x-request-id", rid.encode()), (b"via", b"1.1 pygw"), *err.headers])

    def _who(self, scope: dict) -> tuple[str, KeyPolicy]:
        who = self.cfg.keys.lookup(api_key(scope["headers"]))
        if who is None:
            raise ApiError(401, "authentication_error", "invalid or missing API key")
        return who

    async def _admit(self, ident: str, pol: KeyPolicy) -> list[tuple[bytes, bytes]]:
        """Apply the key's tier; the rate-limit headers of the answer, or ApiError 429."""
        dec = await self.limiter.acquire(ident, pol.rpm, pol.burst)
        hdrs = [(b"x-ratelimit-limit-requests", str(int(pol.rpm)).encode()),
                (b"x-ratelimit-remaining-requests", str(dec.remaining).encode())]
        why, retry_s = None, 1.0
        if not dec.allowed:
            why, retry_s = "requests per minute", dec.retry_after_s
        elif pol.max_concurrent and self.tiers.in_flight(ident) >= pol.max_concurrent:
            why = f"{pol.max_concurrent} requests in flight"
        elif pol.tokens_per_min:
            used = self.tiers.tokens(ident)
            hdrs += [(b"x-ratelimit-limit-tokens", str(pol.tokens_per_min).encode()),
                     (b"x-ratelimit-remaining-tokens", str(max(0, pol.tokens_per_min - used)).encode())]
            if used >= pol.tokens_per_min:
                why, retry_s = f"{pol.tokens_per_min} tokens per minute", self.tiers.token_reset_s(ident)
        if why is not None:
            retry = max(1, int(retry_s + 0.999))
            raise ApiError(429, "rate_limit_error", f"rate limit exceeded for key {pol.name!r}: {why}; "
                           f"retry in {retry} s", headers=[*hdrs, (b"retry-after", str(retry).encode())])
        return hdrs

    async def handle(self, scope: dict, receive: Any, send: _Sender, front: str, rid: str) -> None:
        timer = _Timer()
        body = await read_body(receive, self.cfg.max_body_bytes, _header(scope, b"content-length"))
        timer.last = time.perf_counter()  # reading the body counts in gw_total only
        ident, pol = self._who(scope)
        if not self.cfg.keys.open:      # forwarded as x-zgtool-tenant: the engine shares seats by client key
            scope["zg_tenant"] = ident  # (an open gateway knows no client keys, only what was presented)
        timer.mark("gw_auth")
        rl_headers = await self._admit(ident, pol)
        timer.mark("gw_ratelimit")
        self.tiers.enter(ident)
        tokens = 0
        try:
            tokens = await self._handle_admitted(scope, receive, send, front, rid, body, timer, rl_headers,
                                                 bool(pol.tokens_per_min))
        finally:
            self.tiers.leave(ident, tokens, count_tokens=bool(pol.tokens_per_min))
            own_ms = sum(v for k, v in timer.phases.items() if k != "gw_upstream")
            self.metrics.overhead.observe(own_ms / 1e3)

    async def _handle_admitted(self, scope: dict, receive: Any, send: _Sender, front: str, rid: str, body: bytes,
                               timer: _Timer, rl_headers: list[tuple[bytes, bytes]], want_usage: bool) -> int:
        """Translate, moderate, cache, forward; the tokens the upstream reported (0 when unknown)."""
        req = load_json_object(body)
        adjusted: list[str] = []
        if front == "openai":
            up_req, adjusted = openai_to_anthropic(req)
            if req.get("max_tokens") is None and req.get("max_completion_tokens") is None:
                scope["zg_max_tokens_default"] = True    # the engine fills the rest of the context
        else:
            up_req = req
        if not isinstance(up_req.get("messages"), list):
            raise ApiError(400, "invalid_request_error", "messages: must be an array", param="messages")
        up_body = json.dumps(up_req).encode()
        if adjusted:
            rl_headers = [*rl_headers, (b"x-gateway-adjusted", "; ".join(adjusted).encode())]
        timer.mark("gw_translate")
        rule = self.cfg.policy.check(anthropic_input_text(up_req))
        timer.mark("gw_moderation")
        if rule is not None:
            raise ApiError(400, "invalid_request_error",
                           f"input rejected by moderation rule {rule.name!r}: {rule.message}",
                           headers=[(b"x-moderation", f"blocked; rule={rule.name}".encode())])
        stream = bool(up_req.get("stream"))
        cache_key = None
        if req.get("temperature") == 0:
            canon = json.dumps(req, sort_keys=True, separators=(",", ":")).encode()
            cache_key = hashlib.sha256(front.encode() + b"\0" + canon).hexdigest()
            hit = await self.cache.get(cache_key)
            if hit is not None:
                timer.cache_desc = "HIT"
                timer.mark("gw_cache")
                hdrs = [(b"content-type", hit.content_type.encode()), (b"x-cache", b"HIT"),
                        *self._own_headers(rid, None), *rl_headers, (b"server-timing", timer.header().encode())]
                await _respond(send, 200, hit.body, hdrs, content_type=False)
                return 0
        timer.mark("gw_cache")
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            resp, retries, why = await _until_gone(gone, self._call_upstream(up_body, scope))
            timer.mark("gw_upstream")
            self.metrics.upstream_latency.observe(timer.phases["gw_upstream"] / 1e3)
            if retries:
                self.metrics.retries.inc(retries)
            if resp is None:
                status = 504 if "timed out" in why else 502
                raise ApiError(status, None, f"upstream {self.cfg.upstream} unavailable: {why}",
                               headers=[(b"x-gateway-retries", str(retries).encode())])
            try:
                hdrs = self._pass_headers(resp, rid, timer) + rl_headers + [
                    (b"x-cache", b"MISS"), (b"x-gateway-retries", str(retries).encode())]
                is_sse = resp.headers.get("content-type", "").startswith("text/event-stream")
                if stream and resp.status_code == 200 and is_sse:
                    model = str(req.get("model", "")) if front == "openai" else None
                    watch = (StreamWatch(model, include_usage(req))
                             if model is not None or cache_key or want_usage else None)
                    await self._stream(gone, send, resp, hdrs, front, watch, cache_key)
                    return watch.tokens if watch is not None else 0
                data = await _until_gone(gone, resp.aread())
                return await self._answer(send, resp.status_code, data, hdrs, front, rid, cache_key, want_usage)
            finally:
                await resp.aclose()
        finally:
            gone.cancel()

    async def _answer(self, send: _Sender, status: int, data: bytes, hdrs: list[tuple[bytes, bytes]], front: str,
                      rid: str, cache_key: str | None, want_usage: bool) -> int:
        """A whole (non-stream) upstream answer in the client's shape; its token count."""
        tokens = 0
        if status == 200:
            if front == "openai" or want_usage:
                msg = json.loads(data)
                u = msg.get("usage") or {}
                tokens = int(u.get("input_tokens") or 0) + int(u.get("output_tokens") or 0)
                if front == "openai":
                    data = json.dumps(anthropic_to_openai(msg)).encode()
            if cache_key:
                await self.cache.put(cache_key, CachedResponse("application/json", data))
        else:  # any upstream error, 4xx included, in the client's API shape
            data = _error_for(front, data, status, rid)
            hdrs = [(k, v) for k, v in hdrs if k.lower() != b"content-type"]
            hdrs.append((b"content-type", b"application/json"))
        await _respond(send, status, data, hdrs, content_type=False)
        return tokens

    def _own_headers(self, rid: str, upstream: httpx.Response | None) -> list[tuple[bytes, bytes]]:
        via = b"1.1 pygw"
        if upstream is not None and "via" in upstream.headers:
            via = upstream.headers["via"].encode() + b", " + via
        out = [(b"via", via), (b"x-backend-server", self.backend.encode()), (b"x-request-id", rid.encode())]
        if upstream is not None and "x-request-id" in upstream.headers:
            out.append((b"x-upstream-request-id", upstream.headers["x-request-id"].encode()))
        return out

    def _pass_headers(self, resp: httpx.Response, rid: str, timer: _Timer | None) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in resp.headers.raw if k.lower() not in _DROP] + self._own_headers(rid, resp)
        if timer is not None:
            timing = timer.header()
            if "server-timing" in resp.headers:  # the engine's parts first, then ours
                timing = resp.headers["server-timing"] + ", " + timing
            out.append((b"server-timing", timing.encode()))
        return out

    def _upstream_headers(self, scope: dict) -> dict[str, str]:
        headers = {"content-type": "application/json", "via": "1.1 pygw", "anthropic-version": "2023-06-01"}
        for k, v in scope["headers"]:
            if k in _FORWARDED:
                headers[k.decode()] = v.decode("latin-1")
        if self.cfg.keys.upstream_key:
            headers["x-api-key"] = self.cfg.keys.upstream_key
        if scope.get("zg_tenant"):
            headers[TENANT_HEADER] = str(scope["zg_tenant"])
        if scope.get("zg_max_tokens_default"):
            headers[DEFAULT_MAX_TOKENS_HEADER] = "context"
        client_ip = (scope.get("client") or ("", 0))[0]
        if client_ip:
            headers["x-forwarded-for"] = client_ip
        return headers

    async def _call_upstream(self, body: bytes, scope: dict) -> tuple[httpx.Response | None, int, str]:
        """POST /v1/messages; retried on 5xx/529 answers (jittered backoff, honouring retry-after)
        and on failures to connect. A 4xx is final, and so is a connection lost after the body
        went out: the upstream may have refused it or started work on it."""
        assert self.client is not None
        headers = self._upstream_headers(scope)
        why = ""
        for attempt in range(self.cfg.max_retries + 1):
            wait_s = self.cfg.retry_base_s * (2**attempt) * random.uniform(0.5, 1.0)
            try:
                resp = await self.client.send(
                    self.client.build_request("POST", "/v1/messages", content=body, headers=headers), stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                why = f"timed out ({type(exc).__name__})" if isinstance(exc, httpx.TimeoutException) else \
                    f"{type(exc).__name__}: {exc}"
            except httpx.TimeoutException as exc:
                return None, attempt, f"timed out ({type(exc).__name__})"
            except httpx.TransportError as exc:
                return None, attempt, (f"the connection was lost while sending a {len(body)}-byte request "
                                       f"({type(exc).__name__}: {exc}); the upstream may not accept bodies this large")
            else:
                ra = _retry_after_s(resp.headers.get("retry-after"))
                if (resp.status_code not in RETRY_STATUSES or attempt == self.cfg.max_retries
                        or (ra is not None and ra > self.cfg.max_retry_wait_s)):
                    # done, out of attempts, or asked to wait longer than we would hold the client
                    return resp, attempt, ""
                await resp.aclose()
                wait_s = max(wait_s, ra or 0.0)
            if attempt < self.cfg.max_retries:
                await asyncio.sleep(wait_s)
        return None, self.cfg.max_retries, why

    async def _stream(self, gone: asyncio.Future, send: _Sender, resp: httpx.Response,
                      hdrs: list[tuple[bytes, bytes]], front: str, watch: StreamWatch | None,
                      cache_key: str | None) -> None:
        """SSE pass-through: every upstream chunk is written as soon as it arrives. A client
        that hangs up stops the relay, and closing the upstream response lets the engine abort.
        Only a stream that ended properly (message_stop, no error event) is cached."""
        hdrs = [*hdrs, (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send({"type": "http.response.start", "status": 200, "headers": hdrs})
        kept: list[bytes] | None = [] if cache_key else None
        task = asyncio.current_task()

        def hung_up(_: asyncio.Future) -> None:  # noticed at once, even while the upstream is silent
            if task is not None:
                task.cancel()

        gone.add_done_callback(hung_up)
        try:
            async for chunk in resp.aiter_raw():
                out = chunk if watch is None else watch.feed(chunk)
                if not out:
                    continue
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if kept is not None:
                    kept.append(out)
        except asyncio.CancelledError:
            gone.remove_done_callback(hung_up)  # the last send below completes the answer: no cancel after
            if task is not None:
                task.uncancel()
            if gone.done() and not gone.cancelled():  # the client left: closing resp aborts upstream
                return
            with contextlib.suppress(Exception):  # shutdown past grace: end it in its API's words
                await send({"type": "http.response.body", "body": _error_event(front), "more_body": False})
            return
        except httpx.TransportError as exc:  # the upstream went away mid-stream
            gone.remove_done_callback(hung_up)
            log.warning("upstream stream broke: %s", exc)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "more_body": False,
                            "body": _error_event(front, "api_error", "the upstream connection was lost")})
            return
        finally:
            gone.remove_done_callback(hung_up)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if kept is not None and watch is not None and watch.complete:
            await self.cache.put(cache_key, CachedResponse("text/event-stream", b"".join(kept)))

    async def forward_plain(self, scope: dict, receive: Any, send: Any, front: str, rid: str) -> None:
        """GET /v1/models, POST /v1/messages/count_tokens: auth, then a plain forward. The
        models list is answered in the client's shape (OpenAI's for the openai SDK)."""
        body = await read_body(receive, self.cfg.max_body_bytes, _header(scope, b"content-length"))
        ident, pol = self._who(scope)
        headers = {"via": "1.1 pygw", "anthropic-version": "2023-06-01", "content-type": "application/json"}
        headers.update((k.decode(), v.decode("latin-1")) for k, v in scope["headers"] if k in _TRACE_CONTEXT)
        if self.cfg.keys.upstream_key:
            headers["x-api-key"] = self.cfg.keys.upstream_key
        if scope["method"] == "POST":      # count_tokens is work (tokenizing): the key's tier holds
            rl_headers = await self._admit(ident, pol)
            self.tiers.enter(ident)
            try:
                resp = await self._plain(scope["method"], scope["path"], body, headers)
            finally:
                self.tiers.leave(ident)
        else:
            rl_headers = []
            resp = await self._plain(scope["method"], scope["path"], body, headers)
        data = resp.content
        if resp.status_code != 200:
            data = _error_for(front, data, resp.status_code, rid)
        elif scope["path"].startswith("/v1/models") and front == "openai":
            try:
                obj = json.loads(data)
                if scope["path"] == "/v1/models":
                    data = json.dumps(anthropic_models_to_openai(obj, self.created)).encode()
                else:  # one model
                    data = json.dumps(anthropic_models_to_openai({"data": [obj]}, self.created)["data"][0]).encode()
            except (ValueError, AttributeError, IndexError) as exc:
                raise ApiError(502, "api_error", f"upstream models answer is not a model list: {exc}") from exc
        hdrs = [(k, v) for k, v in resp.headers.raw if k.lower() not in _DROP | {b"content-type"}]
        hdrs += [*self._own_headers(rid, resp), *rl_headers, (b"content-type", b"application/json")]
        await _respond(send, resp.status_code, data, hdrs, content_type=False)

    async def forward_admin(self, scope: dict, receive: Any, send: Any, rid: str) -> None:
        """/admin/*: only a configured admin key that is presented, passed through with that key. An
        open gateway (no keys file, or one without [admin] keys) never serves it: it is the public
        front, and the engine's own port is where an operator without keys goes."""
        body = await read_body(receive, self.cfg.max_body_bytes, _header(scope, b"content-length"))
        presented = api_key(scope["headers"])
        ring = self.cfg.keys
        if not ring.admin:
            raise ApiError(403, "permission_error", ADMIN_DENIED_MESSAGE + " (no admin key is configured at pygw)")
        if not ring.is_admin(presented):
            if ring.lookup(presented) is None:
                raise ApiError(401, "authentication_error", "invalid or missing API key")
            raise ApiError(403, "permission_error", "/admin/* needs an admin key")
        headers = {"via": "1.1 pygw", "anthropic-version": "2023-06-01"}
        for k, v in scope["headers"]:
            if k in (b"x-api-key", b"authorization", b"content-type") or k in _TRACE_CONTEXT:
                headers[k.decode()] = v.decode("latin-1")
        path = scope["path"] + (("?" + scope["query_string"].decode("latin-1")) if scope.get("query_string") else "")
        resp = await self._plain(scope["method"], path, body, headers)
        hdrs = [(k, v) for k, v in resp.headers.raw if k.lower() not in _DROP] + self._own_headers(rid, resp)
        await _respond(send, resp.status_code, resp.content, hdrs, content_type=False)

    async def _plain(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        assert self.client is not None
        try:
            return await self.client.request(method, path, content=body or None, headers=headers)
        except httpx.TransportError as exc:
            raise ApiError(502, "api_error", f"upstream {self.cfg.upstream} unavailable: {exc!r}") from exc


def _header(scope: dict, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return v
    return None


def _shutting_down() -> ApiError:
    return ApiError(529, "overloaded_error", "the gateway is shutting down; retry on another instance",
                    headers=[(b"retry-after", b"1")])


def _error_event(front: str, err_type: str = "overloaded_error",
                 message: str = "the gateway is shutting down; the stream was cut off") -> bytes:
    """A stream's last event when it cannot finish: Anthropic `event: error`, or for OpenAI a
    data line with the error object (what the openai SDK raises as APIError)."""
    err = ApiError(529 if err_type == "overloaded_error" else 500, err_type, message)
    if front == "openai":  # then [DONE], as the engine's (and vLLM's) stream errors end
        return b"data: " + error_body(err, "openai", "") + b"\n\n" + DONE
    return b"event: error\ndata: " + json.dumps({"type": "error", "error": {"type": err_type, "message": message}},
                                                separators=(",", ":")).encode() + b"\n\n"


def _error_for(front: str, data: bytes, status: int, rid: str) -> bytes:
    """An upstream error body in the client's API shape (the upstream speaks Anthropic)."""
    if front == "openai":
        return upstream_error_to_openai(data, status)
    try:
        if json.loads(data).get("type") == "error":
            return data
    except (ValueError, AttributeError):
        pass
    return error_body(parse_error_body(data, status), "anthropic", rid)


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until_gone(gone: asyncio.Future, coro: Any) -> Any:
    """Await `coro` unless the client hangs up first: then cancel it (closing its upstream
    connection, which the engine sees as a disconnect and aborts) and raise ClientGone."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    try:
        result = await task
    except (asyncio.CancelledError, Exception):
        raise ClientGone() from None
    if isinstance(result, tuple) and isinstance(result[0], httpx.Response):
        await result[0].aclose()
    raise ClientGone()


def _retry_after_s(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]], *,
                   content_type: bool = True) -> None:
    hdrs = [*headers, (b"content-length", str(len(body)).encode())]
    if content_type:
        hdrs.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})

