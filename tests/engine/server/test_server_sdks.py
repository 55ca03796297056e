"""The official anthropic and openai SDKs work unmodified against a live server (also over TLS)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

NULL_TEXT = "Hello from the zgtool null model. "
MSGS = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, start_server: Any) -> Iterator[tuple[Any, Path]]:
    tls_dir = tmp_path_factory.mktemp("tls")
    with start_server(tls="self-signed", tls_dir=tls_dir) as s:
        yield s, tls_dir / "cert.pem"


def _anthropic(url: str, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, **kw)


def _openai(url: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, **kw)


def test_anthropic_sdk_create_returns_the_message_with_usage_and_request_id(server: Any) -> None:
    raw = _anthropic(server.url).messages.with_raw_response.create(
        model="null", max_tokens=12, messages=MSGS, system="be brief")
    msg = raw.parse()
    assert msg.content[0].text == NULL_TEXT[:12]
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 12
    assert msg.usage.input_tokens > 0
    assert raw.headers["request-id"].startswith("req_")
    assert raw.headers["x-request-id"].startswith("inference-")
    assert raw.headers["server"].startswith("zgtool-engine/")


def test_anthropic_sdk_stream_text_stream_yields_the_text(server: Any) -> None:
    client = _anthropic(server.url)
    with client.messages.stream(model="default", max_tokens=20, messages=MSGS) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == (NULL_TEXT * 2)[:20]
    assert len(pieces) == 20
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 20


def test_anthropic_raw_stream_is_exactly_the_official_sequence(server: Any) -> None:
    # The timing rides in an SSE comment, which the SDK (like every SSE client) drops.
    client = _anthropic(server.url)
    events = list(client.messages.create(model="null", max_tokens=3, messages=MSGS, stream=True))
    assert [e.type for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]


def test_anthropic_sdk_count_tokens(server: Any) -> None:
    n = _anthropic(server.url).messages.count_tokens(model="null", messages=MSGS)
    assert n.input_tokens == len(server.engine.tokenizer.apply_chat_template(messages=MSGS))


def test_openai_sdk_create(server: Any) -> None:
    resp = _openai(server.url).chat.completions.create(model="null", max_tokens=10, messages=MSGS)
    assert resp.choices[0].message.content == NULL_TEXT[:10]
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 10


def test_openai_sdk_stream_with_and_without_usage(server: Any) -> None:
    client = _openai(server.url)
    chunks = list(client.chat.completions.create(model="null", max_tokens=8, messages=MSGS, stream=True))
    # naive clients index choices[0] on every chunk: that must never fail
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == NULL_TEXT[:8]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert not any("zgtool_timing" in (c.model_extra or {}) for c in chunks)
    chunks = list(client.chat.completions.create(model="null", max_tokens=8, messages=MSGS, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_openai_sdk_stream_helper_accumulates_the_message(server: Any) -> None:
    client = _openai(server.url)
    # (the helper raises on finish_reason "length", as against OpenAI: end on a stop sequence)
    with client.chat.completions.stream(model="null", max_tokens=60, messages=MSGS, stop=[" null"]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Hello from the zgtool"
    assert final.choices[0].finish_reason == "stop"


def test_openai_sdk_lists_served_models(server: Any) -> None:
    ids = [m.id for m in _openai(server.url).models.list()]
    assert ids == ["null", "default"]


def test_anthropic_sdk_lists_served_models(server: Any) -> None:
    ids = [m.id for m in _anthropic(server.url).models.list()]
    assert ids == ["null", "default"]


def test_both_sdks_work_over_self_signed_tls(tls_server: tuple[Any, Path]) -> None:
    srv, cert = tls_server
    assert srv.url.startswith("https://")
    trust = ssl.create_default_context(cafile=str(cert))      # trust exactly the server's cert
    a = _anthropic(srv.url, http_client=anthropic.DefaultHttpxClient(verify=trust))
    assert a.messages.create(model="null", max_tokens=5, messages=MSGS).content[0].text == NULL_TEXT[:5]
    with a.messages.stream(model="null", max_tokens=5, messages=MSGS) as s:
        assert "".join(s.text_stream) == NULL_TEXT[:5]
    o = _openai(srv.url, http_client=openai.DefaultHttpxClient(verify=trust))
    assert o.chat.completions.create(model="null", max_tokens=5, messages=MSGS).choices[0].message.content == NULL_TEXT[:5]
    streamed = "".join(c.choices[0].delta.content or "" for c in o.chat.completions.create(
        model="null", max_tokens=5, messages=MSGS, stream=True))
    assert streamed == NULL_TEXT[:5]


def test_tls_client_without_the_cert_is_refused(tls_server: tuple[Any, Path]) -> None:
    srv, _ = tls_server
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/health")


def test_a_real_model_streams_through_both_sdks(start_server: Any) -> None:
    with start_server(model="dummy:tiny") as srv:
        # this SDK version has no temperature argument: send it as an extra body field
        with _anthropic(srv.url).messages.stream(model="dummy:tiny", max_tokens=16, messages=MSGS,
                                                 extra_body={"temperature": 0}) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert final.usage.output_tokens >= 1 and final.content[0].text == text
        resp = _openai(srv.url).chat.completions.create(model="dummy:tiny", max_tokens=16, messages=MSGS,
                                                        temperature=0)
        assert resp.choices[0].message.content == text   # greedy: same text on both APIs
