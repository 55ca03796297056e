"""probe headers and probe stream against the gateways people run, started for real in front of the
engine (null model) and of a paced SSE origin: HAProxy, Caddy, Varnish, Squid, nginx, LiteLLM,
streaming and buffered configurations."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from probe_servers import FakeOrigin, OriginConfig, ThreadedUvicorn

from zgtool.probes.headers import probe_headers
from zgtool.probes.stream import probe_stream
from zgtool.targets import resolve

KINDS = ("haproxy", "caddy", "varnish", "squid", "nginx")


def _start_or_skip(fn):  # type: ignore[no-untyped-def]
    from zgtool.errors import MissingCapability

    try:
        return fn()
    except MissingCapability as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def engine_paths() -> Iterator[dict[str, str]]:
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    stack = _start_or_skip(lambda: LocalStack(StackConfig(model="null", paths=KINDS)).__enter__())
    try:
        yield dict(stack.urls)
    finally:
        stack.__exit__(None, None, None)


def analysis(url: str, api: str = "anthropic", **kw: object):  # type: ignore[no-untyped-def]
    return probe_headers(resolve(url, api=api), **kw).analysis  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_direct_engine_is_never_called_direct_only_no_evidence(engine_paths: dict[str, str]) -> None:
    a = analysis(engine_paths["direct"])
    assert [d.id for d in a.origin] == ["zgtool-engine"] and a.intermediaries == []
    assert a.verdict == "none" and "not proof" in a.verdict_summary
    assert a.error_probe is not None and a.error_probe.status == 400
    assert any("answered by the origin itself" in e for e in a.hop_evidence)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_each_real_gateway_is_identified(engine_paths: dict[str, str], kind: str, api: str) -> None:
    a = analysis(engine_paths[kind], api)
    assert a.verdict == "identified", a.hop_evidence
    assert {d.id for d in a.intermediaries if d.confidence >= 0.5} == {kind}
    assert {d.id for d in a.origin} == {"zgtool-engine"} and a.hop_estimate == 1


@pytest.mark.slow
def test_haproxy_is_silent_in_headers_and_found_by_who_answers_a_malformed_request(
        engine_paths: dict[str, str]) -> None:
    silent = analysis(engine_paths["haproxy"], probe_errors=False)
    assert silent.intermediaries == [] and silent.verdict == "none"  # HAProxy adds no header by default
    a = analysis(engine_paths["haproxy"])
    (hap,) = a.intermediaries
    assert hap.id == "haproxy" and "Your browser sent an invalid request" in hap.evidence[0].what
    assert any("not by zgtool engine" in e for e in a.hop_evidence)


@pytest.mark.slow
def test_squid_accelerator_is_identified_from_via_and_x_cache(engine_paths: dict[str, str]) -> None:
    a = analysis(engine_paths["squid"])
    squid = next(d for d in a.intermediaries if d.id == "squid")
    assert any("squid/" in e.what for e in squid.evidence)


class _StealthProxy(http.server.BaseHTTPRequestHandler):
    """A reverse proxy in no signature database: copies the upstream's headers, Server included,
    and rejects a malformed request itself with a terse answer of its own."""

    upstream_port = 0
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        if self.headers.defects:
            msg = b"bad request\n"
            self.send_response_only(400, "Bad Request")
            self.send_header("content-length", str(len(msg)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(msg)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=10)
        conn.request(self.command, self.path, body=body or None,
                     headers={k: v for k, v in self.headers.items() if k.lower() not in ("connection", "host")})
        resp = conn.getresponse()
        data = resp.read()
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)
        conn.close()

    do_GET = do_POST = _forward  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stealth_proxy(engine_paths: dict[str, str]) -> Iterator[str]:
    handler = type("H", (_StealthProxy,), {"upstream_port": int(engine_paths["direct"].rsplit(":", 1)[1])})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(timeout=5)


@pytest.mark.slow
def test_an_unknown_hop_with_silent_headers_is_likely_never_direct(stealth_proxy: str) -> None:
    a = analysis(stealth_proxy)
    assert {d.id for d in a.origin} == {"zgtool-engine"}  # the engine's own headers come through
    assert a.verdict == "likely" and a.verdict_summary == "an intermediary is likely, unidentified"
    assert [d.id for d in a.intermediaries] == ["unidentified"] and a.hop_estimate == 1
    assert any("malformed request was answered by an unidentified server" in e for e in a.hop_evidence)


@pytest.fixture(scope="module")
def litellm_paths(null_engine: str, litellm_before_null: Any) -> dict[str, str]:
    """The session's null engine and the one LiteLLM in front of it (tests/conftest.py)."""
    return {"direct": null_engine, "litellm": litellm_before_null.url}


