"""pygw configuration files: virtual API keys (TOML) and the input moderation policy (TOML).

Keys file (see examples/pygw-keys.toml):
    [defaults]            rpm / burst applied to keys that set none
    [upstream]            api_key_env = the env var holding the key pygw sends upstream
    [keys.<virtual-key>]  name, rpm, burst
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
    """One virtual key: who it is and its token bucket (requests per minute, burst)."""

    name: str
    rpm: float
    burst: int

    def __post_init__(self) -> None:
        if self.rpm <= 0 or self.burst < 1:
            raise UsageError(f"key {self.name!r}: rpm must be > 0 and burst >= 1")


@dataclass(frozen=True)
class KeyRing:
    keys: dict[str, KeyPolicy] = field(default_factory=dict)  # SHA-256 hex digest of the secret -> policy
    default: KeyPolicy = KeyPolicy("anonymous", rpm=600_000, burst=10_000)
    open: bool = True
    upstream_key: str | None = None

    def lookup(self, presented: str | None) -> tuple[str, KeyPolicy] | None:
        """(bucket id, policy) for a presented key; None when the key is not accepted."""
        if self.open:
            ident = presented or "anonymous"
            return ident, self.default
        if presented is None:
            return None
        pol = self.keys.get(hashlib.sha256(presented.encode()).hexdigest())
        return None if pol is None else (pol.name, pol)


def _read_toml(path: Path, what: str) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"{what} file not found: {path}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} file {path} is not valid TOML: {exc}") from exc


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def load_keys(path: Path | None, *, rpm: float = 600_000, burst: int = 10_000) -> KeyRing:
    """pygw's keys file, or the engine's (`zgtool serve --keys`: [tiers.*] + [[keys]]) so one
    file can serve both; keys are held as SHA-256 digests (a file may list only digests)."""
    upstream_key = os.environ.get("ZG_UPSTREAM_API_KEY")
    default = KeyPolicy("anonymous", rpm=rpm, burst=burst)
    if path is None:
        return KeyRing(default=default, open=True, upstream_key=upstream_key)
    doc = _read_toml(path, "keys")
    d = doc.get("defaults") or {}
    d_rpm, d_burst = float(d.get("rpm", rpm)), int(d.get("burst", burst))
    env = (doc.get("upstream") or {}).get("api_key_env")
    if env:
        upstream_key = os.environ.get(str(env)) or upstream_key
    raw = doc.get("keys") or {}
    entries: list[tuple[str, dict]] = []
    if isinstance(raw, dict):  # pygw format: [keys.<secret>]
        entries = [(_digest(secret), spec) for secret, spec in raw.items()]
    elif isinstance(raw, list):  # engine format: [[keys]] key|sha256, name, tier
        tiers = doc.get("tiers") or {}
        for spec in raw:
            if not isinstance(spec, dict) or not (spec.get("key") or spec.get("sha256")):
                raise UsageError(f"{path}: each [[keys]] needs a key or sha256")
            digest = str(spec.get("sha256") or _digest(str(spec["key"])))
            per_min = float((tiers.get(spec.get("tier")) or {}).get("requests_per_min") or 0)
            # a 60 s window of N requests ~ a bucket of N refilled at N/min; 0 means unlimited
            limits = {"rpm": per_min, "burst": max(1, int(per_min))} if per_min > 0 else {}
            entries.append((digest.lower(), {"name": spec.get("name", digest[:8]), **limits}))
    keys: dict[str, KeyPolicy] = {}
    for digest, spec in entries:
        if not isinstance(spec, dict):
            raise UsageError(f"{path}: each key entry must be a table")
        try:
            keys[digest] = KeyPolicy(
                str(spec.get("name", digest[:8])), float(spec.get("rpm", d_rpm)), int(spec.get("burst", d_burst))
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path}: key {spec.get('name', digest[:8])!r}: {exc}") from exc
    if not keys:
        raise UsageError(f"{path}: no keys ([keys.<key>] tables or [[keys]] entries); remove --keys to run pygw open")
    return KeyRing(keys=keys, default=KeyPolicy("default", d_rpm, d_burst), open=False, upstream_key=upstream_key)


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
    return parse_policy(_read_toml(path, "policy"), str(path))
