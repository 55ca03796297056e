"""pygw: zgtool's Python AI gateway, built the way LiteLLM-like gateways are: an ASGI app
on uvicorn with a pooled httpx client. Per request: read body, auth (virtual keys),
rate limit, parse + translate, moderation, cache lookup, forward (with retries),
re-serialize or stream SSE through unbuffered.

    python -m zgtool.gateway.pygw --upstream URL --port P [--redis URL] [--keys F] [--policy F]
"""

from __future__ import annotations

import asyncio
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

from zgtool.gateway.policy import KeyRing, Policy
from zgtool.gateway.state import CachedResponse, MemoryCache, MemoryLimiter, RedisCache, RedisLimiter
from zgtool.gateway.translate import (
    OpenAIStream,
    TranslationError,
    anthropic_input_text,
    anthropic_to_openai,
    error_body,
    iter_sse,
    openai_to_anthropic,
    upstream_error_to_openai,
)

log = logging.getLogger("pygw")
RETRY_STATUSES = frozenset({500, 502, 503, 504, 529})
# hop-by-hop or rewritten by pygw: never copied from the upstream answer
_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"server", b"date",
                   b"x-request-id", b"via", b"server-timing", b"content-encoding"})
_STATUS_TYPE = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 502: "api_error", 503: "api_error",
                504: "timeout_error"}


@dataclass(frozen=True)
class GatewayConfig:
    upstream: str
    keys: KeyRing
    policy: Policy
    redis_url: str | None = None
    cache_ttl_s: float = 300.0
    max_retries: int = 2
    retry_base_s: float = 0.1
    max_retry_wait_s: float = 10.0
    max_connections: int = 256
    max_body_bytes: int = 32 * 1024 * 1024


class _Timer:
    """The gw_* phases of one request, in ms, rendered as Server-Timing metrics. gw_total
    runs from the first body byte read to the response headers, so it also holds the body
    read; for streams gw_upstream ends at the upstream's headers, not its last token."""

    __slots__ = ("t0", "last", "phases", "cache_desc")

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}
        self.cache_desc = "MISS"

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + (now - self.last) * 1e3
        self.last = now

    def header(self) -> str:
        p = self.phases
        total = (time.perf_counter() - self.t0) * 1e3
        names = ("gw_auth", "gw_ratelimit", "gw_cache", "gw_translate", "gw_moderation", "gw_upstream")
        parts = [f"{n};dur={p.get(n, 0.0):.3f}" + (f';desc="{self.cache_desc}"' if n == "gw_cache" else "")
                 for n in names]
        return ", ".join([*parts, f"gw_total;dur={total:.3f}"])


