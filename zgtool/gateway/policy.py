"""pygw configuration files: virtual API keys and the input moderation policy (TOML).

Keys: the one keys.toml format of zgtool.http.keys (the engine's: [tiers.*], [[keys]],
[admin], [upstream]; the legacy pygw [defaults] + [keys.<secret>] form too). pygw
enforces each key's tier: requests_per_min as a token bucket of `burst` (default: the
per-minute figure), max_concurrent, tokens_per_min (see zgtool.gateway.state.TierUsage).
Admin keys may call /admin/* (passed through with the admin's own key).
Without a keys file pygw is open: any (or no) key is accepted and limited per key
with the command-line defaults, so the limiter still runs and costs what it costs.

Policy file (see examples/moderation-policy.toml): [[deny]] name, pattern, message.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from zgtool.errors import UsageError
from zgtool.http.keys import KeysConfig, parse_keys
from zgtool.http.toml import load_toml

# Also what `--policy default` loads; examples/moderation-policy.toml mirrors it.
DEFAULT_POLICY_TOML = r"""
[[deny]]
name = "prompt-injection"
pattern = '(?i)\bignore\s+(all\s+)?(previous|prior|above)\s+instructions\b'
message = "the input looks like a prompt-injection attempt"

[[deny]]
name = "private-key"
pattern = '-----BEGIN [A-Z ]*PRIVATE KEY-----'
message = "the input contains a private key"

[[deny]]
name = "card-number"
pattern = '\b4\d{3}(?:[ -]?\d{4}){3}\b'
message = "the input contains what looks like a payment card number"
"""


@dataclass(frozen=True)
class KeyPolicy:
    """One key's limits: token bucket (requests per minute, burst), concurrency and tokens
    per minute (0 = unlimited)."""

    name: str
    rpm: float
    burst: int
    max_concurrent: int = 0
    tokens_per_min: int = 0

    def __post_init__(self) -> None:
        if self.rpm <= 0 or self.burst < 1:
            raise UsageError(f"key {self.name!r}: rpm must be > 0 and burst >= 1")


@dataclass(frozen=True)
class KeyRing:
    keys: dict[str, KeyPolicy] = field(default_factory=dict)  # SHA-256 hex digest of the secret -> policy
    default: KeyPolicy = KeyPolicy("anonymous", rpm=600_000, burst=10_000)
    open: bool = True
    upstream_key: str | None = None
    admin: frozenset[str] = frozenset()                        # SHA-256 hex digests of admin keys

    def lookup(self, presented: str | bytes | None) -> tuple[str, KeyPolicy] | None:
        """(bucket id, policy) for a presented key; None when the key is not accepted."""
        if self.open:
            if presented is None:
                return "anonymous", self.default
            return (presented.decode("latin-1") if isinstance(presented, bytes) else presented), self.default
        if presented is None:
            return None
        d = _digest(presented)
        pol = self.keys.get(d)
        if pol is None:  # an admin key alone may generate too (like the engine), with the defaults
            return ("admin", self.default) if d in self.admin else None
        return pol.name, pol

    def is_admin(self, presented: str | bytes | None) -> bool:
        return presented is not None and _digest(presented) in self.admin


def _digest(secret: str | bytes) -> str:
    return hashlib.sha256(secret.encode("latin-1") if isinstance(secret, str) else secret).hexdigest()


def keyring_from(cfg: KeysConfig, *, rpm: float = 600_000, burst: int = 10_000,
                 upstream_key: str | None = None) -> KeyRing:
    """A KeysConfig (zgtool.http.keys) as pygw's key ring; a tier without requests_per_min
    gets the command-line rpm/burst."""
    keys: dict[str, KeyPolicy] = {}
    for k in cfg.keys:
        t = cfg.tiers[k.tier]
        per_min = t.requests_per_min
        keys[k.digest.hex()] = KeyPolicy(
            k.name, rpm=float(per_min) if per_min else rpm,
            burst=(t.burst or per_min) if per_min else (t.burst or burst),
            max_concurrent=t.max_concurrent, tokens_per_min=t.tokens_per_min)
    return KeyRing(keys=keys, default=KeyPolicy("default", rpm, burst), open=False, upstream_key=upstream_key,
                   admin=frozenset(d.hex() for d in cfg.admin_digests))


def load_keys(path: Path | None, *, rpm: float = 600_000, burst: int = 10_000,
              upstream_key_env: str | None = None) -> KeyRing:
    """pygw's key ring from a keys file (None: open). The key sent upstream comes from the
    env var `upstream_key_env` (pygw --upstream-key-env), else the file's [upstream]
    api_key_env, else ZG_UPSTREAM_API_KEY."""
    if path is None:
        return KeyRing(default=KeyPolicy("anonymous", rpm=rpm, burst=burst), open=True,
                       upstream_key=_upstream_key(upstream_key_env, None))
    cfg = parse_keys(load_toml(path, "keys file"), str(path))
    return keyring_from(cfg, rpm=rpm, burst=burst, upstream_key=_upstream_key(upstream_key_env, cfg.upstream_key_env))


def _upstream_key(*envs: str | None) -> str | None:
    for env in (*envs, "ZG_UPSTREAM_API_KEY"):
        if env and os.environ.get(env):
            return os.environ[env]
    return None


@dataclass(frozen=True)
class DenyRule:
    name: str
    pattern: re.Pattern[str]
    message: str


@dataclass(frozen=True)
class Policy:
    rules: tuple[DenyRule, ...] = ()

    def check(self, text: str) -> DenyRule | None:
        """The first rule the input text violates, or None."""
        for rule in self.rules:
            if rule.pattern.search(text):
                return rule
        return None


def parse_policy(doc: dict, where: str) -> Policy:
    rules = []
    for i, spec in enumerate(doc.get("deny") or []):
        name = str(spec.get("name", f"rule-{i}"))
        if "pattern" not in spec:
            raise UsageError(f"{where}: [[deny]] {name!r} needs a pattern")
        try:
            pat = re.compile(str(spec["pattern"]))
        except re.error as exc:
            raise UsageError(f"{where}: [[deny]] {name!r}: bad regex: {exc}") from exc
        rules.append(DenyRule(name, pat, str(spec.get("message", f"the input matches rule {name!r}"))))
    return Policy(tuple(rules))


def load_policy(spec: str | None) -> Policy:
    """`default` (built in), `none`, or a path to a policy TOML file."""
    if spec in (None, "none", ""):
        return Policy()
    if spec == "default":
        return parse_policy(tomllib.loads(DEFAULT_POLICY_TOML), "built-in policy")
    path = Path(spec)
    return parse_policy(load_toml(path, "policy file"), str(path))
