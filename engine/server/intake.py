"""Request bytes -> ChatRequest -> prompt ids, with the event loop's share of the work bounded.

A request's cost is measured by what it makes the server do, not by its characters of text:
200,000 empty messages are 7 MB of JSON, 200,000 validations and a 200,000-turn template with
0 characters of content (issue 22: that request froze the loop for 17 s). So:

- message counts are capped (``MAX_MESSAGES``) before any per-message work: 400 beyond;
- a body over ``OFFLOAD_BODY_BYTES`` is decoded and validated in a worker thread;
- a prompt that cannot fit the context (``check_fits``: its characters over the most characters
  one token holds) is refused before it is tokenized;
- a prompt whose cost (characters + ``MESSAGE_COST_CHARS`` per message) is over
  ``OFFLOAD_COST_CHARS`` is safety-checked and templated in a worker thread.

The loop awaits that work; other streams and /health keep being served meanwhile. A C JSON
decoder holds the GIL for the whole body (orjson: ~140 ms for 200,000 empty messages on a busy
2-core box), so a large body with many JSON values (``STRUCTURE_HEAVY_SEPARATORS`` commas)
is decoded by the json module's Python scanner instead: slower, but it yields the GIL every
switch interval. Its result is json.loads'; whatever it refuses goes through
zgtool.http.body.load_json for the exact 400.

Even so a thread's decode shares the server's one GIL: four 7 MB prompts held it ~20-40 ms each
(orjson plus load_json's scans), and /health waited that long (issue 37 item 4). A body over
``PROCESS_BODY_BYTES`` is therefore decoded, parsed and checked against the context in a worker
process (body_worker): the same code, its verdict sent back. A request that cannot fit comes back
as its model and its error, not its text: the caller checks the model first (``check_model``),
then raises the error, in the order of the in-process path.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zgtool.engine.api.common import ChatRequest, ParamError
from zgtool.engine.errors import ContextLengthExceeded, InvalidRequest
from zgtool.engine.server import body_worker
from zgtool.http.body import load_json_object

# Anthropic documents "a limit of 100,000 messages in a single request"; OpenAI documents none,
# so both APIs get the same cap.
MAX_MESSAGES = 100_000
OFFLOAD_BODY_BYTES = 256 * 1024
PROCESS_BODY_BYTES = 1024 * 1024     # over this, decoded in the body worker process
OFFLOAD_COST_CHARS = 32_768
MESSAGE_COST_CHARS = 64     # a message costs validation + template work even when empty
STRUCTURE_HEAVY_SEPARATORS = 20_000
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")   # what json leaves of an unpaired escape

Parse = Callable[[dict[str, Any], int], ChatRequest]
_LARGE_BODIES = ThreadPoolExecutor(1, thread_name_prefix="zg-large-body")


def message_cap(max_model_len: int) -> int:
    """Every message takes at least one token of the context (its role marker), so a request with
    more messages than the context holds can never be served."""
    return max(1, min(MAX_MESSAGES, max_model_len))


def _too_many(n: int, cap: int) -> ParamError:
    return ParamError(f"messages: at most {cap} messages per request (each takes at least one token of the "
                      f"model's context), got {n}", param="messages", code="array_above_max_length")


def check_message_count(obj: dict[str, Any], cap: int = MAX_MESSAGES) -> None:
    """400 before any per-message work when ``messages`` has more entries than the cap."""
    msgs = obj.get("messages")
    if isinstance(msgs, list) and len(msgs) > cap:
        raise _too_many(len(msgs), cap)


def precheck_message_count(body: bytes, cap: int) -> None:
    """Before decoding: every message carries a "role" key, and a JSON string cannot hold the bytes
    "role" with bare quotes, so their count bounds the messages. A body of 200,000 empty messages is
    refused in about a millisecond instead of after a decode that holds the GIL (and so every
    stream) for hundreds of ms. A key spelled with escapes is still caught after the decode."""
    n = body.count(b'"role"')
    if n > cap:
        raise _too_many(n, cap)


def _has_surrogate(obj: Any) -> bool:
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def decode_yielding(body: bytes) -> dict[str, Any]:
    """load_json_object's result, decoded by Python code that lets other threads (the event
    loop) run; bodies it cannot decode, or that carry surrogates, get load_json's verdict."""
    try:
        dec = json.JSONDecoder()
        dec.scan_once = json.scanner.py_make_scanner(dec)  # type: ignore[attr-defined]
        obj = dec.decode(body.decode("utf-8"))
    except (ValueError, RecursionError):         # malformed, bad UTF-8, huge ints, deep nesting
        return load_json_object(body)
    if not isinstance(obj, dict) or (_SURROGATE_ESCAPE.search(body) and _has_surrogate(obj)):
        return load_json_object(body)
    return obj


