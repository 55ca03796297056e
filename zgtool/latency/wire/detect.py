"""Which API a bare URL speaks and which model it serves, found by asking it: `GET /v1/models`, then one
1-token request to `/v1/messages` and to `/v1/chat/completions`. Used when --api / --model are not given.

An API is "detected" only from a 2xx answer. A server that answers none of the routes with 2xx, nor
with a status an LLM API gives a request it refuses (400, 401, 403, 422, 429), is not an LLM API: one
line naming each route's status, exit 5. A server that accepts and never answers stops the run at the
first timeout, naming the step, exit 3."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import httpx

from zgtool.errors import MeasurementUnreliable, TargetUnreachable, UsageError
from zgtool.latency.wire.engine_id import EngineName, from_answer, from_routes
from zgtool.targets import Target

PROBE_PROMPT = "Hi"
# an LLM API's answer to a request it refuses (bad body, missing key, rate limit): the route exists
REFUSED_BY_AN_API = frozenset({400, 401, 403, 422, 429})
# a refusal of the request as given (the model unknown); no answer, 5xx, a key or a rate limit say nothing of it
REFUSES_THE_MODEL = frozenset({400, 404, 422})
MAX_MODEL_TRIES = 8          # listed models tried, one 1-token request each, before giving up
ENGINE_ROUTES_TIMEOUT_S = 2.0


class NotAnLlmApi(MeasurementUnreliable):
    """The target answers HTTP, but no OpenAI or Anthropic route (exit 5: nothing can be measured)."""


class NoModelServed(UsageError):
    """The target lists models but a 1-token request with none of those tried succeeds (exit 2)."""


def _none_served(target: Target, ids: list[str], tried: _Tried) -> NoModelServed:
    wild = [i for i in ids if "*" in i or not i.strip()]
    return NoModelServed(f"{target.url}: no listed model answers a 1-token request (tried {', '.join(tried.skipped)}"
                         f"{'; skipped wildcards ' + ', '.join(map(repr, wild)) if wild else ''}; it lists "
                         f"{len(ids)}); pass --model NAME (one the engine behind serves)")


def _timed_out(target: Target, step: str, timeout_s: float) -> TargetUnreachable:
    return TargetUnreachable(f"{target.url}: no answer to {step} within {timeout_s:g} s (detecting the API): the "
                             "server accepts connections but does not answer; stopped here (--timeout-s sets the "
                             "wait; --api and --model skip detection)")


@dataclass(frozen=True)
class Detection:
    api: str
    model: str
    how: str                 # one line: what was asked and what answered
    served: bool = False     # a 1-token request with this model succeeded
    listed: tuple[str, ...] = ()          # what GET /v1/models lists
    engine: EngineName | None = None      # the engine behind, named from its own evidence
    answers: tuple[tuple[str, bool], ...] = ()   # each API whose 1-token request succeeded: (api, engine timing shown)

    def public(self) -> dict[str, str]:
        out = {"api": self.api, "model": self.model, "how": self.how}
        if self.engine is not None:
            out |= {"engine": self.engine.label(), "engine_evidence": self.engine.evidence}
        return out


def usable_models(ids: list[str]) -> list[str]:
    """The listed ids worth a 1-token request: no wildcard (LiteLLM lists "*" and "openai/*"), no blank
    id, each once, in the listing's order."""
    return list(dict.fromkeys(i for i in ids if i.strip() and "*" not in i))


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
    if any(r.status_code in REFUSED_BY_AN_API or _api_error_body(r) for r in answers):
        return False
    said = ", ".join(f"{what} {_status(r)}" for what, r in (("GET /v1/models", models), ("POST /v1/messages", msg),
                                                           ("POST /v1/chat/completions", chat)))
    raise NotAnLlmApi(f"{target.url} is not an OpenAI or Anthropic API: {said}")


def _api_error_body(r: httpx.Response) -> bool:
    """An error in the OpenAI or Anthropic shape ({"error": {"type"|"message": ...}}): an LLM API that is
    overloaded (529) or failing, not a web server without the route."""
    try:
        doc = r.json()
    except ValueError:
        return False
    err = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(err, dict) and bool(err.get("type") or err.get("message"))


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


@dataclass
class _Tried:
    """The models tried, one 1-token request each: the one served (or the first tried) and its answers."""
    model: str
    msg: httpx.Response | None = None
    chat: httpx.Response | None = None
    skipped: list[str] = field(default_factory=list)
    codes: list[int | None] = field(default_factory=list)    # every answer's status (None: no answer)

    @property
    def served(self) -> bool:
        return any(r is not None and r.is_success for r in (self.msg, self.chat))

    def models_refused(self) -> bool:
        """Every model tried was refused as a request (400, 404, 422; LiteLLM's 429 for a broken deployment
        beside them): the models are wrong, not the server down, failing or wanting a key."""
        return bool(self.codes) and all(c in REFUSES_THE_MODEL or c == 429 for c in self.codes) \
            and any(c in REFUSES_THE_MODEL for c in self.codes)


