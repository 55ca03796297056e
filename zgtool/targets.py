"""Named targets from zgtool.toml: --config, then ./zgtool.toml, then the user config dir.

    [targets.mycluster]
    url = "https://vllm.internal:8000"
    api = "openai"              # anthropic | openai
    model = "meta-llama/Llama-3.1-8B-Instruct"
    key_env = "VLLM_API_KEY"    # the environment variable holding the key (never stored)
    headers = { "X-Team" = "infra" }

A TARGET argument is a name or a URL. Keys are read from the environment at use
time and never printed or written to results (`Target.public()` omits them).

On the command line, `-H 'Name: value'` (curl's spelling, repeatable) adds a header to every
target of the command, a bare URL's included: the way to send a gateway's key
(`-H "Authorization: Bearer $LITELLM_KEY"`) without a config file. A header named on the command
line replaces the target's own of the same name (names compare without case), a key_env's key
included. Header values count as secrets: only their names reach a result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from zgtool.errors import UsageError
from zgtool.http.toml import load_toml

APIS = ("anthropic", "openai")


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    api: str = "anthropic"
    model: str = "default"
    key_env: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_url(self.url)
        if self.api not in APIS:
            raise UsageError(f"target {self.name!r}: api must be one of {', '.join(APIS)}, not {self.api!r}")

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    @property
    def api_root_url(self) -> str:
        """The URL a client appends /v1/messages or /v1/chat/completions to: the target's without a trailing /v1,
        so that http://host:8000/v1 (the form engines and the README give) and http://host:8000 ask the same."""
        url = self.base_url
        return url[:-3] if url.endswith("/v1") else url

    def api_key(self) -> str | None:
        return os.environ.get(self.key_env) if self.key_env else None

    def auth_headers(self) -> dict[str, str]:
        """Headers for one API request: the configured (and -H) headers, the key_env's key unless a
        header already carries a key (x-api-key or Authorization, any case), anthropic-version unless set."""
        h = dict(self.headers)
        given = {k.lower() for k in h}
        key = self.api_key()
        if key and not given & {"x-api-key", "authorization"}:
            if self.api == "anthropic":
                h["x-api-key"] = key
            else:
                h["authorization"] = f"Bearer {key}"
        if self.api == "anthropic" and "anthropic-version" not in given:
            h["anthropic-version"] = "2023-06-01"
        return h

    def with_headers(self, extra: Mapping[str, str]) -> Target:
        """This target with EXTRA's headers on top: each replaces the target's own of the same name, any case."""
        if not extra:
            return self
        names = {k.lower() for k in extra}
        kept = {k: v for k, v in self.headers.items() if k.lower() not in names}
        return replace(self, headers={**kept, **extra})

    def public(self) -> dict[str, Any]:
        """What may be printed or written to a result: no key, only its env var name."""
        return {"name": self.name, "url": self.url, "api": self.api, "model": self.model,
                "key_env": self.key_env, "header_names": sorted(self.headers)}




# what a command says when a server refused its requests with 401 (latency-split, bench, client ask)
KEY_HINT = ("send the key with -H 'Authorization: Bearer KEY' (or -H 'x-api-key: KEY' on the Anthropic API), "
            "or name the target in zgtool.toml with key_env")

# RFC 9110 token characters: what a field name may hold
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# set by zgtool's own request builders: a -H of these would give a request two of them or a wrong length
_BUILT_BY_THE_CLIENT = frozenset({"content-length", "transfer-encoding", "host", "connection", "content-type"})


def parse_headers(specs: Sequence[str], option: str = "-H/--header") -> dict[str, str]:
    """-H 'Name: value' (repeatable) -> {name: value}; a later one of the same name (any case) wins.
    A clear UsageError for no colon, a name that is not an HTTP token, a value with CR/LF, or a header the
    client builds itself. The message never repeats the value (it may be a key)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition(":")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"{option}: expected 'Name: value' (e.g. 'Authorization: Bearer $KEY'), "
                             f"got a value without a header name before ':'")
        if not set(name) <= _TCHAR:
            raise UsageError(f"{option} {name!r}: not a valid header name (letters, digits and !#$%&'*+-.^_`|~)")
        if "\r" in value or "\n" in value or "\0" in value:
            raise UsageError(f"{option} {name}: the value holds a line break or NUL")
        if name.lower() in _BUILT_BY_THE_CLIENT:
            raise UsageError(f"{option} {name}: zgtool sets this header itself on every request")
        for k in [k for k in out if k.lower() == name.lower()]:
            del out[k]
        out[name] = value.strip()
    return out


def validate_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError as exc:
        raise UsageError(f"malformed URL {url!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"malformed URL {url!r}: expected http(s)://host[:port][/path]")


BUILTIN: dict[str, Target] = {
    "api": Target("api", "https://api.anthropic.com", "anthropic", "claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
    "local": Target("local", "http://127.0.0.1:8000", "anthropic", "default", None),
}


def config_paths(explicit: Path | None = None) -> list[Path]:
    if explicit is not None:
        return [explicit]
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path("zgtool.toml"), Path(xdg) / "zgtool" / "zgtool.toml"]


def load_targets(config: Path | None = None) -> dict[str, Target]:
    targets = dict(BUILTIN)
    for path in config_paths(config):
        if not path.exists():
            if config is not None:
                raise UsageError(f"config file not found: {path}")
            continue
        doc = load_toml(path, "config file")
        for name, spec in (doc.get("targets") or {}).items():
            if not isinstance(spec, dict) or "url" not in spec:
                raise UsageError(f"{path}: [targets.{name}] needs a url")
            targets[name] = Target(
                name=name,
                url=str(spec["url"]),
                api=str(spec.get("api", "anthropic")),
                model=str(spec.get("model", "default")),
                key_env=spec.get("key_env"),
                headers={str(k): str(v) for k, v in (spec.get("headers") or {}).items()},
            )
        break  # first config found wins
    return targets


def resolve(spec: str, config: Path | None = None, *, api: str | None = None, model: str | None = None,
            headers: Mapping[str, str] | None = None) -> Target:
    """A name from the config or a URL -> Target, with HEADERS (-H, parse_headers) on top of its own.
    Unknown names list the known ones."""
    return _resolve(spec, config, api=api, model=model).with_headers(headers or {})


def _resolve(spec: str, config: Path | None, *, api: str | None, model: str | None) -> Target:
    if "://" in spec:
        return Target(name=spec, url=spec, api=api or "anthropic", model=model or "default")
    targets = load_targets(config)
    if spec not in targets:
        if _looks_like_address(spec):
            raise UsageError(f"target {spec!r} has no scheme: did you mean http://{spec} ? (https:// for TLS)")
        raise UsageError(f"unknown target {spec!r}; known targets: {', '.join(sorted(targets))} (or pass a URL)")
    t = targets[spec]
    if api or model:
        t = Target(t.name, t.url, api or t.api, model or t.model, t.key_env, dict(t.headers))
    return t


def _looks_like_address(spec: str) -> bool:
    """host:port, an IP literal or a dotted host name: a URL without its scheme, not a config name."""
    host, sep, port = spec.partition("/")[0].rpartition(":")
    if sep and port.isdigit() and host:
        return True
    return spec.count(".") >= 1 and " " not in spec and not spec.endswith(".toml")
