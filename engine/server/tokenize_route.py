"""POST /tokenize, compatible with vLLM's: {"model"?, "prompt": str, "add_special_tokens"?: true} or
{"model"?, "messages": [...]} (the chat template applied, as a chat request's prompt is) ->
{"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}. Clients count prompt tokens with the
engine's own tokenizer through it (zgtool's --tokenizer server). Keys are checked as on /v1/ routes;
errors are OpenAI-shaped (vLLM's)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from zgtool.engine.api import openai as oai
from zgtool.engine.api.common import opt_bool, req_str
from zgtool.engine.errors import InvalidRequest
from zgtool.engine.server import handlers, intake
from zgtool.http.body import read_body

if TYPE_CHECKING:
    from zgtool.engine.server.app import Ctx, ServerApp

THREAD_CHARS = 64 * 1024          # a longer prompt is tokenized off the event loop


def _object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("the body must be a JSON object with 'prompt' or 'messages'")
    return obj


async def tokenize(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    ctx.api = "openai"
    ctx.principal = app.admission.authenticate(ctx.headers)
    body = await read_body(receive, app.cfg.max_body_bytes, ctx.headers.get(b"content-length"))
    obj = _object(body)
    model = obj.get("model")
    if model is not None:
        handlers._check_model(app, req_str(obj, "model"))
    tok = app.engine.tokenizer
    if "messages" in obj:
        req = await intake.parse_body(oai.parse_chat, json.dumps({**obj, "model": model or "-"}).encode(),
                                      app.engine.max_model_len)
        ids = await handlers._tokenize(app, req)
    elif "prompt" in obj:
        prompt = req_str(obj, "prompt")
        special = opt_bool(obj, "add_special_tokens", True)
        ids = await asyncio.to_thread(tok.encode, prompt, special) if len(prompt) > THREAD_CHARS \
            else tok.encode(prompt, special)
    else:
        raise InvalidRequest("give 'prompt' (a string) or 'messages' (a chat) to tokenize")
    out = {"count": len(ids), "max_model_len": app.engine.max_model_len, "tokens": ids, "token_strs": None}
    await app.send_json(ctx, send, 200, json.dumps(out).encode())
