"""The route table: each path's handler per method (the generation flows in handlers.py, /tokenize
in tokenize_route.py, the small routes here). The app (app.py) is given the table and imports none
of them, so no handler module and the app import each other."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from zgtool.engine.server import handlers, tokenize_route
from zgtool.engine.server.context import Ctx, Routes
from zgtool.engine.server.errors import HttpError
from zgtool.engine.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

if TYPE_CHECKING:
    from zgtool.engine.server.app import ServerApp

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


def table() -> Routes:
    """Every route the engine serves."""
    return Routes(
        exact={
            "/v1/messages": {"POST": handlers.messages},
            "/v1/messages/count_tokens": {"POST": handlers.count_tokens},
            "/v1/chat/completions": {"POST": handlers.chat_completions},
            "/v1/models": {"GET": _models},
            "/tokenize": {"POST": tokenize_route.tokenize},
            "/health": {"GET": _health},
            "/metrics": {"GET": _metrics},
            "/admin/kv": {"GET": _admin_kv},
            "/admin/defrag": {"POST": _admin_defrag},
        },
        prefix=(("/v1/models/", {"GET": _model}),),
    )
