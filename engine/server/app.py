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
from zgtool.engine.server import handlers, tokenize_route
from zgtool.engine.server.accesslog import AccessLog
from zgtool.engine.server.admission import Admission, Principal
from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.errors import HttpError, not_found, to_http_error
from zgtool.engine.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from zgtool.engine.server.metrics import ServerMetrics
from zgtool.engine.server.protocol import RESPOND, WRITE_CHUNK
from zgtool.engine.server.safety import SafetyPolicy
from zgtool.engine.server.sse import KeepaliveTicker
from zgtool.engine.server.tracing import SpanExporter, parse_traceparent, response_headers
from zgtool.http.body import ClientGone, load_json_object, read_body
from zgtool.http.errors import error_body

log = logging.getLogger("zgtool.serve")
SERVER_HEADER = (b"server", f"zgtool-engine/{__version__}".encode())
JSON_CT = (b"content-type", b"application/json")
STATS_TTL_S = 0.01     # load-hint figures may be this stale; engine.stats() is not free on a GPU
DRAIN_WRITE_S = 5.0    # after aborting at the end of the grace period: time for the error events to go out
# anthropic-version: absent is accepted (as 2023-06-01, like other compatible servers); a
# value that is not a version date is a client bug worth a 400.
ANTHROPIC_VERSION = re.compile(rb"\d{4}-\d{2}-\d{2}")
# Server-Timing of every answer: these parts in this order, formatted in one step from a
# tuple of their values (handlers build the tuple; no dict per request)
SERVER_TIMING_KEYS = handlers.SERVER_TIMING_KEYS
SERVER_TIMING_FMT = b", ".join(b"%s;dur=%%.3f" % k.encode() for k in SERVER_TIMING_KEYS)


class Ctx:
    """Per-request state shared by the handlers."""

    __slots__ = ("rid", "api", "t0", "headers", "principal", "started", "safety_ms", "status", "log", "error_type",
                 "respond", "write_chunk", "trace")

    def __init__(self, rid: str, api: str, t0: float, headers: dict[bytes, bytes], respond: Any = None) -> None:
        self.rid = rid
        self.api = api
        self.t0 = t0
        self.headers = headers
        self.principal: Principal | None = None
        self.started = False          # response headers sent
        self.safety_ms = 0.0          # input-side safety time (the engine times the output side)
        self.status = 0
        self.log: dict[str, Any] | None = None     # access-log record being built (generation routes)
        self.error_type: str | None = None
        self.respond = respond        # our protocol's one-write answer (protocol.RESPOND), or None
        self.write_chunk: Any = None  # our protocol's one piece of a stream (protocol.WRITE_CHUNK), or None
        tp = headers.get(b"traceparent")
        self.trace = None if tp is None else parse_traceparent(tp, headers.get(b"tracestate"))


