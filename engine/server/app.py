"""The raw ASGI callable: routing, body reading, common headers, errors, small routes.

No framework layer: one dict lookup routes a request, the generation flows live in
handlers.py, and every exception becomes an API-shaped error answer in ``_fail``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import secrets
import time
from typing import Any

from zgtool import __version__
from zgtool.engine.server.accesslog import AccessLog
from zgtool.engine.server.admission import Admission
from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.context import KEEPALIVE, SERVER_TIMING_FMT, Ctx, Flight, Routes
from zgtool.engine.server.errors import HttpError, not_found, to_http_error
from zgtool.engine.server.metrics import ServerMetrics
from zgtool.engine.server.offload import Offloads
from zgtool.engine.server.protocol import CYCLE
from zgtool.engine.server.safety import SafetyPolicy
from zgtool.engine.server.sse import KeepaliveTicker
from zgtool.engine.server.tracing import SpanExporter, response_headers
from zgtool.http.body import ClientGone, load_json_object, read_body
from zgtool.http.errors import error_body

log = logging.getLogger("zgtool.serve")
SERVER_HEADER = (b"server", f"zgtool-engine/{__version__}".encode())
JSON_CT = (b"content-type", b"application/json")
# the head lines of the usual answer (no trace context, no extra headers, JSON), formatted in one
# step: what base_headers + JSON_CT give, line for line (tests/engine/server/test_server_respond.py)
PLAIN_JSON_LINES = (b"%s: %s\r\nrequest-id: req_%%s\r\nx-request-id: inference-%%s\r\nserver-timing: %s\r\n"
                    b"x-gpu-load-hint: %%s\r\n%s: %s\r\n") % (*SERVER_HEADER, SERVER_TIMING_FMT,
                                                             *JSON_CT)
PLAIN_JSON_NUM_LINES = 6
STATS_TTL_S = 0.01     # load-hint figures may be this stale; engine.stats() is not free on a GPU
DRAIN_WRITE_S = 5.0    # after aborting at the end of the grace period: time for the error events to go out
# anthropic-version: absent is accepted (as 2023-06-01, like other compatible servers); a
# value that is not a version date is a client bug worth a 400.
ANTHROPIC_VERSION = re.compile(rb"\d{4}-\d{2}-\d{2}")


class ServerApp:
    def __init__(self, engine: Any, cfg: ServeConfig, admission: Admission, routes: Routes,
                 safety: SafetyPolicy | None = None, access_log: AccessLog | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.admission = admission
        self.safety = safety
        self.access_log = access_log
        self.draining = False
        self.inflight: dict[str, Flight] = {}
        keys = admission.keys
        self.metrics_keyed = cfg.metrics_require_key or bool(keys is not None and keys.metrics_require_key)
        # run.py serves with our protocol, which calls a per-request disconnect hook; under
        # any other ASGI server the handlers fall back to a watcher task.
        self.disconnect_hook = False
        # run.py: uvicorn's set of request tasks (all connections); one alone means a request
        # has nothing to be batched with and may take its first engine step at once
        self.request_tasks: set[Any] | None = None
        self.tracer: SpanExporter | None = None    # run.py: --otlp-endpoint
        self.offloads = Offloads()                 # work in other threads; the loop shares the GIL with it
        # a stream silent for --stream-keepalive-s gets a keepalive (sse.py)
        self.keepalive = KeepaliveTicker(cfg.stream_keepalive_s, KEEPALIVE)
        self.created = int(time.time())
        from zgtool.engine.kernel_report import kernel_report

        kernels, isa = kernel_report(engine)
        self.metrics = ServerMetrics(cfg.model, engine.stats,
                                     extra=lambda: {"zg_admission_cap_factor": admission.cap_factor},
                                     kernels=kernels, kernel_isa=isa)
        self._prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._stats: dict[str, Any] = {}
        self._stats_t = -1.0
        self._hint = b""
        self.routes = routes.exact       # path -> {method: handler} (routes.py)
        self.prefix_routes = routes.prefix

    # -- ASGI --------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    self.engine.start(asyncio.get_running_loop())
                except Exception as exc:  # noqa: BLE001 - reported to uvicorn, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                self.draining = True
                await self.engine.shutdown(self.cfg.grace_s)
                if self.tracer is not None:
                    await asyncio.to_thread(self.tracer.close)
                if self.access_log is not None:
                    self.access_log.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def drain(self, grace_s: float, forced: Any = lambda: False) -> None:
        """Let generation requests finish within grace_s (or until ``forced()``, a second
        Ctrl-C); then abort the rest, each of which answers its API's overloaded error (an
        error event on a stream), and wait for those."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while self.inflight and time.monotonic() < deadline and not forced():
            await asyncio.sleep(0.02)
        if not self.inflight:
            return
        log.warning("grace period of %.1f s over: aborting %d request(s) with an overloaded error",
                    grace_s, len(self.inflight))
        for flight in list(self.inflight.values()):
            flight.abort_for_shutdown()
        deadline = time.monotonic() + DRAIN_WRITE_S
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        path = scope["path"]
        api = "openai" if path.startswith("/v1/chat") else "anthropic"
        # popped, not read: scope -> cycle -> scope would be a reference cycle that only the garbage
        # collector frees (10 objects per request, gen-1 collections on the hot path)
        ctx = Ctx(f"{self._prefix}{next(self._ids):x}", api, t0, dict(scope["headers"]), scope.pop(CYCLE, None))
        try:
            route = self.routes.get(path)
            if route is None:
                for prefix, by_method in self.prefix_routes:
                    if path.startswith(prefix):
                        route = by_method
                        break
            if route is None:
                raise not_found(f"no route for {scope['method']} {path}")
            handler = route.get(scope["method"])
            if handler is None:
                allow = ", ".join(route)
                raise HttpError(405, "invalid_request_error",
                                f"method {scope['method']} is not allowed on {path}; use {allow}",
                                headers=[(b"allow", allow.encode())])
            if path.startswith(("/v1/", "/admin/")) or (path == "/metrics" and self.metrics_keyed):
                version = ctx.headers.get(b"anthropic-version")
                if path.startswith("/v1/models") and version is None:
                    ctx.api = "openai"
                ctx.principal = self.admission.authenticate(ctx.headers)
                if version is not None and ctx.api == "anthropic" and not ANTHROPIC_VERSION.fullmatch(version):
                    raise HttpError(400, "invalid_request_error",
                                    "anthropic-version: must be a version date such as 2023-06-01",
                                    param="anthropic-version")
            await handler(self, ctx, scope, receive, send)
        except ClientGone:
            return
        except asyncio.CancelledError:
            # uvicorn cancels request tasks only when its own shutdown timeout expires, after
            # drain(); the handler's cleanup has run, so end quietly instead of a traceback.
            log.info("request %s cancelled at shutdown", ctx.rid)
            return
        except Exception as exc:  # noqa: BLE001 - the one place errors become answers
            await self._fail(ctx, send, exc)
        if self.access_log is not None and (ctx.status >= 400 or path not in ("/health", "/metrics")):
            self._log_request(ctx, scope)

    def _log_request(self, ctx: Ctx, scope: dict[str, Any]) -> None:
        """One line per request: the generation flow's record, or a minimal one (errors, admin)."""
        assert self.access_log is not None
        rec = ctx.log
        if rec is None:
            rec = {"request_id": ctx.rid, "key": ctx.principal.name if ctx.principal else None,
                   "api": ctx.api, "total_ms": round((time.perf_counter() - ctx.t0) * 1e3, 3)}
        rec.update(method=scope["method"], path=scope["path"], status=ctx.status)
        if ctx.error_type is not None:
            rec["error_type"] = ctx.error_type
        self.access_log.write(rec)

    async def _fail(self, ctx: Ctx, send: Any, exc: BaseException) -> None:
        err = to_http_error(exc)
        if err.status >= 500 and err.error_type == "api_error":
            log.error("request %s failed", ctx.rid, exc_info=exc)
        self.metrics.observe_error(err.error_type)
        if ctx.started:
            ctx.error_type = err.error_type
            return   # streaming handlers report their own mid-stream errors
        headers = list(err.headers)
        if err.status == 413:
            headers.append((b"connection", b"close"))   # do not read the rest of a huge body
        if ctx.principal is not None and err.status != 429:
            headers += self.admission.ratelimit_headers(ctx.principal, time.monotonic())
        ctx.error_type = err.error_type
        await self.send_json(ctx, send, err.status, error_body(err, ctx.api, "req_" + ctx.rid), headers,
                             timing=None)

    # -- helpers shared with handlers --------------------------------------
    def stats(self, now: float | None = None) -> dict[str, Any]:
        if now is None:
            now = time.monotonic()
        if now - self._stats_t > STATS_TTL_S:
            self._stats = self.engine.stats()
            self._stats_t = now
            self._hint = b""
        return self._stats

    def load_hint(self) -> bytes:
        s = self.stats()
        if not self._hint:     # rebuilt when the stats are refreshed, not per request
            hint: dict[str, Any] = {"kv_util": round(float(s.get("kv_util") or 0.0), 4),
                                    "running": s.get("running", 0), "waiting": s.get("waiting", 0),
                                    "cap_factor": self.admission.cap_factor}
            if s.get("sm_util") is not None:
                hint["sm_util"] = s["sm_util"]
            if s.get("vram_free_gb") is not None:
                hint["vram_free_gb"] = s["vram_free_gb"]
            self._hint = json.dumps(hint, separators=(",", ":")).encode()
        return self._hint

    def base_headers(self, ctx: Ctx, timing: tuple[float, ...] | None) -> list[tuple[bytes, bytes]]:
        """Server, request ids, Server-Timing (``timing``: the SERVER_TIMING_KEYS values in
        that order, ms) and the load hint."""
        if timing is None:
            # Before (or without) an engine request: the same names, so parsers see one shape.
            timing = (0.0, 0.0, 0.0, 0.0, ctx.safety_ms, (time.perf_counter() - ctx.t0) * 1e3)
        rid = ctx.rid.encode()
        headers = [
            SERVER_HEADER,
            (b"request-id", b"req_" + rid),
            (b"x-request-id", b"inference-" + rid),
            (b"server-timing", SERVER_TIMING_FMT % timing),
            (b"x-gpu-load-hint", self.load_hint()),
        ]
        if ctx.trace is not None:
            headers += response_headers(ctx.trace)
        return headers

    async def send_json(self, ctx: Ctx, send: Any, status: int, body: bytes,
                        extra: list[tuple[bytes, bytes]] | None = None, *,
                        timing: tuple[float, ...] | None = None,
                        content_type: tuple[bytes, bytes] = JSON_CT) -> None:
        ctx.started = True
        ctx.status = status
        cycle = ctx.cycle
        if cycle is not None and not extra and ctx.trace is None and content_type is JSON_CT and timing is not None:
            rid = ctx.rid.encode()
            if cycle.respond_lines(status, PLAIN_JSON_LINES % (rid, rid, *timing, self.load_hint()),
                                   PLAIN_JSON_NUM_LINES, body):
                return    # the usual answer, its head formatted in one step and written at once
        headers = self.base_headers(ctx, timing)
        headers.append(content_type)
        if extra:
            headers += extra
        if cycle is not None and cycle.respond(status, headers, body):
            return        # written at once, content-length included
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def body_now(self, ctx: Ctx) -> bytes | None:
        """The whole request body from our protocol's cycle, when it has all arrived (within
        --max-body-bytes); None (nothing taken) when read_body must receive() it."""
        cycle = ctx.cycle
        return None if cycle is None else cycle.whole_body(self.cfg.max_body_bytes)  # type: ignore[no-any-return]

    async def read_body(self, ctx: Ctx, receive: Any) -> bytes:
        """The whole request body, bounded by --max-body-bytes (body_now, else through receive())."""
        body = self.body_now(ctx)
        if body is not None:
            return body
        return await read_body(receive, self.cfg.max_body_bytes, ctx.headers.get(b"content-length"))

    async def read_json(self, ctx: Ctx, receive: Any) -> dict[str, Any]:
        """The request body as a JSON object, bounded by --max-body-bytes."""
        body = await self.read_body(ctx, receive)
        return load_json_object(body)

    def require_admin(self, ctx: Ctx) -> None:
        if ctx.principal is None or not ctx.principal.is_admin:
            raise HttpError(403, "permission_error", "this endpoint needs an admin key ([admin] keys in keys.toml)")
