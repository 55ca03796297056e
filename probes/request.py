"""The one minimal, real API request each probe sends (Anthropic or OpenAI shape, per target)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from zgtool import __version__
from zgtool.errors import UsageError
from zgtool.probes.http1 import Http1Connection
from zgtool.targets import Target

USER_AGENT = f"zgtool-probe/{__version__}"
PROMPT = "Say hello."


@dataclass(frozen=True)
class ProbeRequest:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes | None


def api_path(target: Target, endpoint: str) -> str:
    """Join the target URL's path with /v1/<endpoint>, not doubling a /v1 already there."""
    prefix = urlsplit(target.url).path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    return f"{prefix}/v1/{endpoint}"


def build(target: Target, *, stream: bool = False, max_tokens: int = 16,
          method: str | None = None, path: str | None = None) -> ProbeRequest:
    """The API request for `target`, or a bare `method path` when either is given."""
    # gzip like every SDK: a compressing proxy buffers streams only for clients that accept it
    headers = [("User-Agent", USER_AGENT), ("Accept", "text/event-stream" if stream else "application/json"),
               ("Accept-Encoding", "gzip, deflate")]
    headers += list(target.auth_headers().items())
    if method or path:
        m = (method or "GET").upper()
        if not m.isalpha():
            raise UsageError(f"--method must be an HTTP method name, not {method!r}")
        p = path or "/"
        if not p.startswith("/"):
            raise UsageError(f"--path must start with '/', not {p!r}")
        return ProbeRequest(m, p, headers, None)
    messages = [{"role": "user", "content": PROMPT}]
    payload = {"model": target.model, "max_tokens": max_tokens, "messages": messages, "stream": stream}
    p = api_path(target, "chat/completions" if target.api == "openai" else "messages")
    headers.append(("Content-Type", "application/json"))
    return ProbeRequest("POST", p, headers, json.dumps(payload).encode())


def connection_for(target: Target, *, timeout_s: float, insecure: bool,
                   alpn: tuple[str, ...] = ("http/1.1",)) -> Http1Connection:
    return Http1Connection(host=target.host, port=target.port, tls=target.scheme == "https",
                           timeout_s=timeout_s, verify_tls=not insecure, alpn=alpn)


def redacted_headers(req: ProbeRequest, target: Target) -> list[tuple[str, str]]:
    """Request headers as they may be written to a result: the key's value never is, nor the value of a
    header the user gave (zgtool.toml's headers, -H): it may be a key under a gateway's own name."""
    secret_names = {"x-api-key", "authorization", "api-key", *(k.lower() for k in target.headers)}
    key = target.api_key()
    out = []
    for k, v in req.headers:
        if k.lower() in secret_names or (key and key in v):
            v = "<redacted>"
        out.append((k, v))
    return out
