"""Real nginx (run folder config, foreground) in front of the fake upstream: buffered vs
streaming SSE delivery, TLS + basic auth termination, clear errors when nginx is absent."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from gw_fake_upstream import FakeUpstream

from zgtool.errors import MissingCapability, UsageError
from zgtool.gateway import nginx as nginx_mod
from zgtool.gateway.supervisor import LocalStack, StackConfig

N_TOKENS = 8


@pytest.fixture(scope="module")
def fronts(upstream: FakeUpstream) -> Iterator[LocalStack]:
    with LocalStack(StackConfig(upstream=upstream.url, paths=("nginx", "nginx-buffered"))) as st:
        yield st


def delta_arrivals(url: str, headers: dict[str, str] | None = None, **client_kw) -> list[float]:
    """perf_counter time at which each content_block_delta reached the client."""
    body = {"model": "null", "max_tokens": N_TOKENS, "stream": True, "messages": [{"role": "user", "content": "s"}]}
    times: list[float] = []
    with httpx.Client(**client_kw) as c, c.stream("POST", url + "/v1/messages", json=body, headers=headers) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():  # decoded: a gzip-ing front still yields SSE text
            now = time.perf_counter()
            times += [now] * chunk.count(b"event: content_block_delta")
    assert len(times) == N_TOKENS
    return times


def spread(times: list[float]) -> float:
    return times[-1] - times[0]


def test_streaming_nginx_delivers_token_by_token_and_buffered_nginx_in_a_burst(fronts: LocalStack) -> None:
    direct = spread(delta_arrivals(fronts.urls["direct"]))
    streaming = spread(delta_arrivals(fronts.urls["nginx"]))
    buffered = spread(delta_arrivals(fronts.urls["nginx-buffered"]))
    # relative to the upstream's own pacing: streaming keeps it, buffering collapses it
    assert streaming > 0.6 * direct
    assert buffered < 0.2 * direct


def test_nginx_replaces_server_header_and_keeps_upstream_headers(fronts: LocalStack) -> None:
    r = httpx.post(fronts.urls["nginx"] + "/v1/messages",
                   json={"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "h"}]})
    assert r.status_code == 200
    assert r.headers["server"].startswith("nginx")
    assert r.headers["request-id"].startswith("req_") and "server-timing" in r.headers


def test_nginx_config_and_logs_live_in_the_run_folder(fronts: LocalStack) -> None:
    conf = (fronts.run_dir / "nginx.conf").read_text()
    assert "/etc/" not in conf
    assert "proxy_buffering off;" in conf and "proxy_buffering on;" in conf and "gzip on;" in conf
    assert "keepalive 64;" in conf and "proxy_http_version 1.1;" in conf
    assert (fronts.run_dir / "nginx.pid").exists()
    assert (fronts.run_dir / "nginx-access.log").exists()


def test_thin_pipe_terminates_tls_and_basic_auth_at_nginx(upstream: FakeUpstream) -> None:
    cfg = StackConfig(upstream=upstream.url, paths=("nginx",), tls=True, basic_auth=("zg", "s3cret"))
    with LocalStack(cfg) as st:
        url = st.urls["nginx"]
        assert url.startswith("https://")
        denied = httpx.get(url + "/v1/models", verify=False)
        assert denied.status_code == 401
        basic = "Basic " + base64.b64encode(b"zg:s3cret").decode()
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0,
                                     default_headers={"authorization": basic},
                                     http_client=anthropic.DefaultHttpxClient(verify=False))
        with client.messages.stream(model="null", max_tokens=3,
                                    messages=[{"role": "user", "content": "tls"}]) as s:
            assert "".join(s.text_stream) == "tok0 tok1 tok2 "
        # the credential stops at nginx: the upstream never sees it
        assert "authorization" not in upstream.headers[-1]
        times = delta_arrivals(url, auth=("zg", "s3cret"), verify=False)
        assert len(times) == N_TOKENS


def test_missing_nginx_is_a_missing_capability_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(nginx_mod, "NGINX_CANDIDATES", ("/nonexistent/nginx",))
    with pytest.raises(MissingCapability, match="apt-get install"):
        nginx_mod.find_nginx()


def test_nginx_that_cannot_listen_fails_start_naming_nginx_and_its_log(upstream: FakeUpstream,
                                                                       tmp_path: Path) -> None:
    # an address this host lacks (TEST-NET-1): nginx's own bind fails (a busy port is refused before it starts:
    # tests/gateway/test_taken_port.py)
    cfg = StackConfig(upstream=upstream.url, paths=("nginx",), host="192.0.2.1", gateway_port=8080,
                      start_timeout_s=10, run_dir=tmp_path)
    with pytest.raises(UsageError) as err:
        with LocalStack(cfg):
            pass
    assert "nginx" in err.value.message and "nginx.log" in err.value.message
    # no port named: zgtool's own choice of a free port there fails in one line, not a traceback
    with pytest.raises(UsageError, match="cannot listen on 192.0.2.1: Cannot assign requested address"):
        with LocalStack(StackConfig(upstream=upstream.url, paths=("nginx",), host="192.0.2.1", run_dir=tmp_path)):
            pass


def test_stack_config_rejects_unknown_paths_and_modes() -> None:
    with pytest.raises(UsageError, match="unknown gateway path"):
        StackConfig(paths=("envoy",))
    with pytest.raises(UsageError, match="nginx-mode"):
        StackConfig(nginx_mode="turbo")
    with pytest.raises(UsageError, match="nginx"):
        StackConfig(paths=("pygw",), tls=True)


def test_stack_path_goes_through_nginx_then_pygw(upstream: FakeUpstream) -> None:
    with LocalStack(StackConfig(upstream=upstream.url, paths=("stack",))) as st:
        r = httpx.post(st.urls["stack"] + "/v1/messages",
                       json={"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "st"}]})
        assert r.status_code == 200
        assert r.headers["server"].startswith("nginx") and r.headers["via"] == "1.1 pygw"
        assert json.loads(r.content)["content"][0]["text"] == "tok0 tok1 "
        pids = st.pids
        run_dir = st.run_dir
    assert len(pids) == 2
    assert not run_dir.exists()  # a temp run folder is removed after a clean stop
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
