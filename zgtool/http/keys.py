"""API keys: extraction from request headers and the one keys.toml format.

Format (examples/keys.toml)::

    [tiers.<name>]      max_concurrent, requests_per_min, tokens_per_min, burst (0 = unlimited / derived)
    [[keys]]            name, tier, key = "..." | sha256 = "<64 hex>", gateway = true|false
    [admin]             keys = ["..."]        (admin keys may call /admin/*)
    [metrics]           require_key = true    (GET /metrics needs any configured key, bearer)
    [upstream]          api_key_env = "VAR"   (a gateway's key towards its upstream)

The legacy pygw format is accepted too: ``[defaults]`` rpm/burst and ``[keys.<secret>]``
name/rpm/burst; each such key gets its own tier (requests_per_min = rpm, burst).
Every mistake is a one-line ``ConfigError`` (zgtool/http/errors.py; the CLI maps it to exit 2). Keys are held as SHA-256 digests and
matched in constant time (``KeysConfig.match``); they are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.http.errors import ConfigError
from zgtool.http.toml import load_toml

TIER_FIELDS = ("max_concurrent", "requests_per_min", "tokens_per_min", "burst")


def api_key(headers: Mapping[bytes, bytes] | list[tuple[bytes, bytes]]) -> bytes | None:
    """The presented key: ``x-api-key``, else ``Authorization: Bearer``; None when absent.
    ``headers`` are ASGI's lower-cased (name, value) pairs or a dict of them."""
    if isinstance(headers, Mapping):
        raw = headers.get(b"x-api-key")
        if raw is not None:
            return raw.strip() or None
        auth = headers.get(b"authorization", b"")
    else:
        auth = b""
        for k, v in headers:
            if k == b"x-api-key":
                return v.strip() or None
            if k == b"authorization":
                auth = v
    if auth[:7].lower() == b"bearer ":
        return auth[7:].strip() or None
    return None


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


@dataclass(frozen=True)
class Tier:
    name: str
    max_concurrent: int = 0          # 0 = unlimited
    requests_per_min: int = 0
    tokens_per_min: int = 0          # prompt tokens at admission + output tokens at completion
    burst: int = 0                   # token-bucket size for bucket limiters; 0 = requests_per_min

    def __post_init__(self) -> None:
        for f in TIER_FIELDS:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"keys file: tier {self.name!r}: {f} must be an integer >= 0, got {v!r}")


@dataclass(frozen=True)
class ApiKey:
    name: str
    tier: str
    digest: bytes = field(repr=False)
    # a gateway's own key towards the engine: the engine believes the client key it names in
    # x-zgtool-tenant (seats are shared per client key behind it); never give one to a client
    gateway: bool = False


@dataclass(frozen=True)
class KeysConfig:
    tiers: dict[str, Tier]
    keys: tuple[ApiKey, ...]
    admin_digests: tuple[bytes, ...] = ()
    metrics_require_key: bool = False
    upstream_key_env: str | None = None

    def match(self, presented: bytes) -> tuple[ApiKey | None, bool]:
        """(the key, is_admin) for a presented secret; compares against every key (constant time)."""
        d = hashlib.sha256(presented).digest()
        found: ApiKey | None = None
        for k in self.keys:                      # no early exit
            if hmac.compare_digest(d, k.digest):
                found = k
        is_admin = False
        for a in self.admin_digests:
            if hmac.compare_digest(d, a):
                is_admin = True
        return found, is_admin


def _key_digest(entry: dict[str, Any], where: str) -> bytes:
    if isinstance(entry.get("key"), str) and entry["key"]:
        return digest(entry["key"])
    if isinstance(entry.get("sha256"), str):
        try:
            raw = bytes.fromhex(entry["sha256"])
        except ValueError:
            raw = b""
        if len(raw) == 32:
            return raw
    raise ConfigError(f"keys file: {where} needs key = \"...\" or sha256 = \"<64 hex digits>\"")


def _int(v: Any, where: str) -> int:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"keys file: {where} must be an integer, got {v!r}")
    return v


def _legacy_keys(raw: dict[str, Any], doc: dict[str, Any], tiers: dict[str, Tier]) -> list[ApiKey]:
    d = doc.get("defaults") or {}
    d_rpm, d_burst = _int(d.get("rpm", 0), "[defaults] rpm"), _int(d.get("burst", 0), "[defaults] burst")
    keys = []
    for secret, spec in raw.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"keys file: [keys.{secret[:6]}...] must be a table")
        name = str(spec.get("name") or digest(secret).hex()[:8])
        tier = f"key:{name}"
        tiers[tier] = Tier(tier, requests_per_min=_int(spec.get("rpm", d_rpm), f"key {name!r} rpm"),
                           burst=_int(spec.get("burst", d_burst), f"key {name!r} burst"))
        keys.append(ApiKey(name, tier, digest(secret)))
    return keys


def parse_keys(doc: dict[str, Any], where: str) -> KeysConfig:
    tiers: dict[str, Tier] = {}
    raw_tiers = doc.get("tiers") or {}
    if not isinstance(raw_tiers, dict):
        raise ConfigError(f"keys file {where}: [tiers] must be a table of tables")
    for name, spec in raw_tiers.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"keys file {where}: [tiers.{name}] must be a table")
        unknown = set(spec) - set(TIER_FIELDS)
        if unknown:
            raise ConfigError(f"keys file {where}: [tiers.{name}] has unknown fields {sorted(unknown)}")
        tiers[name] = Tier(name=name, **spec)
    raw = doc.get("keys") or []
    keys: list[ApiKey] = []
    if isinstance(raw, dict):
        keys = _legacy_keys(raw, doc, tiers)
    elif isinstance(raw, list):
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict):
                raise ConfigError(f"keys file {where}: each [[keys]] entry must be a table")
            name = str(entry.get("name") or f"key{i}")
            tier = entry.get("tier", "default")
            if tier not in tiers:
                if tier != "default":
                    raise ConfigError(f"keys file {where}: key {name!r} uses tier {tier!r}, "
                                     "which is not defined in [tiers]")
                tiers["default"] = Tier("default")
            gateway = entry.get("gateway", False)
            if not isinstance(gateway, bool):
                raise ConfigError(f"keys file {where}: key {name!r}: gateway must be true or false")
            keys.append(ApiKey(name=name, tier=tier, digest=_key_digest(entry, f"key {name!r}"), gateway=gateway))
    else:
        raise ConfigError(f"keys file {where}: keys must be [[keys]] entries")
    admin = doc.get("admin") or {}
    admin_digests = tuple(digest(k) for k in admin.get("keys", []) if isinstance(k, str) and k)
    if not keys and not admin_digests:
        raise ConfigError(f"keys file {where} defines no [[keys]] and no [admin] keys")
    metrics = doc.get("metrics") or {}
    require = metrics.get("require_key", False)
    if not isinstance(require, bool):
        raise ConfigError(f"keys file {where}: [metrics] require_key must be true or false")
    env = (doc.get("upstream") or {}).get("api_key_env")
    return KeysConfig(tiers=tiers, keys=tuple(keys), admin_digests=admin_digests,
                      metrics_require_key=require, upstream_key_env=str(env) if env else None)


def load_keys(path: Path) -> KeysConfig:
    """Parse a keys file (see the module docstring)."""
    return parse_keys(load_toml(path, "keys file"), str(path))
