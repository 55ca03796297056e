"""The raw ASGI callable: routing, body reading, common headers, errors, small routes.

No framework layer: one dict lookup routes a request, the generation flows live in
handlers.py, and every exception becomes an API-shaped error answer in ``_fail``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import time
from typing import Any

from zgtool import __version__
from zgtool.engine.api.common import load_json_object
from zgtool.engine.server import handlers
from zgtool.engine.server.accesslog import AccessLog
from zgtool.engine.server.admission import Admission, Principal
from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.errors import HttpError, error_body, not_found, to_http_error
from zgtool.engine.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from zgtool.engine.server.metrics import ServerMetrics
from zgtool.engine.server.safety import SafetyPolicy

log = logging.getLogger("zgtool.serve")
SERVER_HEADER = (b"server", f"zgtool-engine/{__version__}".encode())
JSON_CT = (b"content-type", b"application/json")
STATS_TTL_S = 0.01     # load-hint figures may be this stale; engine.stats() is not free on a GPU


class ClientGone(Exception):
    """The client disconnected before we answered: nothing to send."""


class Ctx:
    """Per-request state shared by the handlers."""

    __slots__ = ("rid", "api", "t0", "headers", "principal", "started", "safety_ms", "status", "log", "error_type")

    def __init__(self, rid: str, api: str, t0: float, headers: dict[bytes, bytes]) -> None:
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


class ServerApp:
    def __init__(self, engine: Any, cfg: ServeConfig, admission: Admission,
                 safety: SafetyPolicy | None = None, access_log: AccessLog | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.admission = admission
        self.safety = safety
        self.access_log = access_log
        self.draining = False
        # run.py serves with our protocol, which calls a per-request disconnect hook; under
        # any other ASGI server the handlers fall back to a watcher task.
        self.disconnect_hook = False
        self.created = int(time.time())
        self.metrics = ServerMetrics(cfg.model, engine.stats,
                                     extra=lambda: {"zg_admission_cap_factor": admission.cap_factor})
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
                if self.access_log is not None:
                    self.access_log.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        path = scope["path"]
        api = "openai" if path.startswith("/v1/chat") else "anthropic"
        ctx = Ctx(f"{self._prefix}{next(self._ids):x}", api, t0, dict(scope["headers"]))
        try:
            route = self.routes.get(path)
            if route is None:
                raise not_found(f"no route for {scope['method']} {path}")
            handler = route.get(scope["method"])
            if handler is None:
                allow = ", ".join(route)
                raise HttpError(405, "invalid_request_error",
                                f"method {scope['method']} is not allowed on {path}; use {allow}",
                                headers=[(b"allow", allow.encode())])
            if path.startswith(("/v1/", "/admin/")):
                ctx.principal = self.admission.authenticate(ctx.headers)
                if path == "/v1/models" and b"anthropic-version" not in ctx.headers:
                    ctx.api = "openai"
            await handler(self, ctx, scope, receive, send)
        except ClientGone:
            return
        except asyncio.CancelledError:
            raise
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
    def stats(self) -> dict[str, Any]:
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

    def base_headers(self, ctx: Ctx, timing: dict[str, float] | None) -> list[tuple[bytes, bytes]]:
        if timing is None:
            # Before (or without) an engine request: the same names, so parsers see one shape.
            timing = {"queue": 0.0, "prefill": 0.0, "decode": 0.0, "detok": 0.0, "safety": ctx.safety_ms,
                      "total": (time.perf_counter() - ctx.t0) * 1e3}
        st = ", ".join(f"{k};dur={v:.3f}" for k, v in timing.items())
        return [
            SERVER_HEADER,
            (b"request-id", b"req_" + ctx.rid.encode()),
            (b"x-request-id", b"inference-" + ctx.rid.encode()),
            (b"server-timing", st.encode()),
            (b"x-gpu-load-hint", self.load_hint()),
        ]

    async def send_json(self, ctx: Ctx, send: Any, status: int, body: bytes,
                        extra: list[tuple[bytes, bytes]] | None = None, *,
                        timing: dict[str, float] | None = None, content_type: tuple[bytes, bytes] = JSON_CT) -> None:
        headers = self.base_headers(ctx, timing)
        headers.append(content_type)
        headers.append((b"content-length", str(len(body)).encode()))
        if extra:
            headers += extra
        ctx.started = True
        ctx.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def read_json(self, ctx: Ctx, receive: Any) -> dict[str, Any]:
        """The request body as a JSON object, bounded by --max-body-bytes."""
        limit = self.cfg.max_body_bytes
        cl = ctx.headers.get(b"content-length")
        if cl is not None:
            try:
                declared = int(cl)
            except ValueError:
                raise HttpError(400, "invalid_request_error", "content-length is not an integer") from None
            if declared > limit:
                raise HttpError(413, "request_too_large",
                                f"request body is {declared} bytes; this server accepts at most {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone()
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise HttpError(413, "request_too_large",
                                    f"request body exceeds {limit} bytes; this server accepts at most {limit} bytes")
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return load_json_object(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def require_admin(self, ctx: Ctx) -> None:
        if ctx.principal is None or not ctx.principal.is_admin:
            raise HttpError(403, "permission_error", "this endpoint needs an admin key ([admin] keys in keys.toml)")


# -- small routes -------------------------------------------------------------

async def _health(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    if app.draining:
        await app.send_json(ctx, send, 503, b'{"status":"draining"}')
        return
    await app.send_json(ctx, send, 200, b'{"status":"ok"}')


async def _metrics(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    body = app.metrics.render()
    await app.send_json(ctx, send, 200, body, content_type=(b"content-type", METRICS_CONTENT_TYPE))


async def _models(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    from zgtool.engine.api.openai import models_body

    names = list(dict.fromkeys(app.cfg.served_names))
    if ctx.api == "anthropic":
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(app.created))
        data = [{"type": "model", "id": n, "display_name": n, "created_at": created} for n in names]
        body: dict[str, Any] = {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    else:
        body = models_body(names, app.created)
    await app.send_json(ctx, send, 200, json.dumps(body).encode())


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