@pytest.mark.slow
@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_litellm_is_identified_and_its_origin_is_not_the_anthropic_api(litellm_paths: dict[str, str],
                                                                        api: str) -> None:
    a = analysis(litellm_paths["litellm"], api)
    assert "litellm" in {d.id for d in a.intermediaries} and a.verdict == "identified"
    assert "anthropic-api" not in {d.id for d in a.origin}
    if api == "openai":  # LiteLLM passes the engine's headers on as llm_provider-*
        assert {d.id for d in a.origin} == {"zgtool-engine"} and a.origin_via_gateway
        # and LiteLLM's own uvicorn, not the engine, answers a malformed request
        assert any("answered by uvicorn" in e for e in a.hop_evidence)


@pytest.mark.slow
def test_probe_names_the_engine_a_gateway_publishes_and_the_command_that_measures_its_tax(
        litellm_paths: dict[str, str]) -> None:
    """LiteLLM lists its deployments' api_base on GET /model/info: the one-screen summary says which engine
    stands behind the model, and the direct engine (which publishes nothing) gets no such row."""
    import io

    from rich.console import Console

    from zgtool.probes.combined import probe_all
    from zgtool.probes.render_summary import render_summary

    direct, gw = litellm_paths["direct"], litellm_paths["litellm"]
    res = probe_all(resolve(gw, api="openai", model="null"), timeout_s=10.0)
    (engine,) = res.summary["published_engines"]
    assert engine["base"] == direct.rstrip("/") and engine["model"] == "null"
    assert engine["via"] == f"GET /model/info at {gw.rstrip('/')}"
    assert engine["tax_command"] == f"zgtool latency-split {direct.rstrip('/')}/v1 {gw.rstrip('/')}/v1"
    out = io.StringIO()
    render_summary(res, Console(file=out, width=400))
    (row,) = [line for line in out.getvalue().splitlines() if "behind it" in line]
    assert f"{direct.rstrip('/')} serves 'null'" in row and engine["tax_command"] in row
    assert "published_engines" not in probe_all(resolve(direct, api="openai", model="null"), timeout_s=10.0).summary


# ---- probe stream through the gateways, in front of a paced origin with emission times -----------


@pytest.fixture(scope="module")
def paced_origin() -> Iterator[ThreadedUvicorn]:
    with ThreadedUvicorn(FakeOrigin(OriginConfig(tokens=16, token_delay_ms=15.0))) as srv:
        yield srv


@pytest.fixture(scope="module")
def gateways(paced_origin: ThreadedUvicorn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from zgtool.gateway.kinds import start_gateway

    started, urls = [], {}
    try:
        for kind, buffering in (("haproxy", "streaming"), ("haproxy", "buffered"), ("caddy", "streaming"),
                                ("caddy", "buffered"), ("varnish", "streaming"), ("varnish", "buffered"),
                                ("squid", "streaming"), ("nginx", "buffered")):
            gw = _start_or_skip(lambda k=kind, b=buffering: start_gateway(
                k, paced_origin.url, tmp_path_factory.mktemp(f"{k}-{b}"), buffering=b))
            started.append(gw)
            urls[kind if buffering == "streaming" else f"{kind}-buffered"] = gw.url
        yield urls
    finally:
        for gw in started:
            gw.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("path", "verdict"), [
    ("haproxy", "streaming"), ("haproxy-buffered", "buffering"), ("caddy", "streaming"),
    ("caddy-buffered", "buffering"), ("varnish", "streaming"), ("varnish-buffered", "buffering"),
    ("squid", "streaming"), ("nginx-buffered", "buffering"),
])
def test_stream_verdict_through_each_gateway(gateways: dict[str, str], path: str, verdict: str) -> None:
    r = probe_stream(resolve(gateways[path]))
    assert r.num_content_events == 16 and r.emission is not None
    assert r.buffering.verdict == verdict, r.buffering.reason
    if verdict == "buffering":
        assert "held them back" in r.buffering.reason
