"""Hostile-but-mostly-valid requests and the victim streams they must not harm (issue 22, Proof).

A hostile case is a valid request (Anthropic /v1/messages or OpenAI /v1/chat/completions, stream or
not) with exactly ONE field pushed to its edge. It must get a success or a 4xx in its API's own error
shape: never a 5xx, a hang or a dropped connection. A victim is a greedy, seeded stream that runs
beside the hostile ones; its text must equal a quiet reference run's and it must finish.
Shared by tests/reliability/test_mostly_valid_fuzz.py and bench/isolation.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

TIMING_COMMENT = ": zgtool-timing "   # the engine's per-request timing, an SSE comment (engine/api)
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
# error.type values a client error may carry (engine/server/errors.py, zgtool/http/errors.py)
CLIENT_ERROR_TYPES = {
    "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
    "request_too_large", "rate_limit_error", "content_policy_violation", "timeout_error",
    "invalid_api_key", "insufficient_quota", "not_found", "rate_limit_exceeded",
}


@dataclass(frozen=True)
class Raw:
    """A JSON token json.dumps would not write (NaN, Infinity, 1e400, -0): sent verbatim."""

    text: str


@dataclass(frozen=True)
class Case:
    label: str          # "openai/stream/temperature=1e-300"
    api: str            # "anthropic" | "openai"
    stream: bool
    body: bytes


def dumps_raw(obj: Any) -> bytes:
    """json.dumps, with each Raw value replaced by its text."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"__zg_raw_{len(raws) - 1}__"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(obj), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"__zg_raw_{i}__"', raw, 1)
    return text.encode("utf-8", "surrogatepass")


def _short(v: Any) -> str:
    s = v.text if isinstance(v, Raw) else repr(v)
    return s if len(s) <= 40 else f"{s[:24]}...({len(s)} chars)"


# --- the edges: field -> values (a callable builds a big value lazily) --------------------------
Edge = tuple[str, Any]   # (field, value); value may be a callable () -> value


def _msgs(n: int, content: str = "", roles: tuple[str, ...] = ("user",)) -> list[dict[str, str]]:
    return [{"role": roles[i % len(roles)], "content": content} for i in range(n)]


