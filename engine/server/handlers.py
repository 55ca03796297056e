"""The generation flows: parse -> model check -> input safety -> tokenize -> admit ->
engine -> JSON body or SSE stream, for both APIs.

The disconnect hook is registered before tokenization, so a client that leaves while a
long prompt is tokenized off the loop never reaches the engine, and one that leaves
later aborts its engine request (the engine frees its KV blocks within one step).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from zgtool.engine.api import anthropic as anth
from zgtool.engine.api import openai as oai
from zgtool.engine.api.common import ChatRequest
from zgtool.engine.config import SamplingParams
from zgtool.engine.errors import ContextLengthExceeded, ModelNotFound
from zgtool.engine.server import intake
from zgtool.engine.server.context import KEEPALIVE, SERVER_TIMING_KEYS, Ctx, Flight
from zgtool.engine.server.errors import HttpError, content_policy, overloaded
from zgtool.engine.server.protocol import DISCONNECT_HOOK
from zgtool.engine.server.safetytext import Holdback
from zgtool.engine.server.sse import TokenGrouper
from zgtool.engine.server.tracing import make_span
from zgtool.http.body import ClientGone, dumps
from zgtool.http.errors import error_payload
from zgtool.http.sse import SSE_HEADERS, comment

if TYPE_CHECKING:
    from zgtool.engine.server.app import ServerApp

# pygw sends its default max_tokens (any Anthropic upstream needs one) with this header set to
# "context" when its OpenAI client chose none: here that means the rest of the context, as on the
# engine's own OpenAI route
DEFAULT_MAX_TOKENS_HEADER = b"x-zgtool-max-tokens-default"

KEEPALIVE_COMMENT = comment("keepalive")      # the OpenAI route's keepalive (SDKs drop SSE comments)


async def messages(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    body = app.body_now(ctx)
    if body is None:
        body = await app.read_body(ctx, receive)
    rest = ctx.headers.get(DEFAULT_MAX_TOKENS_HEADER) == b"context"
    parse = _parse_rest_of_context if rest else anth.parse_messages
    req = _parsed_now(app, parse, body) or await _parse_body(app, parse, body)
    await _generate(app, ctx, scope, req, receive, send)


def _parsed_now(app: ServerApp, parse: intake.Parse, body: bytes) -> ChatRequest | None:
    """A body parse_body would decode on the loop anyway, decoded without its coroutine; None for
    a larger one (await _parse_body)."""
    if len(body) > intake.OFFLOAD_BODY_BYTES:
        return None
    return intake.decode(parse, body, app.engine.max_model_len)


async def _parse_body(app: ServerApp, parse: intake.Parse, body: bytes) -> ChatRequest:
    """intake.parse_body with what lets it refuse a large prompt that cannot fit in its worker
    process (the model checked first, as _generate and count_tokens do). Counted as thread work only
    when it goes off the loop (a small body is decoded here: no hand-over timer for it)."""
    parsing = intake.parse_body(parse, body, app.engine.max_model_len,
                                getattr(app.engine.tokenizer, "max_token_chars", None),
                                lambda model: _check_model(app, model))
    if len(body) > intake.OFFLOAD_BODY_BYTES:
        return await app.offloads.waiting(parsing)
    return await parsing


def _parse_rest_of_context(obj: dict[str, Any], max_model_len: int) -> ChatRequest:
    """A Messages body whose max_tokens is pygw's stand-in for a client that chose none: the
    request gets the rest of the context, as on the engine's own OpenAI route."""
    req = anth.parse_messages({**obj, "max_tokens": 1}, max_model_len)
    req.max_tokens = None
    return req


