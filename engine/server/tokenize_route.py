"""POST /tokenize, compatible with vLLM's: {"model"?, "prompt": str, "add_special_tokens"?: true} or
{"model"?, "messages": [...]} (the chat template applied, as a chat request's prompt is) ->
{"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}. Clients count prompt tokens with the
engine's own tokenizer through it (zgtool's --tokenizer server). Keys are checked as on /v1/ routes;
errors are OpenAI-shaped (vLLM's)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from zgtool.engine.api import openai as oai
from zgtool.engine.api.common import opt_bool, req_str
from zgtool.engine.errors import InvalidRequest
from zgtool.engine.server import handlers, intake
from zgtool.engine.server.context import Ctx

if TYPE_CHECKING:
    from zgtool.engine.server.app import ServerApp

THREAD_CHARS = 64 * 1024          # a longer prompt is tokenized off the event loop


def _object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("the body must be a JSON object with 'prompt' or 'messages'")
    return obj


def _chat(obj: dict[str, Any], max_model_len: int) -> Any:
    """The chat form as a chat request's parser reads it (the message cap checked first)."""
    intake.check_message_count(obj, intake.message_cap(max_model_len))
    return oai.parse_chat({**obj, "model": obj.get("model") or "-"}, max_model_len)


def _check_prompt_fits(prompt: str, max_token_chars: int | None, max_model_len: int) -> None:
    """A prompt whose characters alone need more tokens than the context holds is refused before it
    is tokenized (it could never be a prompt here; tokenizing megabytes would hold the server)."""
    if max_token_chars is None or len(prompt) <= intake.OFFLOAD_COST_CHARS:
        return
    least = -(-len(prompt) // max_token_chars)
    if least > max_model_len:
        raise intake.PromptCannotFit(least, len(prompt), max_token_chars, 0, max_model_len)


async def tokenize(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    ctx.api = "openai"
    ctx.principal = app.admission.authenticate(ctx.headers)
    body = await app.read_body(ctx, receive)
    large = len(body) > THREAD_CHARS        # decoded and parsed off the event loop
    obj = await app.offloads.in_thread(_object, body) if large else _object(body)
    model = obj.get("model")
    if model is not None:
        handlers._check_model(app, req_str(obj, "model"))
    tok = app.engine.tokenizer
    mml = app.engine.max_model_len
    bound = getattr(tok, "max_token_chars", None)
    # the key's tier holds here as on count_tokens: tokenizing is work
    principal, adm = ctx.principal, app.admission
    if "messages" in obj:
        req = await app.offloads.in_thread(_chat, obj, mml) if large else _chat(obj, mml)
        intake.check_fits(req, bound, mml)

        def run() -> Awaitable[list[int]]:
            return handlers._tokenize(app, req)
    elif "prompt" in obj:
        prompt = req_str(obj, "prompt")
        special = opt_bool(obj, "add_special_tokens", True)
        _check_prompt_fits(prompt, bound, mml)

        def run() -> Awaitable[list[int]]:
            if len(prompt) > THREAD_CHARS:
                return app.offloads.in_thread(tok.encode, prompt, special)
            return _ready(tok.encode(prompt, special))
    else:
        raise InvalidRequest("give 'prompt' (a string) or 'messages' (a chat) to tokenize")
    if principal is not None:
        adm.admit(principal, 0, app.stats(), time.monotonic())
    try:
        ids = await run()
    finally:
        if principal is not None:
            adm.release(principal, 0, None, time.monotonic())
    out = {"count": len(ids), "max_model_len": mml, "tokens": ids, "token_strs": None}
    await app.send_json(ctx, send, 200, json.dumps(out).encode())


async def _ready(ids: list[int]) -> list[int]:
    return ids