def _edges() -> dict[str, list[Any]]:
    tiny = [1e-300, 5e-324, 1e-45, 1e-38, 1e-30, 1e-10, 9.99e-6, 1e-5]
    return {
        "temperature": [*tiny, 0, -0.0, Raw("-0"), Raw("0e0"), "NaN", Raw("NaN"), Raw("Infinity"),
                        Raw("-Infinity"), Raw("1e400"), 1e308, 2.0, 2.0000001, 1.0000000001, -1e-300,
                        "0.5", True, None, [0.5], {"v": 1}],
        "top_p": [0, 1, 1e-300, 5e-324, 1e-45, -0.0, 1.0000001, 0.5, "1", Raw("NaN"), Raw("1e400"), None],
        "top_k": [0, 1, 2, 511, 512, 513, 10**9, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -1, 1.5, "5",
                  Raw("1e2"), None],
        "max_tokens": [0, 1, 2, -1, 10**9, 2**31, 2**63 - 1, 2**64, 10**40, 1.0, "8", True, None,
                       Raw("1e1")],
        "seed": [0, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 1.5, "1", Raw("1e23"), None],
        "stop": [[], [""], ["e"], [" "], ["\n"], ["\x00"], ["\u2062"], ["é", "e\u0301"],
                 ["\U0001F600" * 64], ["x" * 256], ["x" * 257], ["x" * 4096],
                 lambda: ["a" * 1_000_000], lambda: ["y" * 1024] * 2000,
                 [str(i) for i in range(4)], [str(i) for i in range(5)], [str(i) for i in range(16)],
                 [str(i) for i in range(17)], "e", 5, [None], [["x"]], {"a": "b"}],
        "messages": [[], _msgs(1), _msgs(1, " "), lambda: _msgs(200_000), lambda: _msgs(100_000),
                     lambda: _msgs(100_001), lambda: _msgs(2000, "hi", ("user", "assistant")),
                     lambda: _msgs(1, "x" * 1_000_000), lambda: _msgs(1, "hello " * 20_000),
                     lambda: _msgs(1, "\u200b" * 200_000), lambda: _msgs(1, "\U0001F600" * 100_000),
                     _msgs(1, "hi", ("system",)), _msgs(1, "hi", ("tool",)), _msgs(1, "hi", ("developer",)),
                     _msgs(1, "hi", ("",)), _msgs(1, "hi", ("USER",)), _msgs(1, "hi", ("assistant",)),
                     _msgs(2, "hi", ("user", "assistant")), [{"role": "user"}], [{"role": "user", "content": None}],
                     [{"role": "user", "content": 5}], [{"role": "user", "content": []}],
                     [{"role": "user", "content": [{"type": "text", "text": "hi"}] * 10_000}],
                     [{"role": "user", "content": [{"type": "image", "source": {}}]}],
                     [{"role": "user", "content": "hi", "name": "x" * 10_000, "zzz": 1}],
                     ["hi"], [None], {"role": "user", "content": "hi"}, "hi"],
        "system": ["", " ", "x" * 300_000, [{"type": "text", "text": "be brief"}],
                   [{"type": "text", "text": "s"}] * 10_000, [], 5, {"a": 1}, None, [None], "\u202e" * 10_000],
        "extra": [{"zzz": 1}, {"__proto__": {"x": 1}}, {"metadata": {"user_id": "u" * 10_000}},
                  {"metadata": "x"}, {"stream_options": {"include_usage": True}}, {"stream_options": 5},
                  {"n": 1}, {"n": 2}, {"logprobs": True}, {"ignore_eos": True}, {"ignore_eos": "yes"},
                  {"user": "u" * 100_000}, {"": None}, {"thinking": {"type": "enabled", "budget_tokens": 5}},
                  {"tools": []}, {"tool_choice": "none"}, {"presence_penalty": 2}, {"logit_bias": {"1": 100}},
                  {"response_format": {"type": "text"}}, {"stream": "true"}, {"stream": 1}, {"stream": None},
                  {"model": ""}, {"model": "x" * 10_000}, {"model": "dummy:tiny\u0000"}],
        # the same key twice: a gateway that validates one copy must not forward the other
        "duplicate": [("temperature", "1e-300", 0.5), ("temperature", "0.5", 1e-300), ("max_tokens", "8", 10**9),
                      ("max_tokens", "1000000000", 8), ("stream", "false", True), ("stream", "true", False),
                      ("messages", "[]", None), ("model", '"other"', None), ("top_k", "1", 2**63)],
    }


# The crashers issue 22 names: every run includes them (on both APIs), then random edges.
PINNED: tuple[Edge, ...] = (
    ("temperature", 1e-300), ("temperature", 1e-38), ("temperature", Raw("NaN")),
    ("messages", lambda: _msgs(200_000)), ("stop", lambda: ["y" * 1024] * 2000),
    ("stop", lambda: ["a" * 1_000_000]),
)