async def chat_completions(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    body = app.body_now(ctx)
    if body is None:
        body = await app.read_body(ctx, receive)
    req = _parsed_now(app, oai.parse_chat, body) or await _parse_body(app, oai.parse_chat, body)
    await _generate(app, ctx, scope, req, receive, send)


async def count_tokens(app: ServerApp, ctx: Ctx, scope: Any, receive: Any, send: Any) -> None:
    body = await app.read_body(ctx, receive)
    req = await _parse_body(app, _parse_count_tokens, body)
    _check_model(app, req.model)
    intake.check_fits(req, getattr(app.engine.tokenizer, "max_token_chars", None), app.engine.max_model_len)
    # the key's tier holds here too (concurrency, requests per minute): tokenizing is work
    principal = ctx.principal
    adm = app.admission
    if principal is not None:
        adm.admit(principal, 0, app.stats(), time.monotonic())
    try:
        ids = await _tokenize(app, req)
    finally:
        if principal is not None:
            adm.release(principal, 0, None, time.monotonic())
    await app.send_json(ctx, send, 200, b'{"input_tokens":' + str(len(ids)).encode() + b"}")


def _parse_count_tokens(obj: dict[str, Any], max_model_len: int) -> ChatRequest:
    return anth.parse_count_tokens(obj)


def _check_model(app: ServerApp, model: str) -> None:
    names = app.cfg.served_names
    if model not in names:
        raise ModelNotFound(f"model {model!r} is not served here; served models: {', '.join(dict.fromkeys(names))}")


async def _tokenize(app: ServerApp, req: ChatRequest) -> list[int]:
    tok = app.engine.tokenizer
    if intake.is_heavy(req):
        return await app.offloads.in_thread(tok.apply_chat_template, messages=req.messages, system=req.system)
    return tok.apply_chat_template(messages=req.messages, system=req.system)  # type: ignore[no-any-return]


# SamplingParams is frozen: requests with equal settings share one (its validation runs once)
_PARAMS: dict[tuple[Any, ...], SamplingParams] = {}
_PARAMS_MAX = 512


def _sampling_params(req: ChatRequest, max_tokens: int) -> SamplingParams:
    key = (max_tokens, req.temperature, req.top_p, req.top_k, req.seed, req.stop, req.ignore_eos)
    params = _PARAMS.get(key)
    if params is None:
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                                top_k=req.top_k, seed=req.seed, stop=req.stop, ignore_eos=req.ignore_eos)
        if len(_PARAMS) >= _PARAMS_MAX:
            _PARAMS.clear()
        _PARAMS[key] = params
    return params


def _timing(ctx: Ctx, stream: Any) -> tuple[float, ...]:
    """Server-Timing parts (app.SERVER_TIMING_KEYS order, ms): the engine's phases plus input
    safety; total is the server's own wall time for this request, so the parts always sum to
    no more than it."""
    t = stream.timings
    scheduled = t.first_scheduled_s
    return (
        0.0 if scheduled is None else (scheduled - t.arrival_s) * 1e3,     # RequestTimings.queue_ms
        t.prefill_ms,
        t.decode_ms,
        t.detok_ms,
        t.safety_ms + ctx.safety_ms,
        (time.perf_counter() - ctx.t0) * 1e3,
    )


def _timing_fields(timing: tuple[float, ...]) -> dict[str, float]:
    """The Server-Timing parts as ``<part>_ms`` fields (access log, the stream's timing event)."""
    return {f"{k}_ms": round(v, 3) for k, v in zip(SERVER_TIMING_KEYS, timing, strict=True)}


def _timing_event(ctx: Ctx, stream: Any, timing: tuple[float, ...]) -> dict[str, Any]:
    ev: dict[str, Any] = _timing_fields(timing)
    ttft = stream.timings.ttft_ms
    ev["ttft_ms"] = None if ttft is None else round(ttft, 3)
    # Emission times relative to arrival: a stream probe compares them with arrival times
    # to tell a buffering hop from a slow model.
    t0 = stream.timings.arrival_s
    ev["token_times_ms"] = [round((t - t0) * 1e3, 3) for t in stream.timings.token_times_s]
    ev["request_id"] = "inference-" + ctx.rid
    return ev


