"""The engine's keys file behind a keyed pygw: the user's key policy plus one internal key.

`zgtool serve --gateway pygw|stack --keys F` must not leave the engine port open. The
supervisor starts the engine with a keys file derived from F: the same tiers, keys (as
SHA-256 digests) and admin keys, plus a random per-run key in an unlimited tier that only
pygw holds (handed over in an environment variable, never written in clear). pygw
enforces the tiers for everything it forwards (sent with the internal key, so the engine
does not count those requests a second time; the key is marked ``gateway = true``, so the engine
believes the client key pygw names in x-zgtool-tenant and shares its seats per client key exactly
as on its own port), and passes an admin's own key through on
/admin/*; a client that goes to the engine port directly meets the same tiers there.

The file holds the admin keys as given in F, so it is written 0600 and removed as soon
as the engine has read it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from zgtool.errors import UsageError
from zgtool.http.keys import TIER_FIELDS, digest, parse_keys
from zgtool.http.toml import load_toml

INTERNAL_TIER = "zgtool-gateway-internal"
INTERNAL_KEY_ENV = "ZG_STACK_UPSTREAM_KEY"


def _q(text: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML)."""
    return json.dumps(text)


def engine_keys_toml(keys_file: Path, internal_key: str) -> str:
    doc = load_toml(keys_file, "keys file")
    cfg = parse_keys(doc, str(keys_file))
    if INTERNAL_TIER in cfg.tiers:
        raise UsageError(f"keys file {keys_file}: tier name {INTERNAL_TIER!r} is reserved")
    out = ["# written by zgtool's stack supervisor from " + _q(str(keys_file)), ""]
    for tier in cfg.tiers.values():
        out.append(f"[tiers.{_q(tier.name)}]")
        out += [f"{f} = {getattr(tier, f)}" for f in TIER_FIELDS]
        out.append("")
    out += [f"[tiers.{_q(INTERNAL_TIER)}]", ""]  # every limit 0: unlimited (pygw enforces the tiers)
    for key in cfg.keys:    # client keys: never gateway keys here, whatever F says
        out += ["[[keys]]", f"name = {_q(key.name)}", f"tier = {_q(key.tier)}", f"sha256 = {_q(key.digest.hex())}", ""]
    # the one gateway key: the engine believes the client key pygw names in x-zgtool-tenant from it alone
    out += ["[[keys]]", f"name = {_q(INTERNAL_TIER)}", f"tier = {_q(INTERNAL_TIER)}",
            f"sha256 = {_q(digest(internal_key).hex())}", "gateway = true", ""]
    admin = [k for k in (doc.get("admin") or {}).get("keys", []) if isinstance(k, str) and k]
    if admin:
        out += ["[admin]", "keys = [" + ", ".join(_q(k) for k in admin) + "]", ""]
    if cfg.metrics_require_key:
        out += ["[metrics]", "require_key = true", ""]
    return "\n".join(out)


def write_engine_keys(keys_file: Path, run_dir: Path) -> tuple[Path, str]:
    """(path of the engine's keys file, the internal key pygw sends upstream)."""
    internal = "sk-zg-internal-" + secrets.token_urlsafe(32)
    path = run_dir / "engine-keys.toml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(engine_keys_toml(keys_file, internal))
    return path, internal