def base_body(api: str, model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": "hello there, how are you?"}]}


def apply_edge(api: str, body: dict[str, Any], fld: str, value: Any) -> dict[str, Any]:
    value = value() if callable(value) else value
    out = dict(body)
    if fld == "extra":
        out.update(value)
    elif fld == "stop":
        out["stop_sequences" if api == "anthropic" else "stop"] = value
    elif fld == "system" and api == "openai":
        out["messages"] = [{"role": "system", "content": value}, *body["messages"]]
    elif value is None:
        out.pop(fld, None)            # a field left out (max_tokens is required by Anthropic)
    else:
        out[fld] = value
    return out


def make_case(api: str, stream: bool, model: str, fld: str, value: Any) -> Case:
    shown = "<big>" if callable(value) else _short(value)
    label = f"{api}/{'stream' if stream else 'json'}/{fld}={shown}"
    if fld == "duplicate":            # (key, first copy as raw JSON, second copy; None: the base value)
        key, first, second = value
        body = base_body(api, model, stream)
        if second is not None:
            body[key] = second
        return Case(label, api, stream, b'{"' + key.encode() + b'":' + first.encode() + b"," + dumps_raw(body)[1:])
    body = apply_edge(api, base_body(api, model, stream), fld, value)
    return Case(label, api, stream, dumps_raw(body))


def hostile_cases(seed: int, count: int, model: str) -> list[Case]:
    """`count` cases: the pinned crashers (both APIs, alternating stream), then seeded random edges."""
    rng = random.Random(seed)
    edges = _edges()
    out: list[Case] = []
    for i, (fld, value) in enumerate(PINNED):
        for api in PATHS:
            out.append(make_case(api, bool(i % 2), model, fld, value))
    fields = sorted(edges)
    while len(out) < count:
        fld = rng.choice(fields)
        out.append(make_case(rng.choice(list(PATHS)), rng.random() < 0.5, model, fld, rng.choice(edges[fld])))
    rng.shuffle(out)
    return out[:count]


# --- sending and judging ------------------------------------------------------------------------

def headers(api: str, key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json"}
    if api == "anthropic":
        h["anthropic-version"] = "2023-06-01"
        if key:
            h["x-api-key"] = key
    elif key:
        h["authorization"] = f"Bearer {key}"
    return h


@dataclass
class Outcome:
    label: str
    status: int | None = None
    text: str = ""
    finish: str | None = None
    error: dict[str, Any] | None = None     # the error object of a 4xx or of an error event
    complete: bool = False                  # a finished answer, or a stream with its terminator
    failure: str = ""                       # transport failure: "hang", "dropped: ..."
    cache: str | None = None                # a gateway's x-cache answer header (HIT: never reached the engine)
    start_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)      # client arrival of each text event
    engine_token_times_ms: list[float] = field(default_factory=list)  # the engine's own (zgtool-timing)
    engine_ttft_ms: float | None = None                               # from its arrival at the engine

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.start_s if self.token_times_s else None

    @property
    def itls_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def engine_itls_ms(self) -> list[float]:
        t = self.engine_token_times_ms
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def _error_obj(api: str, payload: Any) -> dict[str, Any] | None:
    if not isinstance(payload, dict):
        return None
    err = payload.get("error")
    if not isinstance(err, dict) or not isinstance(err.get("type"), str) or not isinstance(err.get("message"), str):
        return None
    if api == "anthropic" and payload.get("type") != "error":
        return None
    if api == "openai" and not {"param", "code"} <= set(err):
        return None
    return err


def _take_stream_event(api: str, out: Outcome, event: str, data: str) -> None:
    if api == "openai":
        if data == "[DONE]":
            out.complete = True
            return
        obj = json.loads(data)
        if "error" in obj:
            out.error = _error_obj(api, obj) or {"type": "<malformed>", "message": data[:200]}
            return
        for choice in obj.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                out.text += piece
                out.token_times_s.append(time.monotonic())
            if choice.get("finish_reason"):
                out.finish = choice["finish_reason"]
        return
    obj = json.loads(data)
    kind = obj.get("type")
    if event == "error" or kind == "error":
        out.error = _error_obj(api, obj) or {"type": "<malformed>", "message": data[:200]}
    elif kind == "content_block_delta":
        out.text += obj["delta"].get("text", "")
        out.token_times_s.append(time.monotonic())
    elif kind == "message_delta":
        out.finish = obj["delta"].get("stop_reason")
    elif kind == "message_stop":
        out.complete = True


async def send(client: httpx.AsyncClient, base_url: str, api: str, body: bytes, *, key: str | None,
               label: str = "", timeout_s: float = 120.0, first_token: asyncio.Event | None = None) -> Outcome:
    """POST one request; never raises for what the server does (transport failures are recorded)."""
    out = Outcome(label, start_s=time.monotonic())
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", base_url + PATHS[api], content=body,
                                     headers=headers(api, key)) as r:
                out.status = r.status_code
                out.cache = r.headers.get("x-cache")
                if "text/event-stream" not in r.headers.get("content-type", ""):
                    raw = await r.aread()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        payload = None
                    if r.status_code == 200 and isinstance(payload, dict):
                        _take_json_answer(api, out, payload)
                    else:
                        out.error = _error_obj(api, payload) or {"type": "<malformed>", "message": raw[:200].decode(
                            "utf-8", "replace")}
                    return out
                event, data = "", []
                async for line in r.aiter_lines():
                    if line.startswith(TIMING_COMMENT):
                        with contextlib.suppress(ValueError, TypeError):
                            timing = json.loads(line[len(TIMING_COMMENT):])
                            out.engine_token_times_ms = [float(x) for x in timing.get("token_times_ms") or []]
                            out.engine_ttft_ms = float(timing["ttft_ms"]) if "ttft_ms" in timing else None
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip(" "))
                    elif not line and data:
                        _take_stream_event(api, out, event, "\n".join(data))
                        event, data = "", []
                        if first_token is not None and out.token_times_s:
                            first_token.set()
                if data:
                    _take_stream_event(api, out, event, "\n".join(data))
    except TimeoutError:
        out.failure = f"hang (no end within {timeout_s:g} s)"
    except (httpx.HTTPError, ValueError) as exc:
        out.failure = f"dropped: {type(exc).__name__}: {exc}"[:300]
    return out