class ServerApp:
    def __init__(self, engine: Any, cfg: ServeConfig, admission: Admission,
                 safety: SafetyPolicy | None = None, access_log: AccessLog | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.admission = admission
        self.safety = safety
        self.access_log = access_log
        self.draining = False
        self.inflight: dict[str, handlers.Flight] = {}
        keys = admission.keys
        self.metrics_keyed = cfg.metrics_require_key or bool(keys is not None and keys.metrics_require_key)
        # run.py serves with our protocol, which calls a per-request disconnect hook; under
        # any other ASGI server the handlers fall back to a watcher task.
        self.disconnect_hook = False
        # run.py: uvicorn's set of request tasks (all connections); one alone means a request
        # has nothing to be batched with and may take its first engine step at once
        self.request_tasks: set[Any] | None = None
        self.tracer: SpanExporter | None = None    # run.py: --otlp-endpoint
        # a stream silent for --stream-keepalive-s gets a keepalive (sse.py)
        self.keepalive = KeepaliveTicker(cfg.stream_keepalive_s, handlers.KEEPALIVE)
        self.created = int(time.time())
        from zgtool.engine.cpu_kernels import engine_isa, engine_status

        self.metrics = ServerMetrics(cfg.model, engine.stats,
                                     extra=lambda: {"zg_admission_cap_factor": admission.cap_factor},
                                     kernels=engine_status(engine), kernel_isa=engine_isa(engine))
        self._prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._stats: dict[str, Any] = {}
        self._stats_t = -1.0
        self._hint = b""
        self.routes: dict[str, dict[str, Any]] = {
            "/v1/messages": {"POST": handlers.messages},
            "/v1/messages/count_tokens": {"POST": handlers.count_tokens},
            "/v1/chat/completions": {"POST": handlers.chat_completions},
            "/v1/models": {"GET": _models},
            "/tokenize": {"POST": tokenize_route.tokenize},
            "/health": {"GET": _health},
            "/metrics": {"GET": _metrics},
            "/admin/kv": {"GET": _admin_kv},
            "/admin/defrag": {"POST": _admin_defrag},
        }

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
        # popped, not read: scope -> respond -> cycle -> scope would be a reference cycle that only the
        # garbage collector frees (10 objects per request, gen-1 collections on the hot path)
        ctx = Ctx(f"{self._prefix}{next(self._ids):x}", api, t0, dict(scope["headers"]), scope.pop(RESPOND, None))
        ctx.write_chunk = scope.pop(WRITE_CHUNK, None)
        try:
            route = self.routes.get(path)
            if route is None and path.startswith("/v1/models/"):
                route = {"GET": _model}
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
        headers = self.base_headers(ctx, timing)
        headers.append(content_type)
        if extra:
            headers += extra
        ctx.started = True
        ctx.status = status
        respond = ctx.respond
        if respond is not None and respond(status, headers, body):
            return        # written at once, content-length included
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def read_json(self, ctx: Ctx, receive: Any) -> dict[str, Any]:
        """The request body as a JSON object, bounded by --max-body-bytes."""
        body = await read_body(receive, self.cfg.max_body_bytes, ctx.headers.get(b"content-length"))
        return load_json_object(body)

    def require_admin(self, ctx: Ctx) -> None:
        if ctx.principal is None or not ctx.principal.is_admin:
            raise HttpError(403, "permission_error", "this endpoint needs an admin key ([admin] keys in keys.toml)")


# -- small routes -------------------------------------------------------------

# /health answers 503 "degraded" (what Kubernetes probes and load balancers act on) once the engine
# has had work and run no step for this long: a wedged engine must not look healthy.
STALLED_AFTER_S = 30.0


async def _health(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    if app.draining:
        await app.send_json(ctx, send, 503, b'{"status":"draining"}')
        return
    stalled = app.engine.stalled_s() if hasattr(app.engine, "stalled_s") else 0.0
    if stalled > STALLED_AFTER_S:
        body = json.dumps({"status": "degraded", "reason": f"the engine has had work and made no progress "
                                                           f"for {stalled:.0f} s"}).encode()
        await app.send_json(ctx, send, 503, body)
        return
    await app.send_json(ctx, send, 200, b'{"status":"ok"}')


async def _metrics(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    body = app.metrics.render()
    await app.send_json(ctx, send, 200, body, content_type=(b"content-type", METRICS_CONTENT_TYPE))


def _model_obj(app: ServerApp, api: str, name: str) -> dict[str, Any]:
    if api == "anthropic":
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(app.created))
        return {"type": "model", "id": name, "display_name": name, "created_at": created}
    return {"id": name, "object": "model", "created": app.created, "owned_by": "zgtool"}


async def _models(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    names = list(dict.fromkeys(app.cfg.served_names))
    data = [_model_obj(app, ctx.api, n) for n in names]
    if ctx.api == "anthropic":
        body: dict[str, Any] = {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    else:
        body = {"object": "list", "data": data}
    await app.send_json(ctx, send, 200, json.dumps(body).encode())


async def _model(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    """GET /v1/models/{id}: one served model, or 404 not_found_error."""
    name = scope["path"][len("/v1/models/"):]
    if name not in app.cfg.served_names:
        raise HttpError(404, "not_found_error", f"model {name!r} is not served here", code="model_not_found",
                        param="model")
    await app.send_json(ctx, send, 200, json.dumps(_model_obj(app, ctx.api, name)).encode())


async def _admin_kv(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    app.require_admin(ctx)
    # kv_report runs between two engine steps and blocks until then: keep it off the loop.
    report = await asyncio.get_running_loop().run_in_executor(None, app.engine.kv_report)
    await app.send_json(ctx, send, 200, json.dumps(report, default=str).encode())


async def _admin_defrag(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    app.require_admin(ctx)
    body = await app.read_json(ctx, receive) if ctx.headers.get(b"content-length", b"0") != b"0" else {}
    flags = {}
    for key in ("dry_run", "drop_prefix_cache"):
        value = body.get(key, False)
        if not isinstance(value, bool):
            raise HttpError(400, "invalid_request_error", f"{key}: must be a boolean")
        flags[key] = value
    result = await asyncio.get_running_loop().run_in_executor(
        None, lambda: app.engine.defrag(flags["dry_run"], flags["drop_prefix_cache"]))
    await app.send_json(ctx, send, 200, json.dumps(result, default=str).encode())
