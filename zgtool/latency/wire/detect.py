"""Which API a bare URL speaks and which model it serves, found by asking it: `GET /v1/models`, then one
1-token request to `/v1/messages` and to `/v1/chat/completions`. Used when --api / --model are not given.

An API is "detected" only from a 2xx answer. A server that answers none of the routes with 2xx, nor
with a status an LLM API gives a request it refuses (400, 401, 403, 422, 429), is not an LLM API: one
line naming each route's status, exit 5. A server that accepts and never answers stops the run at the
first timeout, naming the step, exit 3."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from zgtool.errors import MeasurementUnreliable, TargetUnreachable
from zgtool.targets import Target

PROBE_PROMPT = "Hi"
# an LLM API's answer to a request it refuses (bad body, missing key, rate limit): the route exists
REFUSED_BY_AN_API = frozenset({400, 401, 403, 422, 429})


class NotAnLlmApi(MeasurementUnreliable):
    """The target answers HTTP, but no OpenAI or Anthropic route (exit 5: nothing can be measured)."""


def _timed_out(target: Target, step: str, timeout_s: float) -> TargetUnreachable:
    return TargetUnreachable(f"{target.url}: no answer to {step} within {timeout_s:g} s (detecting the API): the "
                             "server accepts connections but does not answer; stopped here (--timeout-s sets the "
                             "wait; --api and --model skip detection)")


@dataclass(frozen=True)
class Detection:
    api: str
    model: str
    how: str                 # one line: what was asked and what answered

    def public(self) -> dict[str, str]:
        return {"api": self.api, "model": self.model, "how": self.how}


def _base(target: Target) -> str:
    """The URL up to (not including) /v1, so a base URL that already ends in /v1 works too."""
    parts = urlsplit(target.url)
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def _models(doc: Any) -> list[str]:
    """Model ids of an OpenAI (`data[].id`) or Anthropic (`data[].id`) or Ollama (`models[].name`) listing."""
    if not isinstance(doc, dict):
        return []
    items = doc.get("data") if isinstance(doc.get("data"), list) else doc.get("models")
    out = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict):
            name = item.get("id") or item.get("name")
            if isinstance(name, str) and name:
                out.append(name)
    return out


def _probe(client: httpx.Client, url: str, api: str, target: Target, model: str, timeout_s: float
           ) -> httpx.Response | None:
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": PROBE_PROMPT}]}
    headers = replace(target, api=api).auth_headers()
    try:
        return client.post(url, content=json.dumps(body), headers={"content-type": "application/json", **headers})
    except httpx.TimeoutException as exc:
        raise _timed_out(target, f"POST {urlsplit(url).path}", timeout_s) from exc
    except httpx.HTTPError:
        return None


def _get_models(client: httpx.Client, base: str, target: Target, timeout_s: float
                ) -> tuple[httpx.Response | None, list[str]]:
    try:
        r = client.get(base + "/v1/models", headers=target.auth_headers())
    except httpx.TimeoutException as exc:
        raise _timed_out(target, "GET /v1/models", timeout_s) from exc
    except httpx.HTTPError:
        return None, []
    try:
        return r, _models(r.json()) if r.status_code == 200 else []
    except ValueError:
        return r, []


def _check_llm(target: Target, models: httpx.Response | None, msg: httpx.Response | None,
               chat: httpx.Response | None) -> bool:
    """True when a route answered 2xx; False when one refused the probe as an API does (a key, a body);
    NotAnLlmApi when nothing there is an LLM API."""
    answers = [r for r in (models, msg, chat) if r is not None]
    if any(r.is_success for r in answers):
        return True
    if any(r.status_code in REFUSED_BY_AN_API for r in answers):
        return False
    said = ", ".join(f"{what} {_status(r)}" for what, r in (("GET /v1/models", models), ("POST /v1/messages", msg),
                                                           ("POST /v1/chat/completions", chat)))
    raise NotAnLlmApi(f"{target.url} is not an OpenAI or Anthropic API: {said}")


def _status(r: httpx.Response | None) -> str:
    return "no answer" if r is None else str(r.status_code)


def _reports_timing(r: httpx.Response) -> bool:
    """Whether an answer carries the engine's own timing that some adapter reads."""
    from zgtool.latency.attribution.adapters import Evidence, read_engine
    from zgtool.latency.attribution.servertiming import timing_from_headers

    ev = Evidence.from_headers(r.headers.raw)
    ev.server_timing = timing_from_headers(r.headers.raw)
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        ev.note_doc(doc)
    return read_engine(ev, None)[0] is not None


def _choose(msg: httpx.Response | None, chat: httpx.Response | None, default: str) -> str:
    ok_msg = msg is not None and msg.is_success
    ok_chat = chat is not None and chat.is_success
    if ok_msg and ok_chat:
        # both work (zgtool's engine, vLLM with its Messages route): the one where the engine reports its
        # own timing, Anthropic when both or neither do (zgtool's default)
        assert msg is not None and chat is not None
        return "openai" if _reports_timing(chat) and not _reports_timing(msg) else "anthropic"
    if ok_msg:
        return "anthropic"
    if ok_chat:
        return "openai"
    # neither answered well: a route that exists (400, 401, 422...) beats one that does not (404, 405)
    missing = {api for api, r in (("anthropic", msg), ("openai", chat)) if r is None or r.status_code in (404, 405)}
    if len(missing) == 1:
        return "openai" if "anthropic" in missing else "anthropic"
    return default


def detect(target: Target, *, api_known: bool, model_known: bool, timeout_s: float = 10.0,
           verify: bool | str = True) -> tuple[Target, Detection | None]:
    """The target with its API and model filled in by asking the server; unchanged when both were given
    or nothing answered clearly (the measurement then reports the server's own error)."""
    if api_known and model_known:
        return target, None
    base = _base(target)
    notes: list[str] = []
    model = target.model
    r: httpx.Response | None = None
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False) as client:
        if not model_known:
            r, ids = _get_models(client, base, target, timeout_s)
            if ids:
                model = ids[0]
                more = f" (first of {len(ids)}: {', '.join(ids[:4])}{'...' if len(ids) > 4 else ''})" \
                    if len(ids) > 1 else ""
                notes.append(f"GET /v1/models lists {model!r}{more}")
            else:
                notes.append(f"GET /v1/models -> {_status(r)}, model left {model!r}")
        api = target.api
        if not api_known:
            msg = _probe(client, base + "/v1/messages", "anthropic", target, model, timeout_s)
            chat = _probe(client, base + "/v1/chat/completions", "openai", target, model, timeout_s)
            if msg is None and chat is None and r is None:
                return target, None    # nothing answered: the measurement reports the target unreachable
            if model_known and not (msg is not None and msg.is_success) and not (chat is not None and chat.is_success):
                r, _ = _get_models(client, base, target, timeout_s)    # evidence for the verdict below
            api = _choose(msg, chat, target.api)
            notes.append(f"POST /v1/messages -> {_status(msg)}, /v1/chat/completions -> {_status(chat)}")
            if not _check_llm(target, r, msg, chat):
                # a route refused the probe (a key, a body): measure and let the server's own error speak,
                # but claim no detection
                return replace(target, api=api, model=model), None
        elif not (r is not None and r.is_success):
            return replace(target, model=model), None    # nothing answered 2xx: nothing detected
    found = Detection(api, model, "; ".join(notes))
    return replace(target, api=api, model=model), found