async def _watch_disconnect(receive: Any, on_gone: Any) -> None:
    """Fallback for ASGI servers without our protocol's disconnect hook: one task per request."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            on_gone()
            return


async def _generate(app: ServerApp, ctx: Ctx, scope: dict[str, Any], req: ChatRequest, receive: Any,
                    send: Any) -> None:
    _check_model(app, req.model)
    engine = app.engine
    chars = intake.text_chars(req)
    intake.check_fits(req, getattr(engine.tokenizer, "max_token_chars", None), engine.max_model_len, chars)
    heavy = intake.is_heavy(req, chars)
    safety = app.safety
    if safety is not None and not safety.input.empty:
        t = time.perf_counter()
        text = req.input_text()
        hit = await app.offloads.in_thread(safety.check_input, text) if heavy else safety.check_input(text)
        ctx.safety_ms += (time.perf_counter() - t) * 1e3
        if hit is not None:
            raise content_policy(hit)
    if app.draining:
        raise overloaded("the server is shutting down; retry on another replica")
    flight = Flight(ctx.rid, app.engine)
    watcher = None
    if app.disconnect_hook:
        scope[DISCONNECT_HOOK] = flight.on_gone
    else:
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, flight.on_gone))
    app.inflight[ctx.rid] = flight
    try:
        if heavy:
            prompt = await app.offloads.in_thread(engine.tokenizer.apply_chat_template, messages=req.messages,
                                                  system=req.system)
            if flight.gone:
                raise ClientGone()
        else:      # no await: the client cannot have left meanwhile
            prompt = app.engine.tokenizer.apply_chat_template(messages=req.messages, system=req.system)
        stream, filt = _admit(app, ctx, req, flight, prompt)
        try:
            if req.stream:
                await _stream(app, ctx, req, stream, send, flight, filt)
            else:
                await _complete(app, ctx, req, stream, send, flight)
        finally:
            _finished(app, ctx, stream, flight)
            if app.tracer is not None:
                app.tracer.submit(_span(app, ctx, req, stream))
    finally:
        flight.done = True
        del app.inflight[ctx.rid]
        if watcher is not None:
            watcher.cancel()


def _admit(app: ServerApp, ctx: Ctx, req: ChatRequest, flight: Flight, prompt: list[int]) -> tuple[Any, Any]:
    """Sampling params, admission (429s), the engine request: its stream and output filter."""
    engine = app.engine
    max_len = engine.max_model_len
    max_tokens = req.max_tokens if req.max_tokens is not None else max_len - len(prompt)
    if max_tokens < 1:
        raise ContextLengthExceeded(len(prompt), 1, max_len)
    params = _sampling_params(req, max_tokens)
    if app.draining or flight.shutdown:
        raise overloaded("the server is shutting down; retry on another replica")
    principal = ctx.principal
    assert principal is not None
    now = time.monotonic()
    stats = app.stats(now)
    adm = app.admission
    adm.update_load(stats, now)
    adm.admit(principal, len(prompt), stats, now)
    ctx.log = {"request_id": ctx.rid, "key": principal.name, "api": req.api, "model": req.model,
               "stream": req.stream, "prompt_tokens": len(prompt)} if app.access_log is not None else None
    if ctx.log is not None and ctx.trace is not None:
        ctx.log["trace_id"] = ctx.trace.trace_id
        ctx.log["parent_span_id"] = ctx.trace.parent_span_id
    filt = app.safety.output_filter() if app.safety is not None else None
    tasks = app.request_tasks
    try:
        # each API key is a tenant: running seats are shared fairly between keys (engine/scheduler.py),
        # so one key filling the batch cannot starve another (an open server has one tenant)
        stream = engine.add_request(prompt, params, request_id=ctx.rid, output_filter=filt,
                                    step_now=tasks is not None and len(tasks) <= 1, tenant=_tenant(ctx, adm),
                                    whole_answer=not req.stream)    # a JSON answer: one delta, at the end
    except BaseException:
        adm.release(principal, 0, None, time.monotonic())
        raise
    flight.started = True
    return stream, filt


def _tenant(ctx: Ctx, adm: Any) -> str | None:
    """Whose request this is, for the fair scheduler: the API key's name; behind a gateway that
    authenticates its own clients (pygw), the client key it names in x-zgtool-tenant. The header is
    believed only from a gateway key (keys.toml ``gateway = true``: the stack's per-run key) or an
    admin key, so a client that sends it itself gains nothing: on a keyed engine its own key is
    its tenant, on an open one every request shares one tenant."""
    principal = ctx.principal
    assert principal is not None
    if adm.open:
        return None
    if principal.is_gateway or principal.is_admin:
        named = ctx.headers.get(b"x-zgtool-tenant")
        if named:
            return named.decode("latin-1")[:128]
    return principal.name


def _finished(app: ServerApp, ctx: Ctx, stream: Any, flight: Flight) -> None:
    """After the answer (or its failure): abort what is left, release admission, metrics, log record."""
    flight.done = True
    reason = stream.finish_reason
    if reason is None:      # cancelled or failed mid-way
        app.engine.abort(ctx.rid)
    usage = stream.usage
    t = stream.timings
    principal = ctx.principal
    assert principal is not None
    app.admission.release(principal, usage.completion_tokens,
                          t.total_ms / 1e3 if t.finished_s is not None else None, time.monotonic())
    app.metrics.observe_finished(t, usage, reason)
    if ctx.log is not None:     # written by the app once the answer is out
        ctx.log.update(finish_reason=reason, client_gone=flight.gone,
                       completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                       ttft_ms=None if t.ttft_ms is None else round(t.ttft_ms, 3),
                       **_timing_fields(_timing(ctx, stream)))


def _span(app: ServerApp, ctx: Ctx, req: ChatRequest, stream: Any) -> dict[str, Any]:
    """The request's OTLP span: GenAI attributes under vLLM's names, in seconds. Queue, prefill and
    decode are the engine's (as in Server-Timing); TTFT and e2e run from the server's receipt."""
    now = time.perf_counter()
    t = stream.timings
    u = stream.usage
    wall_ns = time.time_ns()
    first = t.first_token_s
    attrs: dict[str, Any] = {
        "gen_ai.system": "zgtool",
        "gen_ai.request.id": "inference-" + ctx.rid,
        "gen_ai.request.model": req.model,
        "gen_ai.response.model": app.cfg.model,
        "gen_ai.request.max_tokens": req.max_tokens,
        "gen_ai.request.temperature": float(req.temperature),
        "gen_ai.request.top_p": float(req.top_p),
        "gen_ai.request.top_k": req.top_k or None,
        "gen_ai.request.n": 1,
        "gen_ai.request.stream": req.stream,
        "gen_ai.response.finish_reasons": [stream.finish_reason or "unknown"],
        "gen_ai.usage.prompt_tokens": u.prompt_tokens or len(stream.prompt_token_ids),
        "gen_ai.usage.completion_tokens": u.completion_tokens,
        "gen_ai.usage.cached_tokens": u.cached_tokens,
        "gen_ai.latency.time_in_queue": t.queue_ms / 1e3,
        "gen_ai.latency.time_to_first_token": None if first is None else first - ctx.t0,
        "gen_ai.latency.time_in_model_prefill": t.prefill_ms / 1e3,
        "gen_ai.latency.time_in_model_decode": t.decode_ms / 1e3,
        "gen_ai.latency.time_in_model_inference": (t.prefill_ms + t.decode_ms) / 1e3,
        "gen_ai.latency.e2e": now - ctx.t0,
    }
    reason = stream.finish_reason
    error = f"request ended with {reason}" if reason in ("abort", "error") else None
    return make_span(ctx.trace, "llm_request", wall_ns - int((now - ctx.t0) * 1e9), wall_ns, attrs, error)


def _usage(req: ChatRequest, stream: Any) -> dict[str, Any]:
    u = stream.usage
    mod = anth if req.api == "anthropic" else oai
    return mod.usage_obj(u.prompt_tokens or len(stream.prompt_token_ids), u.completion_tokens, u.cached_tokens)


def _abort_error(last: Any) -> HttpError:
    if last is not None and last.error:
        return HttpError(500, "api_error", last.error)
    return overloaded("the request was aborted because the server is shutting down; retry on another replica")


async def _complete(app: ServerApp, ctx: Ctx, req: ChatRequest, stream: Any, send: Any, flight: Flight) -> None:
    parts: list[str] = []
    last = None
    async for out in stream:
        if out.text:
            parts.append(out.text)
        last = out
        if out.finished:
            break         # the last delta: no further __anext__ (and its StopAsyncIteration)
    reason = stream.finish_reason
    if reason == "content_filter":
        raise content_policy(last.error if last is not None and last.error else "output blocked by the content policy")
    if reason == "abort":
        if flight.gone:
            raise ClientGone()
        raise _abort_error(last)
    text = "".join(parts)
    stop_seq = last.stop_sequence if last is not None else None
    if req.api == "anthropic":
        body = anth.message_body("msg_" + ctx.rid, req.model, text, reason, stop_seq, _usage(req, stream))
    else:
        body = oai.completion_body("chatcmpl-" + ctx.rid, req.model, text, reason, _usage(req, stream))
    principal = ctx.principal
    extra = (app.admission.ratelimit_headers(principal, time.monotonic())
             if principal is not None and principal.tier is not None else None)
    await app.send_json(ctx, send, 200, dumps(body), extra, timing=_timing(ctx, stream))


async def _stream(app: ServerApp, ctx: Ctx, req: ChatRequest, stream: Any, send: Any, flight: Flight,
                  filt: Any) -> None:
    is_anth = req.api == "anthropic"
    headers = app.base_headers(ctx, None) + SSE_HEADERS
    if ctx.principal is not None:
        headers += app.admission.ratelimit_headers(ctx.principal, time.monotonic())
    ctx.started = True
    ctx.status = 200
    cycle = ctx.cycle     # our protocol's: the head, each event and the tail written at once
    if cycle is None or not cycle.start_chunked(200, headers):
        await send({"type": "http.response.start", "status": 200, "headers": headers})
    chunk = cycle.write_chunk if cycle is not None else None
    writer = None
    head = b""
    if is_anth:
        encode = anth.text_delta
    else:
        writer = oai.ChunkWriter("chatcmpl-" + ctx.rid, req.model)
        role = writer.role()
        if chunk is None or not chunk(role):
            await send({"type": "http.response.body", "body": role, "more_body": True})
        encode = writer.content
    group = TokenGrouper(app.cfg.stream_interval)
    hold = Holdback(filt) if filt is not None else None
    last = None
    # events whose deltas were already queued together go out together: one write, not one per token
    # (a loop that fell behind, or steps run back to back, hand over several deltas at once)
    pending: list[bytes] = []
    quiet = app.keepalive.open(stream, flight)     # a stream silent this long gets a KEEPALIVE
    try:
        async for out in stream:
            if out is KEEPALIVE:    # queued, waiting, preempted or prefilling: tell the client it is held
                if not flight.gone:
                    ping = anth.PING if is_anth else KEEPALIVE_COMMENT
                    if pending:
                        ping = b"".join(pending) + ping
                        pending.clear()
                    if chunk is None or not chunk(ping):
                        await send({"type": "http.response.body", "body": ping, "more_body": True})
                continue
            last = out
            if is_anth and not head:
                # After scheduling: the prefix-cache hit is known, so message_start's usage is true.
                head = anth.stream_head("msg_" + ctx.rid, req.model, len(stream.prompt_token_ids),
                                        stream.usage.cached_tokens)
                if not flight.gone:
                    quiet.sent = True
                    if chunk is None or not chunk(head):
                        await send({"type": "http.response.body", "body": head, "more_body": True})
            if out.finished:
                break
            text = out.text if hold is None else hold.feed(out.text)
            text = group.add(text, len(out.token_ids))
            if text is not None and not flight.gone:
                quiet.sent = True
                body = encode(text)
                if stream.ready:      # the next delta is queued already: written with it
                    pending.append(body)
                    continue
                if pending:
                    pending.append(body)
                    body = b"".join(pending)
                    pending.clear()
                if chunk is None or not chunk(body):
                    await send({"type": "http.response.body", "body": body, "more_body": True})
    finally:
        app.keepalive.close(quiet)   # at once: a finished stream's objects die with it
    if flight.gone:
        return
    tail = b"".join(pending)        # events still held for the next delta lead the tail
    if is_anth and not head:
        tail += anth.stream_head("msg_" + ctx.rid, req.model, len(stream.prompt_token_ids),
                                 stream.usage.cached_tokens)
    tail += _stream_end(app, ctx, req, stream, last, hold, group, encode, writer)
    if cycle is None or not cycle.end_chunked(tail):
        await send({"type": "http.response.body", "body": tail, "more_body": False})


def _stream_end(app: ServerApp, ctx: Ctx, req: ChatRequest, stream: Any, last: Any, hold: Any, group: Any,
                encode: Any, writer: Any) -> bytes:
    """A stream's last events: the text still grouped or held back, then the API's error event
    (content_filter, abort) or its tail (stop reason, usage, the timing comment)."""
    is_anth = req.api == "anthropic"
    tail = b""
    reason = stream.finish_reason
    if reason == "stop" and hold is not None:
        # a stop string ended it: only text the filter cleared leaves (engine.py caps the output)
        rest_text = hold.feed(last.text if last is not None else "")
        if rest_text:
            group.parts.append(rest_text)
    elif reason not in ("content_filter", "abort"):
        rest_text = (hold.release() if hold is not None else "") + (last.text if last is not None else "")
        if rest_text:
            group.parts.append(rest_text)
    rest = group.flush()
    if rest is not None:
        tail += encode(rest)
    if reason in ("content_filter", "abort"):
        if reason == "content_filter":
            err = content_policy(last.error if last is not None and last.error else "output blocked by the content policy")
        else:
            err = _abort_error(last)
        app.metrics.observe_error(err.error_type)
        ctx.error_type = err.error_type
        payload = error_payload(err, req.api, "req_" + ctx.rid)
        return tail + (anth.stream_error(payload) if is_anth else writer.error(payload))
    timing = _timing_event(ctx, stream, _timing(ctx, stream))
    usage = _usage(req, stream)
    if is_anth:
        return tail + anth.stream_tail(reason, last.stop_sequence if last is not None else None, usage, timing)
    return tail + writer.tail(reason, usage if req.include_usage else None, timing)