# the served names an engine gives in its refusal of an unknown model, also when a gateway wraps the message:
# vLLM ("The model `x` does not exist. Valid aliases: a, b.") and zgtool's engine ("... served models: a, b")
_NAMED_MODELS = (re.compile(r"Valid aliases: ([^\n]+?)\.(?:\s|$)"), re.compile(r"served models: ([^\n]+)"))
MAX_NAMED_TRIES = 4          # names an engine gave in a refusal, tried at once (beyond MAX_MODEL_TRIES)


def named_models(r: httpx.Response | None) -> list[str]:
    """The models an engine names as the ones it serves in its refusal of a request (404/400), else []."""
    if r is None or r.status_code not in REFUSES_THE_MODEL:
        return []
    try:
        doc = r.json()
    except ValueError:
        return []
    err = doc.get("error") if isinstance(doc, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    if not isinstance(msg, str):
        return []
    for pattern in _NAMED_MODELS:
        if (m := pattern.search(msg)) is not None:
            return [n for n in (x.strip() for x in m.group(1).split(",")) if n and "*" not in n]
    return []


def _try_models(client: httpx.Client, base: str, target: Target, models: list[str], api: str | None,
                timeout_s: float, *, follow_named: bool = False) -> _Tried:
    """The first of `models` a 1-token request succeeds with (on `api`'s route, both when None); when none
    does, the first, with its answers (the verdict on the target is read from them). A refusal that names
    the models the engine serves (vLLM's "Valid aliases", zgtool's "served models") puts those next when
    `follow_named` (the model was not given): a gateway's listing (LiteLLM's wildcard) may name none of them."""
    first: _Tried | None = None
    skipped: list[str] = []
    codes: list[int | None] = []
    queue = list(models)
    named_budget = MAX_NAMED_TRIES if follow_named else 0
    seen: set[str] = set()
    while queue:
        model = queue.pop(0)
        seen.add(model)
        msg = _probe(client, base + "/v1/messages", "anthropic", target, model, timeout_s) \
            if api in (None, "anthropic") else None
        chat = _probe(client, base + "/v1/chat/completions", "openai", target, model, timeout_s) \
            if api in (None, "openai") else None
        tried = _Tried(model, msg, chat)
        if tried.served:
            tried.skipped = skipped
            return tried
        codes += [None if r is None else r.status_code for r, asked in ((msg, api in (None, "anthropic")),
                                                                        (chat, api in (None, "openai"))) if asked]
        first = first or tried
        said = "/".join(_status(r) for r in (msg, chat) if r is not None or api is None)
        named = [n for n in dict.fromkeys(named_models(chat) + named_models(msg))
                 if n not in seen and n not in queue][:named_budget]
        if named:
            named_budget -= len(named)
            queue[:0] = named
            said += f", named {', '.join(map(repr, named))}"
        skipped.append(f"{model!r} ({said})")
        if all(r is None for r in (msg, chat)):
            break            # nothing answers: trying more models asks the void again
    assert first is not None, "models is never empty"
    first.skipped, first.codes = skipped, codes
    return first


def _listing_note(ids: list[str], r: httpx.Response | None, model: str) -> str:
    if not ids:
        return f"GET /v1/models -> {_status(r)}, model left {model!r}"
    more = f" ({len(ids)}: {', '.join(ids[:4])}{'...' if len(ids) > 4 else ''})" if len(ids) > 1 else ""
    return f"GET /v1/models lists {ids[0]!r}{more}"


def _engine_first(client: httpx.Client, base: str, target: Target, ids: list[str], candidates: list[str],
                  notes: list[str], verify: bool | str, timeout_s: float) -> list[str]:
    """The candidates with the models the engine behind a gateway serves put first, where the gateway publishes
    that engine (LiteLLM's GET /model/info, zgtool.workload.upstream): LiteLLM's wildcard lists some 220 OpenAI
    ids that any engine behind it answers to (llama-server ignores the name), so the first of them is no
    measurement of the engine's own model."""
    from zgtool.workload.upstream import engine_models

    found = engine_models(client, base, target.auth_headers(), verify=verify, timeout_s=timeout_s)
    if found is None:
        return candidates
    served, wild, via = found
    first = [m for m in usable_models(served) if wild or m in ids][:MAX_NAMED_TRIES]
    if not first:
        return candidates
    notes.append(f"{via} serves {', '.join(map(repr, first))}")
    return first + [c for c in candidates if c not in first][:MAX_MODEL_TRIES]


def _engine(tried: _Tried, base: str, target: Target, verify: bool | str) -> EngineName | None:
    for r in (tried.chat, tried.msg):
        if r is not None and r.is_success and (named := from_answer(r)) is not None:
            return named
    return from_routes(base, timeout_s=ENGINE_ROUTES_TIMEOUT_S, verify=verify, headers=target.auth_headers())


def detect(target: Target, *, api_known: bool, model_known: bool, timeout_s: float = 10.0,
           verify: bool | str = True) -> tuple[Target, Detection | None]:
    """The target with its API and model filled in by asking the server; unchanged when both were given
    or nothing answered clearly (the measurement then reports the server's own error). A listed model is
    chosen only when a 1-token request with it succeeds (wildcards skipped, the next tried)."""
    if api_known and model_known:
        return target, None
    base = _base(target)
    notes: list[str] = []
    r: httpx.Response | None = None
    ids: list[str] = []
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False) as client:
        candidates = [target.model]
        if not model_known:
            r, ids = _get_models(client, base, target, timeout_s)
            candidates = usable_models(ids)[:MAX_MODEL_TRIES] or [target.model]
            notes.append(_listing_note(ids, r, target.model))
            if len(ids) > 1 or any("*" in i for i in ids):     # a gateway's listing: the engine's own names first
                candidates = _engine_first(client, base, target, ids, candidates, notes, verify, timeout_s)
        tried = _try_models(client, base, target, candidates, None if not api_known else target.api, timeout_s,
                            follow_named=not model_known)
        model, msg, chat = tried.model, tried.msg, tried.chat
        if tried.skipped and tried.served:
            notes.append(f"skipped {', '.join(tried.skipped)}: a 1-token request failed")
        api = target.api
        answers: tuple[tuple[str, bool], ...] = ()
        if not api_known:
            if msg is None and chat is None and r is None:
                return target, None    # nothing answered: the measurement reports the target unreachable
            if model_known and not tried.served:
                r, _ = _get_models(client, base, target, timeout_s)    # evidence for the verdict below
            api = _choose(msg, chat, target.api)
            answers = tuple((name, _reports_timing(r)) for name, r in (("anthropic", msg), ("openai", chat))
                            if r is not None and r.is_success)
            notes.append(f"{model!r}: POST /v1/messages -> {_status(msg)}, /v1/chat/completions -> {_status(chat)}")
            if not _check_llm(target, r, msg, chat):
                # a route refused the probe (a key, a body): measure and let the server's own error speak,
                # but claim no detection
                return replace(target, api=api, model=model), None
            if not model_known and ids and tried.models_refused():
                raise _none_served(target, ids, tried)
        elif not tried.served and not (r is not None and r.is_success):
            return replace(target, model=model), None    # nothing answered 2xx: nothing detected
        elif ids and tried.models_refused():
            raise _none_served(target, ids, tried)
        else:
            notes.append(f"{model!r}: POST /v1/{'messages' if api == 'anthropic' else 'chat/completions'} -> "
                         f"{_status(msg if api == 'anthropic' else chat)}")
    found = Detection(api, model, "; ".join(notes), tried.served, tuple(ids), _engine(tried, base, target, verify),
                      answers if not api_known else ())
    return replace(target, api=api, model=model), found


