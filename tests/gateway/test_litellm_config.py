"""The LiteLLM config zgtool writes in front of a server whose model was not given (`zgtool gateway --kind litellm
--upstream URL`): a route for each model the server lists at GET /v1/models, as a user's own config names the
models their engine serves, then the wildcard; only the wildcard when the server does not say. Before, it named
"null" (the model of the engine zgtool starts itself), which no other engine serves, and LiteLLM listed it first.
The upstream is a real local HTTP server answering in vLLM's listing shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from zgtool.gateway.catalog import LaunchRequest
from zgtool.gateway.litellm import render_config, upstream_models


class _Listing(BaseHTTPRequestHandler):
    seen_auth: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Listing.seen_auth.append(self.headers.get("authorization", ""))
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"object": "list", "data": [
            {"id": "smollm2", "object": "model", "owned_by": "vllm"},
            {"id": "smollm2-lora", "object": "model", "owned_by": "vllm"},
            {"id": "smollm2", "object": "model", "owned_by": "vllm"},
            {"id": "*", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _routes(config: str) -> list[str]:
    return [line.split(":", 1)[1].strip().strip('"') for line in config.splitlines() if "- model_name:" in line]


def _req(upstream: str, model: str | None, tmp_path: Path) -> LaunchRequest:
    return LaunchRequest(path="litellm", host="127.0.0.1", port=4000, upstream=upstream, run_dir=tmp_path, model=model)


def test_the_upstreams_own_models_are_named_each_once_before_the_wildcard(upstream: str, tmp_path: Path) -> None:
    served = upstream_models(upstream, None)
    assert served == ("smollm2", "smollm2-lora")
    assert _routes(render_config(_req(upstream, None, tmp_path), auth_module="m", served=served)) == [
        "smollm2", "smollm2-lora", "*"]


def test_a_model_given_is_the_one_route_named(upstream: str, tmp_path: Path) -> None:
    assert _routes(render_config(_req(upstream, "null", tmp_path), auth_module="m", served=("smollm2",))) == [
        "null", "*"]


def test_an_upstream_that_does_not_answer_leaves_the_wildcard_alone(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert upstream_models(dead, None, timeout_s=1.0) == ()
    assert _routes(render_config(_req(dead, None, tmp_path), auth_module="m")) == ["*"]


def test_the_listing_is_asked_with_the_key_litellm_sends_upstream(upstream: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZG_UPSTREAM_API_KEY", "sk-upstream")
    _Listing.seen_auth.clear()
    assert upstream_models(upstream, None) == ("smollm2", "smollm2-lora")
    assert _Listing.seen_auth == ["Bearer sk-upstream"]