class Gateway:
    """The ASGI application."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        parts = urlsplit(cfg.upstream)
        self.backend = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        self.client: httpx.AsyncClient | None = None
        self.redis: Any = None
        self.limiter: Any = MemoryLimiter()
        self.cache: Any = MemoryCache(cfg.cache_ttl_s)

    async def startup(self) -> None:
        limits = httpx.Limits(max_connections=self.cfg.max_connections,
                              max_keepalive_connections=self.cfg.max_connections, keepalive_expiry=60)
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
        front = "openai" if path.startswith("/v1/chat") or path == "/v1/models" else "anthropic"
        try:
            if path == "/health" and method == "GET":
                await _respond(send, 200, b'{"status":"ok"}', [(b"x-request-id", rid.encode())])
            elif path in ("/v1/messages", "/v1/chat/completions") and method == "POST":
                await self.handle(scope, receive, send, front, rid)
            elif path in ("/v1/models", "/v1/messages/count_tokens"):
                await self.forward_plain(scope, receive, send, front, rid)
            else:
                await self.error(send, front, 404, f"no route for {method} {path}", rid)
        except Exception:  # the API's own error shape, never a traceback on the wire
            log.exception("pygw internal error on %s %s", method, path)
            await self.error(send, front, 500, "internal gateway error", rid, err_type="api_error")

    async def error(self, send: Any, front: str, status: int, msg: str, rid: str, *,
                    err_type: str | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = error_body(front, err_type or _STATUS_TYPE.get(status, "api_error"), msg, rid)
        await _respond(send, status, body, [(b"x-request-id", rid.encode()), (b"via", b"1.1 pygw"),
                                            *(headers or [])])

    def _auth(self, scope: dict) -> tuple[str, Any] | None:
        presented = None
        for k, v in scope["headers"]:
            if k == b"x-api-key":
                presented = v.decode("latin-1")
                break
            if k == b"authorization" and v[:7].lower() == b"bearer ":
                presented = v[7:].decode("latin-1").strip()
        return self.cfg.keys.lookup(presented)

    async def handle(self, scope: dict, receive: Any, send: Any, front: str, rid: str) -> None:
        timer = _Timer()
        body = await _read_body(receive, self.cfg.max_body_bytes)
        if body is None:
            return await self.error(send, front, 413, "request body too large", rid)
        timer.last = time.perf_counter()  # reading the body counts in gw_total only
        who = self._auth(scope)
        timer.mark("gw_auth")
        if who is None:
            return await self.error(send, front, 401, "invalid or missing API key", rid)
        ident, pol = who
        dec = await self.limiter.acquire(ident, pol.rpm, pol.burst)
        timer.mark("gw_ratelimit")
        rl_headers = [(b"x-ratelimit-limit-requests", str(int(pol.rpm)).encode()),
                      (b"x-ratelimit-remaining-requests", str(dec.remaining).encode())]
        if not dec.allowed:
            retry_s = max(1, int(dec.retry_after_s + 0.999))
            return await self.error(send, front, 429, f"rate limit exceeded for key {pol.name!r}; retry in {retry_s} s",
                                    rid, headers=[*rl_headers, (b"retry-after", str(retry_s).encode())])
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise TranslationError("request body must be a JSON object")
            up_req = openai_to_anthropic(req) if front == "openai" else req
            if not isinstance(up_req.get("messages"), list):
                raise TranslationError("messages must be a list")
            up_body = json.dumps(up_req).encode()
        except (ValueError, TranslationError) as exc:
            return await self.error(send, front, 400, f"invalid request: {exc}", rid)
        timer.mark("gw_translate")
        rule = self.cfg.policy.check(anthropic_input_text(up_req))
        timer.mark("gw_moderation")
        if rule is not None:
            return await self.error(send, front, 400, f"input rejected by moderation rule {rule.name!r}: {rule.message}",
                                    rid, headers=[(b"x-moderation", f"blocked; rule={rule.name}".encode())])
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
                return await _respond(send, 200, hit.body, hdrs, content_type=False)
        timer.mark("gw_cache")
        resp, retries, why = await self._call_upstream(up_body, scope)
        timer.mark("gw_upstream")
        if resp is None:
            status = 504 if "timed out" in why else 502
            return await self.error(send, front, status, f"upstream {self.cfg.upstream} unavailable: {why}", rid,
                                    headers=[(b"x-gateway-retries", str(retries).encode())])
        try:
            hdrs = self._pass_headers(resp, rid, timer) + rl_headers + [
                (b"x-cache", b"MISS"), (b"x-gateway-retries", str(retries).encode())]
            is_sse = resp.headers.get("content-type", "").startswith("text/event-stream")
            if stream and resp.status_code == 200 and is_sse:
                await self._stream(receive, send, resp, hdrs, front, req, cache_key)
                return
            data = await resp.aread()
            if front == "openai":
                data = (json.dumps(anthropic_to_openai(json.loads(data))).encode() if resp.status_code == 200
                        else upstream_error_to_openai(data, resp.status_code))
            if cache_key and resp.status_code == 200:
                await self.cache.put(cache_key, CachedResponse("application/json", data))
            await _respond(send, resp.status_code, data, hdrs, content_type=False)
        finally:
            await resp.aclose()

    def _own_headers(self, rid: str, upstream: httpx.Response | None) -> list[tuple[bytes, bytes]]:
        via = b"1.1 pygw"
        if upstream is not None and "via" in upstream.headers:
            via = upstream.headers["via"].encode() + b", " + via
        out = [(b"via", via), (b"x-backend-server", self.backend.encode()), (b"x-request-id", rid.encode())]
        if upstream is not None and "x-request-id" in upstream.headers:
            out.append((b"x-upstream-request-id", upstream.headers["x-request-id"].encode()))
        return out

    def _pass_headers(self, resp: httpx.Response, rid: str, timer: _Timer) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in resp.headers.raw if k.lower() not in _DROP]
        timing = timer.header()
        if "server-timing" in resp.headers:  # the engine's parts first, then ours
            timing = resp.headers["server-timing"] + ", " + timing
        return out + self._own_headers(rid, resp) + [(b"server-timing", timing.encode())]

    async def _call_upstream(self, body: bytes, scope: dict) -> tuple[httpx.Response | None, int, str]:
        """POST /v1/messages with retries on 5xx/529 and transport errors (jittered backoff,
        honouring retry-after). Returns (response or None, retries used, why it failed)."""
        assert self.client is not None
        headers = {"content-type": "application/json", "via": "1.1 pygw",
                   "anthropic-version": "2023-06-01"}
        for k, v in scope["headers"]:
            if k in (b"anthropic-version", b"anthropic-beta"):
                headers[k.decode()] = v.decode("latin-1")
        if self.cfg.keys.upstream_key:
            headers["x-api-key"] = self.cfg.keys.upstream_key
        client_ip = (scope.get("client") or ("", 0))[0]
        if client_ip:
            headers["x-forwarded-for"] = client_ip
        why = ""
        for attempt in range(self.cfg.max_retries + 1):
            wait_s = self.cfg.retry_base_s * (2**attempt) * random.uniform(0.5, 1.0)
            try:
                resp = await self.client.send(
                    self.client.build_request("POST", "/v1/messages", content=body, headers=headers), stream=True)
            except httpx.TimeoutException as exc:
                why = f"timed out ({type(exc).__name__})"
            except httpx.TransportError as exc:
                why = f"{type(exc).__name__}: {exc}"
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

    async def _stream(self, receive: Any, send: Any, resp: httpx.Response, hdrs: list[tuple[bytes, bytes]],
                      front: str, req: dict, cache_key: str | None) -> None:
        """SSE pass-through: every upstream chunk is written as soon as it arrives. A client
        that hangs up stops the relay, and closing the upstream response lets the engine abort."""
        hdrs = [*hdrs, (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send({"type": "http.response.start", "status": 200, "headers": hdrs})
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        kept: list[bytes] | None = [] if cache_key else None
        complete = False
        conv = None if front == "anthropic" else OpenAIStream(
            str(req.get("model", "")), bool((req.get("stream_options") or {}).get("include_usage")))
        buf = bytearray()
        try:
            async for chunk in resp.aiter_raw():
                if gone.done():
                    return
                if conv is None:
                    out = chunk
                else:
                    buf += chunk
                    out = b"".join(conv.feed(ev, data) for ev, data in iter_sse(buf))
                    if not out:
                        continue
                    complete = complete or out.endswith(b"data: [DONE]\n\n")
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if kept is not None:
                    kept.append(out)
            complete = complete or conv is None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
        if kept is not None and complete:
            await self.cache.put(cache_key, CachedResponse("text/event-stream", b"".join(kept)))

    async def forward_plain(self, scope: dict, receive: Any, send: Any, front: str, rid: str) -> None:
        """GET /v1/models, POST /v1/messages/count_tokens: auth, then a plain forward."""
        body = await _read_body(receive, self.cfg.max_body_bytes)
        if self._auth(scope) is None:
            return await self.error(send, front, 401, "invalid or missing API key", rid)
        assert self.client is not None
        headers = {"via": "1.1 pygw", "anthropic-version": "2023-06-01", "content-type": "application/json"}
        if self.cfg.keys.upstream_key:
            headers["x-api-key"] = self.cfg.keys.upstream_key
        try:
            resp = await self.client.request(scope["method"], scope["path"], content=body or None, headers=headers)
        except httpx.TransportError as exc:
            return await self.error(send, front, 502, f"upstream {self.cfg.upstream} unavailable: {exc!r}", rid)
        hdrs = [(k, v) for k, v in resp.headers.raw if k.lower() not in _DROP] + self._own_headers(rid, resp)
        await _respond(send, resp.status_code, resp.content, hdrs, content_type=False)


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _retry_after_s(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def _read_body(receive: Any, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b""
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


async def _respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]], *,
                   content_type: bool = True) -> None:
    hdrs = [*headers, (b"content-length", str(len(body)).encode())]
    if content_type:
        hdrs.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    from zgtool.gateway.pygw_main import main

    main()
