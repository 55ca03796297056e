"""probe headers against real local servers: an origin, nginx in front of it, bad ports."""

from __future__ import annotations

import pytest
from probe_servers import Nginx, NotHTTPServer, ThreadedUvicorn, TLSServer, free_port

from zgtool.errors import TargetUnreachable
from zgtool.probes.headers import probe_headers
from zgtool.targets import resolve


def test_direct_origin_is_the_engine_with_no_intermediary(origin: ThreadedUvicorn) -> None:
    r = probe_headers(resolve(origin.url))
    assert r.status == 200 and r.method == "POST" and r.path == "/v1/messages"
    # the fixture origin sends the engine's ids on uvicorn's Server header
    assert {d.id for d in r.analysis.origin} == {"zgtool-engine", "uvicorn"}
    assert r.analysis.intermediaries == [] and r.analysis.hop_estimate == 0
    assert ("server", "uvicorn") in r.headers  # every header kept, wire case
    assert r.analysis.load_hint == {"kv_util": 0.1, "running": 1, "waiting": 0}


def test_nginx_in_front_is_detected_from_its_server_header(nginx: Nginx) -> None:
    r = probe_headers(resolve(f"http://127.0.0.1:{nginx.streaming}"))
    assert [d.id for d in r.analysis.intermediaries] == ["nginx"]
    assert r.analysis.intermediaries[0].evidence[0].what.startswith("server: nginx")
    assert "zgtool-engine" in {d.id for d in r.analysis.origin}  # seen through the hop by its request ids
    assert r.analysis.hop_estimate == 1


def test_openai_targets_get_the_chat_completions_request(origin: ThreadedUvicorn) -> None:
    r = probe_headers(resolve(origin.url + "/v1", api="openai"))
    assert r.path == "/v1/chat/completions" and r.status == 200


def test_method_and_path_override_the_api_request(origin: ThreadedUvicorn) -> None:
    r = probe_headers(resolve(origin.url), method="GET", path="/health")
    assert (r.method, r.path, r.status) == ("GET", "/health", 200)


def test_keys_are_never_written_to_the_result(origin: ThreadedUvicorn, monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.targets import Target

    monkeypatch.setenv("ZG_PROBE_TEST_KEY", "sk-secret-123")
    r = probe_headers(Target("t", origin.url, key_env="ZG_PROBE_TEST_KEY"))
    assert ("x-api-key", "<redacted>") in r.request_headers
    assert "sk-secret-123" not in repr(r)


def test_a_refused_port_is_unreachable_in_one_line() -> None:
    with pytest.raises(TargetUnreachable, match=r"connection refused by 127\.0\.0\.1:\d+$"):
        probe_headers(resolve(f"http://127.0.0.1:{free_port()}"))


def test_a_port_that_does_not_speak_http_is_unreachable(not_http: NotHTTPServer) -> None:
    with pytest.raises(TargetUnreachable, match="does not speak HTTP"):
        probe_headers(resolve(f"http://127.0.0.1:{not_http.port}"), timeout_s=3)


def test_an_unverifiable_certificate_needs_insecure(tls_server: TLSServer) -> None:
    with pytest.raises(TargetUnreachable, match="--insecure"):
        probe_headers(resolve(tls_server.url), method="GET", path="/")
    r = probe_headers(resolve(tls_server.url), method="GET", path="/", insecure=True)
    assert r.status == 200 and r.body_excerpt == "hello over tls\n"