def _take_json_answer(api: str, out: Outcome, payload: dict[str, Any]) -> None:
    if api == "anthropic":
        if payload.get("type") == "message":
            out.text = "".join(b.get("text", "") for b in payload.get("content") or [])
            out.finish, out.complete = payload.get("stop_reason"), True
        return
    choices = payload.get("choices") or []
    if payload.get("object") == "chat.completion" and choices:
        out.text = choices[0]["message"].get("content") or ""
        out.finish, out.complete = choices[0].get("finish_reason"), True


def hostile_verdict(o: Outcome) -> str:
    """'' when the hostile request got a success or a 4xx in its API's shape; else what went wrong."""
    if o.failure:
        return o.failure
    assert o.status is not None
    if o.status >= 500:
        return f"{o.status} {o.error}"
    if 400 <= o.status < 500:
        if o.error is None or o.error.get("type") == "<malformed>":
            return f"{o.status} not in the API's error shape: {o.error}"
        return ""
    if o.status != 200:
        return f"unexpected status {o.status}"
    if o.error is not None and o.error.get("type") not in CLIENT_ERROR_TYPES:
        return f"200 then a server error event: {o.error}"
    if not o.complete:
        return "200 but the answer never ended (no message_stop / [DONE])"
    return ""


def lost(o: Outcome) -> bool:
    """Accepted (200) with neither a finished answer nor an error event."""
    return o.status == 200 and not o.complete and o.error is None


# --- victims --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Victim:
    name: str
    api: str
    body: bytes


def victims(count: int, model: str, max_tokens: int = 48, seed: int = 7) -> list[Victim]:
    """Greedy seeded streams, half per API, each its own prompt; OpenAI ones ignore EOS.

    Greedy as top_k 1 at temperature 1, not temperature 0: pygw caches temperature-0 answers, and a
    victim served from its cache would never meet the hostile requests in the engine."""
    out = []
    for i in range(count):
        api = ("anthropic", "openai")[i % 2]
        body: dict[str, Any] = {
            "model": model, "max_tokens": max_tokens, "stream": True, "temperature": 1.0, "top_k": 1, "seed": seed,
            "messages": [{"role": "user", "content": f"victim {i}: tell me a story about the number {i * 37}"}],
        }
        if api == "openai":
            body["ignore_eos"] = True
        out.append(Victim(f"victim{i}/{api}", api, dumps_raw(body)))
    return out


def victim_verdict(o: Outcome, ref: Outcome) -> str:
    if o.failure or o.status != 200:
        return f"{o.status} {o.failure or o.error}"
    if o.error is not None:
        return f"error event {o.error}"
    if o.cache == "HIT":
        return "served from a gateway cache: it never met the hostile requests"
    if not o.complete:
        return "did not finish"
    if (o.text, o.finish) != (ref.text, ref.finish):
        return f"output differs from the quiet run: {o.text[:60]!r}/{o.finish} != {ref.text[:60]!r}/{ref.finish}"
    return ""


async def victim_loop(client: httpx.AsyncClient, url: str, v: Victim, key: str | None, stop: asyncio.Event,
                      sink: list[Outcome], streaming: asyncio.Event | None = None, timeout_s: float = 120.0) -> None:
    """Run `v` again and again until `stop` is set (at least once), keeping every outcome;
    `streaming` is set once its first run has produced a token (or ended)."""
    while True:
        sink.append(await send(client, url, v.api, v.body, key=key, label=v.name, timeout_s=timeout_s,
                               first_token=streaming))
        if streaming is not None:
            streaming.set()
        if stop.is_set():
            return
