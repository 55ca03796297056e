"""Request bodies for a workload's specs, encoded once before anything is timed."""

from __future__ import annotations

import json
from typing import Any

from zgtool.workload.model import RequestSpec, Workload


def chat_body(api: str, model: str, spec: RequestSpec, stream: bool) -> dict[str, Any]:
    """The Anthropic Messages or OpenAI chat body of one spec (Anthropic takes system as a field)."""
    if api == "anthropic":
        system = "\n".join(text for role, text in spec.messages if role == "system")
        msgs = [{"role": role, "content": text} for role, text in spec.messages if role != "system"]
        body: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "messages": msgs, "stream": stream}
        if system:
            body["system"] = system
        return body
    body = {"model": model, "max_tokens": spec.max_tokens,
            "messages": [{"role": role, "content": text} for role, text in spec.messages], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def encoded_bodies(api: str, model: str, workload: Workload, stream: bool, limit: int | None = None,
                   ) -> tuple[bytes, ...]:
    """One JSON body per spec (request i of a run sends bodies[i % len]); with `limit` (the run's -n) only
    the specs a run of that many requests reaches."""
    specs = workload.specs if limit is None else workload.specs[:limit]
    return tuple(json.dumps(chat_body(api, model, s, stream)).encode() for s in specs)


def k6_payloads(api: str, model: str, workload: Workload) -> list[dict[str, Any]]:
    """What the k6 script reads as a JSON array of bodies (it sets "stream" per scenario itself)."""
    out = []
    for s in workload.specs:
        body = chat_body(api, model, s, stream=False)
        body.pop("stream", None)
        out.append(body)
    return out