def decode(parse: Parse, body: bytes, max_model_len: int) -> ChatRequest:
    """The request parsed by ``parse``, here and now: what parse_body does for a body of at most
    ``OFFLOAD_BODY_BYTES`` (a caller that checked the size saves the coroutine)."""
    if len(body) > OFFLOAD_BODY_BYTES and body.count(b",") > STRUCTURE_HEAVY_SEPARATORS:
        obj = decode_yielding(body)
    else:
        obj = load_json_object(body)
    check_message_count(obj, message_cap(max_model_len))
    return parse(obj, max_model_len)


def _decode_large(parse: Parse, body: bytes, max_model_len: int) -> ChatRequest:
    precheck_message_count(body, message_cap(max_model_len))
    return decode(parse, body, max_model_len)


def large_body_verdict(body: bytes, parse: Parse, max_model_len: int,
                       max_token_chars: int | None) -> tuple[str, Any, Any]:
    """Run in the body worker: ("req", the request, None), or ("unfit", its model, the state of
    check_fits' error) for a request that cannot fit (its text never crosses back)."""
    req = _decode_large(parse, body, max_model_len)
    try:
        check_fits(req, max_token_chars, max_model_len)
    except PromptCannotFit as exc:
        return "unfit", req.model, body_worker.exc_state(exc)
    return "req", req, None


def _decode_large_anywhere(parse: Parse, body: bytes, max_model_len: int, max_token_chars: int | None,
                           check_model: Callable[[str], None] | None) -> ChatRequest:
    if len(body) <= PROCESS_BODY_BYTES:
        return _decode_large(parse, body, max_model_len)
    got = body_worker.call(large_body_verdict, (parse, max_model_len, max_token_chars), body)
    if got is None:                 # no worker (it died on this body, or cannot start): here, then
        value = large_body_verdict(body, parse, max_model_len, max_token_chars)
    else:
        ok, value = got
        if not ok:
            raise value
    tag, req_or_model, err = value
    if tag == "req":
        return req_or_model  # type: ignore[no-any-return]
    if check_model is not None:
        check_model(req_or_model)   # an unknown model's error comes before the context's
    raise body_worker.rebuild(err)


async def parse_body(parse: Parse, body: bytes, max_model_len: int, max_token_chars: int | None = None,
                     check_model: Callable[[str], None] | None = None) -> ChatRequest:
    """The request parsed by ``parse`` (an API's parser); off the loop for a large body, one at a
    time: a C decoder holds the GIL for a whole body (orjson: ~30 ms for 7 MB), so several large
    bodies decoded at once would hold it, and the event loop, for their sum. Over
    ``PROCESS_BODY_BYTES``, in the body worker process; with ``max_token_chars`` given, a request
    that cannot fit is refused there: ``check_model(model)`` first, then check_fits' error, as the
    caller would have raised them."""
    if len(body) > OFFLOAD_BODY_BYTES:
        return await asyncio.get_running_loop().run_in_executor(
            _LARGE_BODIES, _decode_large_anywhere, parse, body, max_model_len, max_token_chars, check_model)
    return decode(parse, body, max_model_len)


class PromptCannotFit(ContextLengthExceeded):
    """A prompt refused from its length in characters, before it is tokenized."""

    def __init__(self, least_tokens: int, chars: int, per_token: int, max_tokens: int, max_model_len: int) -> None:
        InvalidRequest.__init__(self, (
            f"prompt is at least {least_tokens} tokens ({chars} characters; one token of this model holds at most "
            f"{per_token}), so it cannot fit the model's context of {max_model_len} tokens"
            + (f" with max_tokens {max_tokens}" if least_tokens < max_model_len else "")))
        self.prompt_tokens = least_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


def text_chars(req: ChatRequest) -> int:
    """Characters of the prompt's text (system and every message's content)."""
    n = len(req.system or "")
    for m in req.messages:
        n += len(m["content"])
    return n


def check_fits(req: ChatRequest, max_token_chars: int | None, max_model_len: int, chars: int | None = None) -> None:
    """400 before any tokenizing for a prompt that can never fit the context: its characters over
    the most characters one token holds (the tokenizer's bound) already reach it (issue 37: a 7 MB
    prompt was tokenized in full, holding the GIL for seconds, only to be refused). ``chars``:
    text_chars(req), when the caller has it."""
    if max_token_chars is None:
        return
    if chars is None:
        chars = text_chars(req)
    if chars <= OFFLOAD_COST_CHARS:
        return       # cheap to tokenize: the exact count names the excess (engine.py)
    least = -(-chars // max_token_chars)
    need = req.max_tokens or 1
    if least >= max_model_len or least + need > max_model_len:
        raise PromptCannotFit(least, chars, max_token_chars, need, max_model_len)


def prompt_cost(req: ChatRequest, chars: int | None = None) -> int:
    """Characters of text plus a fixed cost per message (empty messages are not free)."""
    return (text_chars(req) if chars is None else chars) + MESSAGE_COST_CHARS * len(req.messages)


def is_heavy(req: ChatRequest, chars: int | None = None) -> bool:
    """Worth a worker thread (safety check, template); ``chars``: text_chars(req), when known."""
    return prompt_cost(req, chars) > OFFLOAD_COST_CHARS
