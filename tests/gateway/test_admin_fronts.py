"""/admin/* of an open engine is never reachable through any public front `zgtool gateway --kind`
starts: each kind's config refuses it (403; LiteLLM has no such route: 404), escaped and
dot-segment forms included; pygw and the stack serve it only to a configured admin key."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from litellm_live import front

from zgtool.gateway.kinds import GATEWAY_KINDS
from zgtool.gateway.supervisor import LocalStack, StackConfig

# raw request targets whose decoded, normalised path is /admin/kv (sent byte for byte)
VARIANTS = ("/admin/kv", "/%61dmin/kv", "/admin%2fkv", "//admin/kv", "/./admin/kv", "/v1/../admin/kv",
            "/admin/kv?x=1")
ADMIN = "sk-test-admin-fronts"
PRO = "sk-test-pro-fronts"
KEYS = f"""
[tiers.pro]
requests_per_min = 100000
[[keys]]
name = "pro"
tier = "pro"
key = "{PRO}"
[admin]
keys = ["{ADMIN}"]
"""


def _raw_status(url: str, method: str, target: str, headers: dict[str, str] | None = None) -> int:
    """The status of one request sent with exactly this request target (no client normalising)."""
    parts = urlsplit(url)
    body = b'{"dry_run": true}' if method == "POST" else b""
    head = f"{method} {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(head.encode() + body)
        line = s.makefile("rb").readline()
    return int(line.split()[1])


@pytest.fixture(scope="module")
def engine(null_engine: str) -> str:
    return null_engine      # the session's open null engine (tests/conftest.py): LiteLLM before it starts once


def test_the_open_engine_itself_serves_admin_so_the_fronts_must_refuse_it(engine: str) -> None:
    assert _raw_status(engine, "GET", "/admin/kv") == 200
    assert _raw_status(engine, "POST", "/admin/defrag") == 200
    assert _raw_status(engine, "GET", "/%61dmin/kv") == 200  # the engine routes on the decoded path


@pytest.mark.timeout(900)  # litellm's first start on a machine may create its venv
@pytest.mark.parametrize("kind", GATEWAY_KINDS)
def test_no_front_serves_admin_of_an_open_engine(engine: str, kind: str, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    with front(kind, engine, tmp_path / kind, request) as gw_url:
        refused = {403, 404} if kind == "litellm" else {403}
        assert _raw_status(gw_url, "POST", "/admin/defrag", {"x-api-key": "anything"}) in refused
        for target in VARIANTS:
            status = _raw_status(gw_url, "GET", target, {"x-api-key": "anything"})
            assert status != 200 and status >= 400, (kind, target, status)
        assert httpx.get(gw_url + "/health").status_code == 200  # the front still serves the rest


@pytest.mark.parametrize("kind", ["pygw", "stack"])
def test_pygw_and_the_stack_serve_admin_only_to_a_configured_admin_key(kind: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    cfg = StackConfig(model="null", paths=(kind,), pygw_keys=keys, pygw_policy="none", run_dir=tmp_path / "run")
    with LocalStack(cfg) as st:
        url = st.urls[kind]
        assert _raw_status(url, "GET", "/admin/kv") == 401
        assert _raw_status(url, "GET", "/admin/kv", {"x-api-key": PRO}) == 403
        assert _raw_status(url, "GET", "/admin/kv", {"x-api-key": ADMIN}) == 200
        assert _raw_status(url, "POST", "/admin/defrag", {"x-api-key": ADMIN}) == 200