def listed_model(target: Target, *, timeout_s: float = 10.0, verify: bool | str = True) -> tuple[str, str] | None:
    """The model a bare URL lists (GET /v1/models; through a gateway that publishes its engine, the engine's
    own first), and how it was found, without sending a request that could change what the server does next
    (`client ask`, whose retries and fall-backs are what it shows); None when it lists nothing usable or
    already lists the target's model."""
    base = _base(target)
    notes: list[str] = []
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False) as client:
        try:
            r, ids = _get_models(client, base, target, timeout_s)
        except TargetUnreachable:
            return None
        usable = usable_models(ids)
        if not usable or target.model in usable:
            return None
        if len(ids) > 1 or any("*" in i for i in ids):
            usable = _engine_first(client, base, target, ids, usable, notes, verify, timeout_s)
    return usable[0], "; ".join([_listing_note(ids, r, target.model), *notes])


def check_serves(target: Target, model: str, *, timeout_s: float = 10.0, verify: bool | str = True
                 ) -> tuple[bool, str, list[str]]:
    """Whether `target` answers a 1-token request for `model` (on its API), what it answered, and what its
    GET /v1/models lists. Only a refusal of the request (400, 404, 422) is a no: a target that does not
    answer, fails (5xx) or wants a key is measured and its own errors speak."""
    base = _base(target)
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False) as client:
        tried = _try_models(client, base, target, [model], target.api, timeout_s)
        r = tried.msg if target.api == "anthropic" else tried.chat
        if tried.served or r is None or r.status_code not in REFUSES_THE_MODEL:
            return True, "", []
        said = _status(r)
        if r is not None:
            said += f" {_error_words(r)}".rstrip()
        _, ids = _get_models(client, base, target, timeout_s)
    return False, said, ids


def _error_words(r: httpx.Response) -> str:
    """The server's own error message of a refused request, shortened ('' when it has none)."""
    try:
        doc = r.json()
    except ValueError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    msg = err.get("message") if isinstance(err, dict) else (doc.get("detail") if isinstance(doc, dict) else None)
    return f"{str(msg)[:160]!r}" if msg else ""
