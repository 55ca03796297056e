"""Named targets from zgtool.toml: --config, then ./zgtool.toml, then the user config dir.

    [targets.mycluster]
    url = "https://vllm.internal:8000"
    api = "openai"              # anthropic | openai
    model = "meta-llama/Llama-3.1-8B-Instruct"
    key_env = "VLLM_API_KEY"    # the environment variable holding the key (never stored)
    headers = { "X-Team" = "infra" }

A TARGET argument is a name or a URL. Keys are read from the environment at use
time and never printed or written to results (`Target.public()` omits them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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
        """Headers for one API request: the key (if any) plus configured extras."""
        h = dict(self.headers)
        key = self.api_key()
        if key:
            if self.api == "anthropic":
                h["x-api-key"] = key
            else:
                h["authorization"] = f"Bearer {key}"
        if self.api == "anthropic":
            h.setdefault("anthropic-version", "2023-06-01")
        return h

    def public(self) -> dict[str, Any]:
        """What may be printed or written to a result: no key, only its env var name."""
        return {"name": self.name, "url": self.url, "api": self.api, "model": self.model,
                "key_env": self.key_env, "header_names": sorted(self.headers)}




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


def resolve(spec: str, config: Path | None = None, *, api: str | None = None, model: str | None = None) -> Target:
    """A name from the config or a URL -> Target. Unknown names list the known ones."""
    if "://" in spec:
        t = Target(name=spec, url=spec, api=api or "anthropic", model=model or "default")
        return t
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
